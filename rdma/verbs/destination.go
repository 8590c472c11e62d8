package verbs

import (
	"sync/atomic"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
)

// The fetcher's destination registrations live in one memory.RegCache per
// channel ("verbs"), keyed by allocation and by the connection they were
// made for: the cache's peer string is a connection key, owner#n, naming
// the protection domain of one fetchPeer. A connection that is replaced
// (broken, PeerDown) gets a new key, so a new queue pair never uses a
// region of the old protection domain; its registrations are dropped with
// DropPeer when it breaks and again, before its protection domain is freed,
// when it is destroyed.

// destReg is an allocation registered in one protection domain: for local
// writes (a destination) or for binding windows (an owner's, GrantWindows).
type destReg struct {
	alloc memory.Allocation
	mr    *ibverbs.MR
	// used is set by the first fetch that uses the registration: the one
	// that missed the cache (for its span's cache attribute).
	used atomic.Bool
}

// Allocation returns the registered allocation.
func (r *destReg) Allocation() memory.Allocation { return r.alloc }

// cacheable reports whether dst can be registered through the cache: its
// allocation is known and contains it, and registering the allocation does
// not lose the buffer's own dmabuf export (DmabufExporter buffers are
// registered on their own range, per transfer).
func cacheable(dst memory.Buffer) bool {
	if _, ok := dst.(DmabufExporter); ok && !dst.Device().IsHost() {
		return false
	}
	a := dst.Allocation()
	return a.Size > 0 && a.Base != 0 && dst.Ptr() >= a.Base && dst.Ptr()+uintptr(dst.Len()) <= a.Base+uintptr(a.Size)
}

// allocationBuffer presents a whole allocation as a buffer, for
// registration only: regBuffer reads its device, address and length, and
// memory.DmaBuf exports the CUDA allocation containing its address.
type allocationBuffer struct{ a memory.Allocation }

func (w allocationBuffer) Device() memory.Device                 { return w.a.Device }
func (w allocationBuffer) Len() int                              { return w.a.Size }
func (w allocationBuffer) Host() []byte                          { return nil }
func (w allocationBuffer) Ptr() uintptr                          { return w.a.Base }
func (w allocationBuffer) Allocation() memory.Allocation         { return w.a }
func (w allocationBuffer) Slice(int, int) (memory.Buffer, error) { return nil, memory.ErrNotSupported }
func (w allocationBuffer) Free() error                           { return nil }
