//go:build linux

package shm

import (
	"fmt"
	"runtime/debug"
)

// The region is a file that the peer, or any process of this user, can
// truncate at any time; a page of the mapping past the file's new end then
// faults (SIGBUS), which would kill the process. Every access to a mapping
// runs with the runtime's panic-on-fault on, so that a fault becomes an
// error of that connection or upgrade: Conn.Read and Conn.Write through
// catchFault, every stage of Upgrade through guard.

// faultError describes the fault r (a runtime error with an address) of
// a region's mapping, or returns nil if r is another panic.
func faultError(what string, r any) error {
	af, ok := r.(interface{ Addr() uintptr })
	if !ok {
		return nil
	}
	return fmt.Errorf("shm: %s: the shared region faulted at %#x (was its file truncated?): %v", what, af.Addr(), r)
}

// guard runs f, which touches a mapping, and returns the fault it hit, if
// any, as an error (what says what f was doing).
func guard(what string, f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if err = faultError(what, r); err == nil {
				panic(r)
			}
		}
	}()
	f()
	return nil
}

// testHookMapped, when set by a test, runs after openRegion mapped the
// peer's region and before it reads it: the moment a truncation would
// otherwise go unnoticed by the size check.
var testHookMapped func(path string)
