package fastpath

import (
	"os"
	"runtime"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		v      string
		on, ok bool
	}{
		{"", false, true},
		{"auto", false, true},
		{"on", true, true},
		{"ON", false, false},
		{"1", false, false},
		{"off", false, false},
	} {
		on, err := parse(tc.v)
		if on != tc.on || (err == nil) != tc.ok {
			t.Errorf("parse(%q) = %v, %v; want %v, ok %v", tc.v, on, err, tc.on, tc.ok)
		}
	}
}

// Spare follows the environment of this test process: scripts/test runs
// the suites once without Env and once with it on.
func TestSpare(t *testing.T) {
	forced := os.Getenv(Env) == "on"
	if Forced() != forced {
		t.Fatalf("Forced() = %v with %s=%q", Forced(), Env, os.Getenv(Env))
	}
	want := forced || min(runtime.GOMAXPROCS(0), runtime.NumCPU()) >= MinProcs
	if Spare() != want {
		t.Errorf("Spare() = %v, want %v", Spare(), want)
	}
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	if Spare() != forced {
		t.Errorf("Spare() with one processor = %v, want %v (forced)", Spare(), forced)
	}
}
