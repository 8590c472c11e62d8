//go:build !linux

package ipc

// monoNow reports that this platform gives no host-wide monotonic clock:
// offers are never direct, every fetch begins and ends on the owner.
func monoNow() (uint64, bool) { return 0, false }
