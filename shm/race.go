//go:build race

package shm

import "sync/atomic"

// ioSync stands, for the race detector, for the ordering a ring's index
// words give: they live in a shared mapping, outside the memory the
// detector watches, so their atomics order nothing it can see. What a
// producer did before it published bytes happens before what their
// consumer does after it saw them (package syscall's ioSync does the same
// for a socket's bytes). Only race builds have it.
var ioSync atomic.Uint64

func raceReleaseIO() { ioSync.Add(1) }

func raceAcquireIO() { ioSync.Load() }
