package memory

import (
	"container/list"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

func init() {
	RegisterAllocatorFactory(KindCUDA, func(d Device) (Allocator, error) {
		a, err := CUDAAllocatorFor(d)
		if err != nil {
			return nil, err
		}
		return a, nil
	})
	RegisterAllocatorFactory(KindPinned, func(Device) (Allocator, error) {
		a, err := PinnedAllocatorFor()
		if err != nil {
			return nil, err
		}
		return a, nil
	})
}

// cudaDevice is the process-wide state of one CUDA device: its primary
// context, its caching allocator and a pool of streams for synchronous
// copies and kernels.
type cudaDevice struct {
	dev   Device
	ctx   *cuda.Context
	alloc *CUDAAllocator

	mu      sync.Mutex
	streams []*cuda.Stream // idle streams for Copy and kernels
}

var (
	cudaDevMu sync.Mutex
	cudaDevs  = map[int]*cudaDevice{}
)

// notSupported turns a driver error meaning "no CUDA here" into one that
// matches ErrNotSupported as well as the driver's reason.
func notSupported(dev Device, err error) error {
	if errors.Is(err, cuda.ErrNoDevice) {
		return fmt.Errorf("%w: %s: %w", ErrNotSupported, dev, err)
	}
	return fmt.Errorf("memory: %s: %w", dev, err)
}

// cudaDeviceFor returns the state of a CUDA device, creating it on first use.
func cudaDeviceFor(dev Device) (*cudaDevice, error) {
	if dev.Kind != KindCUDA {
		return nil, fmt.Errorf("memory: %s is not a CUDA device", dev)
	}
	cudaDevMu.Lock()
	defer cudaDevMu.Unlock()
	if d, ok := cudaDevs[dev.Index]; ok {
		return d, nil
	}
	ctx, err := cuda.Primary(dev.Index)
	if err != nil {
		return nil, notSupported(dev, err)
	}
	d := &cudaDevice{dev: dev, ctx: ctx}
	budget := int64(DefaultCUDACacheBytes)
	if total, err := cuda.TotalMem(dev.Index); err == nil {
		budget = max(budget, total/8)
	}
	d.alloc = &CUDAAllocator{d: d, budget: budget, free: map[int][]*cudaBlock{}, lru: list.New()}
	cudaDevs[dev.Index] = d
	return d, nil
}

// stream takes an idle stream of the device, creating one if none is idle.
func (d *cudaDevice) stream() (*cuda.Stream, error) {
	d.mu.Lock()
	if n := len(d.streams); n > 0 {
		s := d.streams[n-1]
		d.streams = d.streams[:n-1]
		d.mu.Unlock()
		return s, nil
	}
	d.mu.Unlock()
	s, err := d.ctx.NewStream()
	if err != nil {
		return nil, fmt.Errorf("memory: %s: %w", d.dev, err)
	}
	return s, nil
}

// putStream returns an idle (synchronized) stream to the pool.
func (d *cudaDevice) putStream(s *cuda.Stream) {
	d.mu.Lock()
	d.streams = append(d.streams, s)
	d.mu.Unlock()
}

// DefaultCUDACacheBytes is the smallest default budget of a CUDAAllocator's
// cache: the bytes of freed blocks kept for reuse before blocks go back to
// the driver. The default is an eighth of the device's memory when that is
// more (17.6 GB on an H200): a receiver with several large tensors in
// flight must not give a block back (cuMemFree synchronizes the device)
// and allocate it again for every message. An allocation the driver
// refuses for lack of memory empties the cache and is tried again.
const DefaultCUDACacheBytes = 1 << 30

// Size classes of the CUDA allocator.
const (
	cudaMinBlock   = 512     // smallest block
	cudaSmallLimit = 1 << 20 // up to here: powers of two
	cudaLargeRound = 2 << 20 // above: multiples of 2 MiB
)

// cudaClass returns the block size that serves a request of n bytes.
func cudaClass(n int) int {
	if n <= cudaMinBlock {
		return cudaMinBlock
	}
	if n <= cudaSmallLimit {
		return 1 << bits.Len(uint(n-1))
	}
	return (n + cudaLargeRound - 1) / cudaLargeRound * cudaLargeRound
}

// cudaBlock is one driver allocation (cuMemAlloc).
type cudaBlock struct {
	ptr  cuda.DevicePtr
	size int
	id   uint64        // Allocation.ID, stable for the life of the driver allocation
	elem *list.Element // position in the LRU list while cached
}

// CUDAAllocator is the caching allocator of one CUDA device. Whole driver
// allocations are rounded to size classes (powers of two up to 1 MiB, then
// multiples of 2 MiB); a freed buffer's block goes to a cache and serves the
// next request of its class without a driver call. When the cache holds more
// than its budget, the least recently freed blocks are given back with
// cuMemFree; Trim gives all of them back. One allocator exists per device
// (CUDAAllocatorFor); it is safe for concurrent use.
//
// Allocation identity: a buffer's Allocation is its driver block, and
// Allocation.ID stays the same while the block lives, across reuse from the
// cache. Caches keyed by ID (registrations, CUDA IPC handles) therefore stay
// valid on reuse, which is right since the memory is the same; OnFree
// subscribers hear about the block when it is given back to the driver.
type CUDAAllocator struct {
	d *cudaDevice

	mu     sync.Mutex
	budget int64
	free   map[int][]*cudaBlock // cached blocks by class, most recent last
	lru    *list.List           // cached blocks, least recently freed first
	stats  CUDAAllocatorStats
}

// CUDAAllocatorStats are counters of a CUDAAllocator.
type CUDAAllocatorStats struct {
	Allocs       int64 // Alloc calls that succeeded
	Hits         int64 // of those, served from the cache
	DriverAllocs int64 // cuMemAlloc calls that succeeded
	DriverFrees  int64 // cuMemFree calls
	BytesInUse   int64 // bytes of blocks held by live buffers
	BytesCached  int64 // bytes of blocks in the cache
	BlocksCached int64
}

// CUDAAllocatorFor returns the allocator of a CUDA device, or an error
// matching ErrNotSupported (and the driver's reason) when the device cannot
// be used.
func CUDAAllocatorFor(dev Device) (*CUDAAllocator, error) {
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return nil, err
	}
	return d.alloc, nil
}

