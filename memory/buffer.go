package memory

import (
	"context"
	"errors"
	"fmt"
)

// Errors returned by buffers and allocators.
var (
	// ErrFreed is returned when a freed buffer is used or freed again.
	ErrFreed = errors.New("memory: buffer already freed")
	// ErrOutOfRange is returned when a slice or copy exceeds a buffer.
	ErrOutOfRange = errors.New("memory: range outside buffer")
	// ErrNotSupported is returned for a device kind this build or machine
	// cannot serve (for example CUDA without a driver).
	ErrNotSupported = errors.New("memory: not supported on this machine")
)

// Allocation identifies a whole allocation made by an allocator. Registration
// caches and CUDA IPC work on whole allocations: a buffer carved out of one
// (a Slice) shares its Allocation.
type Allocation struct {
	Device Device
	Base   uintptr // first address of the allocation (device pointer for CUDA)
	Size   int     // bytes
	// ID is unique per allocation for the life of the process; a cache keyed
	// by ID never confuses a freed allocation with a new one at the same
	// address.
	ID uint64
}

// Buffer is a contiguous range of bytes on one device. Buffers are not safe
// for concurrent Free; concurrent reads and copies are the caller's business.
type Buffer interface {
	// Device is where the bytes live.
	Device() Device
	// Len is the length in bytes.
	Len() int
	// Host returns the bytes when the CPU can address them (host and pinned
	// memory); nil for device memory. Valid until Free.
	Host() []byte
	// Ptr is the address of the first byte: a host address or a CUDA device
	// pointer. 0 for an empty buffer.
	Ptr() uintptr
	// Allocation is the whole allocation this buffer belongs to.
	Allocation() Allocation
	// Slice returns a view of [off, off+n) that shares memory with the buffer
	// and does not own it: freeing the view is a no-op.
	Slice(off, n int) (Buffer, error)
	// Free gives the memory back. A view's Free does nothing. Freeing twice
	// returns ErrFreed.
	Free() error
}

// Allocator hands out buffers on one device.
type Allocator interface {
	Device() Device
	// Alloc returns a buffer of n bytes. The contents are unspecified.
	Alloc(n int) (Buffer, error)
}

// CheckRange returns ErrOutOfRange (wrapped with the numbers) unless
// 0 <= off, 0 <= n and off+n <= size, without overflowing.
func CheckRange(off, n, size int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%w: [%d, %d+%d) of %d bytes", ErrOutOfRange, off, off, n, size)
	}
	return nil
}

// Copier copies between buffers of particular device kinds. The CUDA backend
// registers one for every pair of kinds that involves device memory.
type Copier func(ctx context.Context, dst, src Buffer) error

var copiers = map[[2]Kind]Copier{}

// RegisterCopier installs the copier for copies from src kind to dst kind. It
// is called from init functions only.
func RegisterCopier(dst, src Kind, c Copier) { copiers[[2]Kind{dst, src}] = c }

// Copy copies all of src into the
// start of dst and fails with ErrOutOfRange when dst is smaller. Host to host
// copies are a memmove; copies that involve device memory go through the
// registered CUDA copier and are complete when Copy returns.
func Copy(ctx context.Context, dst, src Buffer) error {
	if dst.Len() < src.Len() {
		return fmt.Errorf("%w: destination %d bytes < source %d bytes", ErrOutOfRange, dst.Len(), src.Len())
	}
	if src.Len() == 0 {
		return nil
	}
	if dst.Device().IsHost() && src.Device().IsHost() {
		d, s := dst.Host(), src.Host()
		if d == nil || s == nil {
			return ErrFreed
		}
		copy(d, s)
		return nil
	}
	c, ok := copiers[[2]Kind{dst.Device().Kind, src.Device().Kind}]
	if !ok {
		return fmt.Errorf("memory: copy %s -> %s: %w", src.Device(), dst.Device(), ErrNotSupported)
	}
	return c(ctx, dst, src)
}
