package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"go.uber.org/goleak"
)

// TestRun: a small run measures one and two receivers with relay on and
// off, every receiver's bytes checked, and leaves no goroutine behind.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	o, err := parse("2", "1MiB", "200MB", 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rs {
		if r.Metric != report.LatencyUs || r.Value <= 0 || r.Size != 1<<20 {
			t.Fatalf("figure %+v", r)
		}
		seen[r.Path+"/"+string(rune('0'+r.Receivers))] = true
	}
	for _, k := range []string{"hosts-relay/1", "hosts-norelay/1", "hosts-relay/2", "hosts-norelay/2"} {
		if !seen[k] {
			t.Fatalf("no %s in %+v", k, rs)
		}
	}
	var b strings.Builder
	printTable(&b, rs)
	if !strings.Contains(b.String(), "× one receiver") {
		t.Fatal(b.String())
	}
}

func TestParse(t *testing.T) {
	for _, bad := range [][3]string{{"0", "1MiB", "1GB"}, {"x", "1MiB", "1GB"}, {"2", "4KiB", "1GB"}, {"2", "1MiB", "fast"}, {"2", "1MiB", "-1MB"}} {
		if _, err := parse(bad[0], bad[1], bad[2], 1, time.Second); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
	o, err := parse("4,2", "2MiB", "1.5GB", 3, time.Second)
	if err != nil || len(o.receivers) != 3 || o.receivers[0] != 1 || o.link != 1.5e9 || o.size != 2<<20 {
		t.Fatalf("%+v, %v", o, err)
	}
}
