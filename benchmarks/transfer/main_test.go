package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"go.uber.org/goleak"
)

// TestRun measures a few small sizes on every path and checks that every
// figure is there, positive, on the channel it should be, and that closing
// leaves no goroutine behind.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := options{sizes: []int{4 << 10, 1 << 20}, reps: 2, rttCount: 20, paths: allPaths, timeout: 30 * time.Second}
	rs, err := run(o, func(report.Result) {})
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		path   string
		size   int64
		metric string
	}
	got := map[key]report.Result{}
	for _, r := range rs {
		if r.Value <= 0 || r.Bench != "transfer" {
			t.Errorf("figure %+v", r)
		}
		got[key{r.Path, r.Size, r.Metric}] = r
	}
	for _, size := range []int64{4 << 10, 1 << 20} {
		for _, p := range []string{pathRaw, pathRawFresh, pathTF} {
			for _, m := range []string{report.GBps, metricBest, report.LatencyUs} {
				if _, ok := got[key{p, size, m}]; !ok {
					t.Errorf("no %s %s at %d bytes", p, m, size)
				}
			}
		}
	}
	if r := got[key{pathTF, 4 << 10, report.GBps}]; r.Channel != "inline" {
		t.Errorf("4 KiB went %q, want inline", r.Channel)
	}
	if r := got[key{pathTF, 1 << 20, "fetch_gbps"}]; r.Channel != "staging" {
		t.Errorf("1 MiB fetch figure %+v, want one over staging", r)
	}
	for _, p := range []string{pathRTT64, pathRTT4K} {
		if _, ok := got[key{p, map[string]int64{pathRTT64: rttPayload, pathRTT4K: rttTensor}[p], report.RTTP50Us}]; !ok {
			t.Errorf("no round trip of %s", p)
		}
	}
	lines := summary(append(rs,
		report.Result{Path: pathTF, Size: 64 << 20, Metric: report.GBps, Value: 9},
		report.Result{Path: pathRaw, Size: 64 << 20, Metric: report.GBps, Value: 10},
		report.Result{Path: pathTF, Size: 64 << 20, Metric: metricBest, Value: 8},
		report.Result{Path: pathRaw, Size: 64 << 20, Metric: metricBest, Value: 10}))
	if len(lines) != 2 || !strings.Contains(lines[0], "90.0 %") || !strings.Contains(lines[0], "best repetitions: 80.0 %") {
		t.Errorf("summary %q", lines)
	}
}

// TestVerbsPaths measures the verbs pair paths where this host has RDMA
// devices (one, or two for verbs-2-nics), and checks the skip otherwise.
func TestVerbsPaths(t *testing.T) {
	defer goleak.VerifyNone(t)
	var skipped []string
	o := options{sizes: []int{64 << 10}, reps: 2, paths: []string{pathVerbs1, pathVerbs2}, timeout: 30 * time.Second,
		skipVerbs: func(p string, err error) { skipped = append(skipped, p); t.Logf("%s: %v", p, err) }}
	rs, err := run(o, func(report.Result) {})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rs {
		if r.Value <= 0 || r.Channel != "verbs" {
			t.Errorf("figure %+v", r)
		}
		got[r.Path] = true
	}
	for _, p := range o.paths {
		if got[p] == slices.Contains(skipped, p) {
			t.Errorf("%s: measured %v, skipped %v", p, got[p], skipped)
		}
	}
}
