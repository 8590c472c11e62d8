package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
)

// Metric names shared by the programs.
const (
	// GBps is a bandwidth in GB/s: 10^9 bytes per second (not gigabits),
	// the unit of nccl_sendrecv.py's "GBps".
	GBps = "gbps"
	// LatencyUs is the time of one transfer in microseconds (median).
	LatencyUs = "us"
	// RTTP50Us and RTTP99Us are round-trip percentiles in microseconds.
	RTTP50Us = "rtt_p50_us"
	RTTP99Us = "rtt_p99_us"
)

// Result is one figure of a benchmark report.
type Result struct {
	// Bench names the program ("transfer", "gpu", "nccl").
	Bench string `json:"bench"`
	// Path names what moved the bytes ("tensorferry-staging", "raw-tcp").
	Path string `json:"path"`
	// Size is the bytes moved per message; 0 when the figure has no size.
	Size int64 `json:"size,omitempty"`
	// Metric names the figure (GBps, LatencyUs, ...).
	Metric string `json:"metric"`
	// Value is the figure in the metric's unit.
	Value float64 `json:"value"`
	// N is how many timed operations the figure summarises.
	N int `json:"n,omitempty"`
	// Channel is the data channel that carried the bytes, when known
	// ("staging", "ipc", "inline" for bytes copied into the control frame).
	Channel string `json:"channel,omitempty"`
	// Receivers is how many receivers got the bytes at once (fan-out);
	// 0 when the figure is of one receiver.
	Receivers int `json:"receivers,omitempty"`
}

// WriteTable writes rs as an aligned table.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tsize\tmetric\tvalue\tn\tchannel\t")
	for _, r := range rs {
		sz := "-"
		if r.Size > 0 {
			sz = size.Format(int(r.Size))
		}
		ch := r.Channel
		if ch == "" {
			ch = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t\n", r.Path, sz, r.Metric, FormatValue(r.Value), r.N, ch)
	}
	return tw.Flush()
}

// FormatValue prints v with three significant digits or more.
func FormatValue(v float64) string {
	switch {
	case v >= 1e4:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// WriteJSON writes one JSON object per result per line.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
}

// ncclRow is a line printed by ../shared/peers/nccl_sendrecv.py.
type ncclRow struct {
	Peer  string   `json:"peer"`
	Bytes *int64   `json:"bytes"`
	Us    *float64 `json:"us"`
	GBps  *float64 `json:"GBps"`
}

// maxLine bounds one line of a results file.
const maxLine = 1 << 20

// ErrBadLine is wrapped by Read's error for a line that starts a JSON
// object but is not a result in either format.
var ErrBadLine = errors.New("report: bad result line")

// Read reads results from JSON lines: our Result objects, and the rows of
// nccl_sendrecv.py ({"peer","bytes","us","GBps"}), which become two results
// of bench "nccl" (metrics GBps and LatencyUs) with the peer as path. Lines
// that do not start with '{' (tables, log output) are skipped; a line that
// does but is neither format fails with ErrBadLine and its line number.
func Read(r io.Reader) ([]Result, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var out []Result
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] != '{' {
			continue
		}
		rs, err := parseLine(b)
		if err != nil {
			return out, fmt.Errorf("%w: line %d: %w", ErrBadLine, line, err)
		}
		out = append(out, rs...)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("report: %w", err)
	}
	return out, nil
}

func parseLine(b []byte) ([]Result, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, err
	}
	if _, ok := probe["peer"]; ok {
		var n ncclRow
		if err := json.Unmarshal(b, &n); err != nil {
			return nil, err
		}
		if n.Peer == "" || n.Bytes == nil || n.GBps == nil || n.Us == nil {
			return nil, errors.New(`peer row without "peer", "bytes", "us" or "GBps"`)
		}
		return []Result{
			{Bench: "nccl", Path: n.Peer, Size: *n.Bytes, Metric: GBps, Value: *n.GBps},
			{Bench: "nccl", Path: n.Peer, Size: *n.Bytes, Metric: LatencyUs, Value: *n.Us},
		}, nil
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Bench == "" || r.Path == "" || r.Metric == "" {
		return nil, errors.New(`result without "bench", "path" or "metric"`)
	}
	return []Result{r}, nil
}