// Device returns the allocator's device.
func (a *CUDAAllocator) Device() Device { return a.d.dev }

// CacheBytes returns the cache budget in bytes.
func (a *CUDAAllocator) CacheBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.budget
}

// SetCacheBytes sets the cache budget in bytes (0: cache nothing) and gives
// back blocks beyond it.
func (a *CUDAAllocator) SetCacheBytes(n int64) error {
	a.mu.Lock()
	a.budget = max(n, 0)
	evict := a.evictLocked()
	a.mu.Unlock()
	return a.release(evict)
}

// Stats returns the allocator's counters.
func (a *CUDAAllocator) Stats() CUDAAllocatorStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Alloc returns a device buffer of n bytes (contents unspecified). When the
// driver is out of memory the cache is trimmed and the allocation retried
// once.
func (a *CUDAAllocator) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return nil, CheckRange(0, n, 0)
	}
	class := cudaClass(n)
	a.mu.Lock()
	if blks := a.free[class]; len(blks) > 0 {
		b := blks[len(blks)-1]
		a.free[class] = blks[:len(blks)-1]
		a.lru.Remove(b.elem)
		b.elem = nil
		a.stats.Allocs++
		a.stats.Hits++
		a.stats.BytesCached -= int64(class)
		a.stats.BlocksCached--
		a.stats.BytesInUse += int64(class)
		a.mu.Unlock()
		return &cudaBuffer{a: a, blk: b, n: n}, nil
	}
	a.mu.Unlock()
	p, err := a.d.ctx.MemAlloc(class)
	var ce *cuda.Error
	if errors.As(err, &ce) && ce.Code == cuda.ErrorOutOfMemory {
		if terr := a.Trim(); terr != nil {
			return nil, fmt.Errorf("memory: %s: alloc %d bytes: %w (trim: %w)", a.d.dev, n, err, terr)
		}
		p, err = a.d.ctx.MemAlloc(class)
	}
	if err != nil {
		return nil, fmt.Errorf("memory: %s: alloc %d bytes: %w", a.d.dev, n, err)
	}
	b := &cudaBlock{ptr: p, size: class, id: NextAllocationID()}
	a.mu.Lock()
	a.stats.Allocs++
	a.stats.DriverAllocs++
	a.stats.BytesInUse += int64(class)
	a.mu.Unlock()
	return &cudaBuffer{a: a, blk: b, n: n}, nil
}

// Trim gives every cached block back to the driver.
func (a *CUDAAllocator) Trim() error {
	a.mu.Lock()
	var evict []*cudaBlock
	for e := a.lru.Front(); e != nil; e = e.Next() {
		evict = append(evict, e.Value.(*cudaBlock))
	}
	a.lru.Init()
	clear(a.free)
	a.stats.BytesCached, a.stats.BlocksCached = 0, 0
	a.mu.Unlock()
	return a.release(evict)
}

// put takes back the block of a freed buffer.
func (a *CUDAAllocator) put(b *cudaBlock) error {
	a.mu.Lock()
	a.stats.BytesInUse -= int64(b.size)
	b.elem = a.lru.PushBack(b)
	a.free[b.size] = append(a.free[b.size], b)
	a.stats.BytesCached += int64(b.size)
	a.stats.BlocksCached++
	evict := a.evictLocked()
	a.mu.Unlock()
	return a.release(evict)
}

