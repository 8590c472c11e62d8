package ipc

import (
	"syscall"
	"unsafe"
)

// monoNow returns the host's CLOCK_MONOTONIC in nanoseconds: unlike the
// monotonic reading of time.Now (which counts from the process's start), it
// is the same clock in every process of the host, so an owner can state a
// lease's deadline to a fetcher on its host.
func monoNow() (uint64, bool) {
	const clockMonotonic = 1
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, false
	}
	return uint64(ts.Nano()), true
}
