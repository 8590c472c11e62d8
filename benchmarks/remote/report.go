package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// writeTable writes results as an aligned table: path, metric, value, unit.
func writeTable(w io.Writer, rs []result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tmetric\tvalue\tunit\tn\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t\n", r.Path, r.Metric, formatValue(r.Value), r.Unit, r.N)
	}
	return tw.Flush()
}

func formatValue(v float64) string {
	switch {
	case v >= 1e4:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeJSON writes one JSON object per result per line.
func writeJSON(w io.Writer, rs []result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