// evictLocked removes least recently freed blocks until the cache fits its
// budget and returns them for release.
func (a *CUDAAllocator) evictLocked() []*cudaBlock {
	var evict []*cudaBlock
	for a.stats.BytesCached > a.budget {
		b := a.lru.Remove(a.lru.Front()).(*cudaBlock)
		b.elem = nil
		blks := a.free[b.size]
		for i, c := range blks {
			if c == b {
				a.free[b.size] = append(blks[:i], blks[i+1:]...)
				break
			}
		}
		a.stats.BytesCached -= int64(b.size)
		a.stats.BlocksCached--
		evict = append(evict, b)
	}
	return evict
}

// release gives blocks back to the driver and tells OnFree subscribers.
func (a *CUDAAllocator) release(blks []*cudaBlock) error {
	var errs []error
	for _, b := range blks {
		notifyFree(Allocation{Device: a.d.dev, Base: uintptr(b.ptr), Size: b.size, ID: b.id})
		if err := a.d.ctx.MemFree(b.ptr); err != nil {
			errs = append(errs, fmt.Errorf("memory: %s: %w", a.d.dev, err))
		}
		a.mu.Lock()
		a.stats.DriverFrees++
		a.mu.Unlock()
	}
	return errors.Join(errs...)
}

// cudaBuffer is a buffer owning a block of a CUDAAllocator.
type cudaBuffer struct {
	a   *CUDAAllocator
	blk *cudaBlock
	n   int

	mu    sync.Mutex
	freed bool
}

func (b *cudaBuffer) Device() Device { return b.a.d.dev }
func (b *cudaBuffer) Len() int       { return b.n }
func (b *cudaBuffer) Host() []byte   { return nil }
func (b *cudaBuffer) Ptr() uintptr   { return uintptr(b.blk.ptr) }
func (b *cudaBuffer) Allocation() Allocation {
	return Allocation{Device: b.a.d.dev, Base: uintptr(b.blk.ptr), Size: b.blk.size, ID: b.blk.id}
}

func (b *cudaBuffer) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, b.n); err != nil {
		return nil, err
	}
	return &deviceView{parent: b, off: off, n: n}, nil
}

func (b *cudaBuffer) isFreed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.freed
}

// Free returns the block to the allocator's cache.
func (b *cudaBuffer) Free() error {
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return ErrFreed
	}
	b.freed = true
	b.mu.Unlock()
	return b.a.put(b.blk)
}

// deviceBuffer is what copies and kernels need from a buffer in device
// memory owned by this package.
type deviceBuffer interface {
	Buffer
	isFreed() bool
}

// deviceView is a non-owning view of a device buffer.
type deviceView struct {
	parent deviceBuffer
	off, n int
}

func (v *deviceView) Device() Device         { return v.parent.Device() }
func (v *deviceView) Len() int               { return v.n }
func (v *deviceView) Host() []byte           { return nil }
func (v *deviceView) Ptr() uintptr           { return v.parent.Ptr() + uintptr(v.off) }
func (v *deviceView) Allocation() Allocation { return v.parent.Allocation() }
func (v *deviceView) isFreed() bool          { return v.parent.isFreed() }
func (v *deviceView) Free() error            { return nil }
func (v *deviceView) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, v.n); err != nil {
		return nil, err
	}
	return &deviceView{parent: v.parent, off: v.off + off, n: n}, nil
}

// WrapCUDA wraps device memory this package did not allocate (for example a
// CUDA IPC mapping) as a Buffer of n bytes at ptr on dev, without copying.
// Its Allocation is the wrapped range with a new ID. Free calls release
// (which may be nil) once and tells OnFree subscribers.
func WrapCUDA(dev Device, ptr uintptr, n int, release func() error) (Buffer, error) {
	if dev.Kind != KindCUDA {
		return nil, fmt.Errorf("memory: WrapCUDA on %s: not a CUDA device", dev)
	}
	if n < 0 || (ptr == 0 && n > 0) {
		return nil, fmt.Errorf("memory: WrapCUDA: bad range %#x+%d", ptr, n)
	}
	return &wrappedCUDA{alloc: Allocation{Device: dev, Base: ptr, Size: n, ID: NextAllocationID()}, release: release}, nil
}

type wrappedCUDA struct {
	alloc   Allocation
	release func() error

	mu    sync.Mutex
	freed bool
}

func (w *wrappedCUDA) Device() Device         { return w.alloc.Device }
func (w *wrappedCUDA) Len() int               { return w.alloc.Size }
func (w *wrappedCUDA) Host() []byte           { return nil }
func (w *wrappedCUDA) Ptr() uintptr           { return w.alloc.Base }
func (w *wrappedCUDA) Allocation() Allocation { return w.alloc }
func (w *wrappedCUDA) isFreed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.freed
}
func (w *wrappedCUDA) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, w.alloc.Size); err != nil {
		return nil, err
	}
	return &deviceView{parent: w, off: off, n: n}, nil
}
func (w *wrappedCUDA) Free() error {
	w.mu.Lock()
	if w.freed {
		w.mu.Unlock()
		return ErrFreed
	}
	w.freed = true
	w.mu.Unlock()
	notifyFree(w.alloc)
	if w.release != nil {
		return w.release()
	}
	return nil
}
