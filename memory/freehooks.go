package memory

import "sync"

var freeHooks struct {
	mu   sync.RWMutex
	next uint64
	m    map[uint64]func(Allocation)
}

// OnFree subscribes f to the end of allocations: it is called, synchronously
// and once, when an allocation's memory goes away (a host buffer is freed, a
// pinned buffer is given back to the driver, a CUDA block leaves the
// allocator cache for cuMemFree). Caches keyed by Allocation.ID use it to
// drop their entries; NewRegCache subscribes itself. f must be quick, must
// not block and must not free buffers. The returned cancel unsubscribes.
func OnFree(f func(Allocation)) (cancel func()) {
	freeHooks.mu.Lock()
	defer freeHooks.mu.Unlock()
	if freeHooks.m == nil {
		freeHooks.m = map[uint64]func(Allocation){}
	}
	freeHooks.next++
	id := freeHooks.next
	freeHooks.m[id] = f
	return func() {
		freeHooks.mu.Lock()
		defer freeHooks.mu.Unlock()
		delete(freeHooks.m, id)
	}
}

// notifyFree tells every OnFree subscriber that a is gone. Backends call it
// when the memory of a is released.
func notifyFree(a Allocation) {
	freeHooks.mu.RLock()
	fs := make([]func(Allocation), 0, len(freeHooks.m))
	for _, f := range freeHooks.m {
		fs = append(fs, f)
	}
	freeHooks.mu.RUnlock()
	for _, f := range fs {
		f(a)
	}
}
