// Package poll waits, in tests, for a condition that no channel or
// callback reports: the last resort after events. It polls every
// millisecond; the deadline only fails a test whose condition never comes.
//
//	poll.Until(t, "the sender parked", func() bool { return blocked(c) })
package poll

import (
	"testing"
	"time"
)

// Deadline is how long Until waits before it fails the test.
const Deadline = 10 * time.Second

// Until polls cond every millisecond until it holds, failing tb (naming
// what) if it does not within Deadline.
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(Deadline)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			tb.Fatalf("%s: not reached in %v", what, Deadline)
		}
	}
}
