package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// collectExprs gathers every "expr" and templating "query" string of a
// decoded Grafana dashboard.
func collectExprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
				*out = append(*out, s)
			}
			collectExprs(x, out)
		}
	case []any:
		for _, x := range v {
			collectExprs(x, out)
		}
	}
}

// Every expression of the Grafana dashboard names families the collector
// exports, and every family has a panel.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/tensorferry.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	collectExprs(dash, &exprs)
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions", len(exprs))
	}
	known := FamilyNames()
	used := map[string]bool{}
	name := regexp.MustCompile(`tensorferry_[a-z0-9_]+`)
	for _, e := range exprs {
		names := name.FindAllString(e, -1)
		if len(names) == 0 {
			t.Errorf("expression names no tensorferry family: %s", e)
		}
		for _, n := range names {
			f := n
			if strings.HasPrefix(n, "tensorferry_transfer_duration_seconds_") {
				f = "tensorferry_transfer_duration_seconds" // _bucket, _sum, _count
				if !slices.Contains([]string{"_bucket", "_sum", "_count"}, strings.TrimPrefix(n, f)) {
					t.Errorf("%s: no such series of the histogram %s", n, f)
				}
			}
			if !slices.Contains(known, f) {
				t.Errorf("expression names %s, which is not a family: %s", n, e)
			}
			used[f] = true
		}
	}
	for _, f := range known {
		if !used[f] {
			t.Errorf("no panel shows %s", f)
		}
	}
}
