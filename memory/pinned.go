package memory

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// PinnedAllocator allocates page-locked host memory with cuMemHostAlloc
// (portable, so every device's context sees it as pinned, and mapped into the
// device address space). The CPU addresses it through Host(); copies to and
// from CUDA devices run at full DMA speed and may be asynchronous. Pinning is
// expensive (milliseconds per call): allocate rings once and reuse them.
type PinnedAllocator struct {
	ctx *cuda.Context
}

// PinnedAllocatorFor returns the pinned allocator, or an error matching
// ErrNotSupported (and the driver's reason) without a CUDA device.
// Pinned memory is allocated through device 0's primary context.
func PinnedAllocatorFor() (*PinnedAllocator, error) {
	ctx, err := cuda.Primary(0)
	if err != nil {
		return nil, notSupported(Pinned, err)
	}
	return &PinnedAllocator{ctx: ctx}, nil
}

// Device returns Pinned.
func (*PinnedAllocator) Device() Device { return Pinned }

// Alloc returns n bytes of pinned host memory (contents unspecified). Free
// gives it back to the driver.
func (p *PinnedAllocator) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return nil, CheckRange(0, n, 0)
	}
	b := &pinnedBuffer{ctx: p.ctx}
	if n > 0 {
		ptr, err := p.ctx.MemHostAlloc(n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
		if err != nil {
			return nil, fmt.Errorf("memory: pinned alloc %d bytes: %w", n, err)
		}
		b.ptr = ptr
		b.b = unsafe.Slice((*byte)(ptr), n)
	} else {
		b.b = []byte{}
	}
	b.alloc = Allocation{Device: Pinned, Base: uintptr(b.ptr), Size: n, ID: NextAllocationID()}
	return b, nil
}

type pinnedBuffer struct {
	ctx   *cuda.Context
	ptr   unsafe.Pointer // C memory from cuMemHostAlloc; nil when empty
	alloc Allocation
	// release gives back memory not from cuMemHostAlloc (AllocOnNode's);
	// nil for cuMemFreeHost.
	release func() error

	mu    sync.Mutex
	b     []byte // nil once freed
	freed bool
}

func (b *pinnedBuffer) Device() Device { return Pinned }
func (b *pinnedBuffer) Len() int       { return b.alloc.Size }
func (b *pinnedBuffer) Host() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b
}
func (b *pinnedBuffer) Ptr() uintptr           { return b.alloc.Base }
func (b *pinnedBuffer) Allocation() Allocation { return b.alloc }

func (b *pinnedBuffer) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, b.alloc.Size); err != nil {
		return nil, err
	}
	return &pinnedView{parent: b, off: off, n: n}, nil
}

// Free gives the memory back to the driver (cuMemFreeHost; for
// AllocOnNode's, cuMemHostUnregister and munmap).
func (b *pinnedBuffer) Free() error {
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return ErrFreed
	}
	b.freed = true
	b.b = nil
	b.mu.Unlock()
	notifyFree(b.alloc)
	if b.release != nil {
		if err := b.release(); err != nil {
			return fmt.Errorf("memory: pinned free: %w", err)
		}
		return nil
	}
	if b.ptr == nil {
		return nil
	}
	if err := b.ctx.MemFreeHost(b.ptr); err != nil {
		return fmt.Errorf("memory: pinned free: %w", err)
	}
	return nil
}

// pinnedView is a non-owning view of pinned memory.
type pinnedView struct {
	parent *pinnedBuffer
	off, n int
}

func (v *pinnedView) Device() Device { return Pinned }
func (v *pinnedView) Len() int       { return v.n }
func (v *pinnedView) Host() []byte {
	b := v.parent.Host()
	if b == nil {
		return nil
	}
	return b[v.off : v.off+v.n : v.off+v.n]
}
func (v *pinnedView) Ptr() uintptr           { return v.parent.Ptr() + uintptr(v.off) }
func (v *pinnedView) Allocation() Allocation { return v.parent.alloc }
func (v *pinnedView) Free() error            { return nil }
func (v *pinnedView) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, v.n); err != nil {
		return nil, err
	}
	return &pinnedView{parent: v.parent, off: v.off + off, n: n}, nil
}
