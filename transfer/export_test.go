package transfer

import "time"

// SetRelayGrace sets how long a relay request waits for its content's
// fetch to start (relayGrace), for tests that must not depend on the
// order in which nodes read their messages; it returns the undo.
func SetRelayGrace(d time.Duration) (undo func()) {
	old := relayGrace.Swap(int64(d))
	return func() { relayGrace.Store(old) }
}
