package park

import (
	"testing"
	"time"
)

// TestSpin: a zero or negative budget never spins; a budget spins until it
// has passed, then never again until the next Begin.
func TestSpin(t *testing.T) {
	var s Spin
	if s.Again() {
		t.Fatal("the zero Spin spins")
	}
	s.Begin(-1)
	if s.Again() {
		t.Fatal("a negative budget spins")
	}
	s.Begin(time.Hour)
	for i := range 1000 {
		if !s.Again() {
			t.Fatalf("an hour's spin ended after %d polls", i)
		}
	}
	s.Begin(time.Microsecond)
	start, polls := time.Now(), 0
	for s.Again() {
		polls++
	}
	if time.Since(start) < time.Microsecond {
		t.Fatalf("a spin of 1µs ended after %v (%d polls)", time.Since(start), polls)
	}
	for range 16 {
		if s.Again() {
			t.Fatal("a spin went on once its budget had passed")
		}
	}
	s.Begin(time.Hour)
	if !s.Again() {
		t.Fatal("Begin did not start a new spin")
	}
}
