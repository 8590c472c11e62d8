package park

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The model: a producer publishes items one at a time and wakes the
// consumer, which parks whenever it has seen all of them. Run under -race
// (scripts/test does), where a plain Store in place of a read-modify-write
// loses a wake-up (golang/go#58020): the consumer then sleeps forever on an
// item already published, which the test reports instead of hanging.
func TestNoLostWakeUp(t *testing.T) {
	const items = 200000
	var published atomic.Uint64
	p := NewParker()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for seen := uint64(0); seen < items; {
			if n := published.Load(); n > seen {
				seen = n
				continue
			}
			p.Park(func() bool { return published.Load() > seen }, nil)
		}
	}()
	for i := uint64(1); i <= items; i++ {
		Publish(&published, i)
		p.Unpark()
		if i%1024 == 0 {
			select {
			case <-done:
			default:
			}
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("the consumer sleeps with %d items published: a wake-up was lost", published.Load())
	}
}

// Park returns false once stop is closed, and true when woken.
func TestParkStop(t *testing.T) {
	p := NewParker()
	stop := make(chan struct{})
	close(stop)
	if p.Park(func() bool { return false }, stop) {
		t.Error("Park with stop closed returned true")
	}
	p.flag.Store(1) // as a waiter about to sleep
	p.Unpark()
	if !p.Park(func() bool { return false }, nil) {
		t.Error("Park after Unpark returned false")
	}
	if !p.Park(func() bool { return true }, nil) {
		t.Error("Park with ready true returned false")
	}
}

// Wait sleeps only when ready stays false, and Wake reports a waiter only
// once.
func TestWaitAndWake(t *testing.T) {
	var flag atomic.Uint32
	slept := false
	if err := Wait(&flag, func() bool { return true }, func() error { slept = true; return nil }); err != nil || slept || flag.Load() != 0 {
		t.Errorf("ready: err %v, slept %v, flag %d", err, slept, flag.Load())
	}
	if Wake(&flag) {
		t.Error("Wake reported a waiter that was awake")
	}
	err := Wait(&flag, func() bool { return false }, func() error {
		slept = true
		if !Wake(&flag) || Wake(&flag) {
			t.Error("Wake did not report the sleeping waiter exactly once")
		}
		return nil
	})
	if err != nil || !slept || flag.Load() != 0 {
		t.Errorf("not ready: err %v, slept %v, flag %d", err, slept, flag.Load())
	}
}

// The model for Gate: waiters each wait for the count to pass their own
// mark, which a producer raises one at a time, opening the gate after
// each step; every waiter must finish. A lost wake-up leaves one asleep,
// which the test reports instead of hanging.
func TestGateWakesEveryWaiter(t *testing.T) {
	const waiters, steps = 8, 20000
	var g Gate
	var count atomic.Uint64
	var finished atomic.Int32
	done := make(chan struct{})
	for w := range waiters {
		go func() {
			defer func() {
				if finished.Add(1) == waiters {
					close(done)
				}
			}()
			for mark := uint64(w); mark < steps; mark += waiters {
				for count.Load() <= mark {
					g.Wait(func() bool { return count.Load() > mark }, nil, nil)
				}
			}
		}()
	}
	for i := uint64(1); i <= steps; i++ {
		Publish(&count, i)
		g.Open()
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d waiters finished: a wake-up was lost", finished.Load(), waiters)
	}
}

// Gate.Wait returns false once a stop channel is closed, true when ready or
// opened; Open with nobody waiting leaves nothing behind.
func TestGateStop(t *testing.T) {
	var g Gate
	g.Open()
	stop := make(chan struct{})
	close(stop)
	if g.Wait(func() bool { return false }, nil, stop) {
		t.Error("Wait with stop2 closed returned true")
	}
	if !g.Wait(func() bool { return true }, nil, nil) {
		t.Error("Wait with ready true returned false")
	}
	var opened atomic.Uint64
	woken := make(chan bool)
	go func() { woken <- g.Wait(func() bool { return opened.Load() != 0 }, nil, nil) }()
	for g.waiting.Load() == 0 {
		runtime.Gosched()
	}
	Publish(&opened, 1)
	g.Open()
	if !<-woken {
		t.Error("Wait after Open returned false")
	}
}
