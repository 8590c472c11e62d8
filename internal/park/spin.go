package park

import "time"

// Spin is the one spin policy of tensorferry's waits before they park (a
// socket read, in or out of the runtime's poller, and a shared-memory
// ring): poll without yielding for at most a budget, then park. The budget
// is the transport's read_spin (wire.DefaultReadSpinFor where it is not
// set). A spin never yields: runtime.Gosched puts the goroutine on the
// global run queue and wakes an idle thread each time, which costs a
// many-core host more than the spin saves (the H100 A/B of
// benchmarks/results/remote-h100-2026-11-24-spin-variants.jsonl, which
// BENCHMARKS.md's "Spinning without yielding" told until 55e34ed). Its users add around it: wire's reader yields once
// after a frame it handled, before its next read, and shm's spinner yields
// once after its first poll and stops spinning while the spin rarely ends
// a wait. Its zero value does not spin.
type Spin struct {
	budget time.Duration
	start  time.Time
	polls  int
	over   bool
}

// Begin starts one wait that spins for at most budget (none if <= 0).
func (s *Spin) Begin(budget time.Duration) {
	*s = Spin{budget: budget}
}

// Again is called after each poll that found nothing: it reports whether
// to poll again, or false to park, from the first false on until the next
// Begin. The budget counts from the first call; the clock is read every
// eighth poll only, as a read of it costs as much as a poll of memory.
func (s *Spin) Again() bool {
	switch s.polls++; {
	case s.over || s.budget <= 0:
		return false
	case s.polls == 1:
		s.start = time.Now()
		return true
	case s.polls&7 != 0:
		return true
	}
	s.over = time.Since(s.start) >= s.budget
	return !s.over
}
