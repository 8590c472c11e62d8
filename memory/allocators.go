package memory

import (
	"fmt"
	"sync"
	"sync/atomic"
)

var (
	allocMu    sync.RWMutex
	allocators = map[Kind]func(Device) (Allocator, error){
		KindHost: func(Device) (Allocator, error) { return HostAllocator{}, nil },
	}
)

// RegisterAllocatorFactory installs the factory for a device kind. The CUDA
// backend registers KindPinned and KindCUDA from an init function.
func RegisterAllocatorFactory(k Kind, f func(Device) (Allocator, error)) {
	allocMu.Lock()
	defer allocMu.Unlock()
	allocators[k] = f
}

// AllocUninit allocates n bytes on dev whose contents are unspecified:
// host buffers may reuse cached memory (NewHostBufferUninit); other devices
// allocate as usual (CUDA memory is never zeroed).
func AllocUninit(dev Device, n int) (Buffer, error) {
	var b Buffer
	var err error
	if dev.Kind == KindHost {
		b, err = NewHostBufferUninit(n)
	} else {
		var a Allocator
		if a, err = AllocatorFor(dev); err == nil {
			b, err = a.Alloc(n)
		}
	}
	if err == nil {
		uninitAllocs.Add(1)
	}
	return b, err
}

var uninitAllocs atomic.Uint64

// UninitAllocs returns how many buffers AllocUninit allocated in this
// process, on any device: the destinations of received tensors, which a
// receiver that gives its own (transfer.Destinations, tensor.Ref.FetchInto)
// does not allocate.
func UninitAllocs() uint64 { return uninitAllocs.Load() }

// AllocatorFor returns an allocator for dev, or an error wrapping
// ErrNotSupported (with the reason) when this machine cannot serve it.
func AllocatorFor(dev Device) (Allocator, error) {
	allocMu.RLock()
	f, ok := allocators[dev.Kind]
	allocMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("memory: no allocator for %s: %w", dev, ErrNotSupported)
	}
	return f(dev)
}
