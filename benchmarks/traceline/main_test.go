package main

import (
	"regexp"
	"testing"
)

func TestBreakdownStagesInOrderAndSkipsIncompleteCycles(t *testing.T) {
	evs := []event{
		{0, "S g1 start"},
		{10, "R g2 read"},
		{15, "R g3 write"}, // before "read"'s stage? no: marks are in order
		{30, "R g3 write"},
		{100, "S g1 start"}, // second cycle: no "write" before the third
		{110, "R g2 read"},
		{200, "S g1 start"},
		{204, "R g2 read"},
		{210, "R g3 write"},
	}
	var ms marks
	for _, s := range []string{"read=R .*read", "write=R .*write"} {
		if err := ms.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	stages, n := breakdown(evs, regexp.MustCompile(`^S .*start`), ms)
	if n != 2 {
		t.Fatalf("complete cycles %d, want 2", n)
	}
	if got := stages[0].d; len(got) != 2 || got[0] != 10 || got[1] != 4 {
		t.Errorf("read stage %v, want [10 4]", got)
	}
	if got := stages[1].d; len(got) != 2 || got[0] != 5 || got[1] != 6 {
		t.Errorf("write stage %v, want [5 6]", got)
	}
}

func TestMarkFlagNeedsNameAndValidRegexp(t *testing.T) {
	var ms marks
	for _, bad := range []string{"noequals", "=x", "n=("} {
		if err := ms.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

func TestQuantile(t *testing.T) {
	if q := quantile(nil, 0.5); q != 0 {
		t.Errorf("empty: %v", q)
	}
	d := []float64{5, 1, 4, 2, 3}
	if q := quantile(d, 0.5); q != 3 {
		t.Errorf("p50 %v, want 3", q)
	}
	if q := quantile(d, 0.9); q != 5 {
		t.Errorf("p90 %v, want 5", q)
	}
}
