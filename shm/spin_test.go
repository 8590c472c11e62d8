//go:build linux

package shm

import (
	"testing"
	"time"
)

// TestSpinnerAdapts: a spin that pays goes on; one that fails stops after
// a window and is tried again after probe sleeps, probe doubling while the
// spin keeps failing, back to one window once it pays again.
func TestSpinnerAdapts(t *testing.T) {
	s := newSpinner(10 * time.Microsecond)
	for range 10 * spinWindow {
		s.judge(true)
	}
	if s.cur != s.max {
		t.Fatalf("a spin that pays stopped: cur %v", s.cur)
	}
	window := func(hits int) {
		for i := range spinWindow {
			s.judge(i < hits)
		}
	}
	window(spinWindow/2 - 1)
	if s.cur != 0 || s.probe != 2*spinWindow {
		t.Fatalf("after a failed window: cur %v, probe %d", s.cur, s.probe)
	}
	for probe := 2 * spinWindow; probe <= maxProbe; probe *= 2 {
		for range probe - 1 {
			s.slept()
		}
		if s.cur != 0 {
			t.Fatalf("spin back after %d sleeps, want %d", probe-1, probe)
		}
		s.slept()
		if s.cur != s.max {
			t.Fatalf("spin not back after %d sleeps", probe)
		}
		window(0)
		if want := min(2*probe, maxProbe); s.probe != want {
			t.Fatalf("probe %d, want %d", s.probe, want)
		}
	}
	for range maxProbe {
		s.slept()
	}
	window(spinWindow / 2)
	if s.cur != s.max || s.probe != spinWindow {
		t.Fatalf("after a window that paid: cur %v, probe %d", s.cur, s.probe)
	}
	if off := newSpinner(0); off.spin(func() bool { return true }) {
		t.Fatal("a spinner without a spin spun")
	}
}

func TestSpinLimit(t *testing.T) {
	if spinLimit(-1) != 0 || spinLimit(3*time.Microsecond) != 3*time.Microsecond {
		t.Fatal("explicit spins not kept")
	}
	if d := spinLimit(0); d != 0 && d != DefaultSpin {
		t.Fatalf("default spin %v", d)
	}
}
