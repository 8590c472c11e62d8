package memory

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// HostAlign is the alignment of host allocations in bytes: a cache line and
// enough for every dtype and for vector loads.
const HostAlign = 64

var allocationIDs atomic.Uint64

// NextAllocationID returns a process-unique allocation id. Backends call it
// once per allocation.
func NextAllocationID() uint64 { return allocationIDs.Add(1) }

// HostAllocator allocates ordinary host memory aligned to HostAlign bytes.
type HostAllocator struct{}

// Device returns CPU.
func (HostAllocator) Device() Device { return CPU }

// Alloc returns n bytes of zeroed, HostAlign-aligned host memory.
func (HostAllocator) Alloc(n int) (Buffer, error) { return NewHostBuffer(n) }

// ErrTooLarge is returned for an allocation larger than the host's memory.
var ErrTooLarge = errors.New("memory: allocation larger than this host's memory")

// hostMemory returns the host's physical memory in bytes (MemTotal), or a
// large value when it cannot be read.
var hostMemory = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && kb > 0 {
					return kb << 10
				}
			}
		}
	}
	return 1 << 46
})

// NewHostBuffer allocates n bytes of zeroed host memory aligned to HostAlign.
// A size beyond the host's physical memory fails with ErrTooLarge instead of
// crashing the process (sizes can come from the wire).
func NewHostBuffer(n int) (Buffer, error) {
	if n < 0 {
		return nil, CheckRange(0, n, 0)
	}
	if int64(n) > hostMemory() {
		return nil, fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, n, hostMemory())
	}
	raw := make([]byte, n+HostAlign)
	off := 0
	if n > 0 || len(raw) > 0 {
		if r := uintptr(unsafe.Pointer(&raw[0])) % HostAlign; r != 0 {
			off = HostAlign - int(r)
		}
	}
	b := raw[off : off+n : off+n]
	h := &hostBuffer{raw: raw, b: b}
	h.alloc = Allocation{Device: CPU, Base: h.Ptr(), Size: n, ID: NextAllocationID()}
	return h, nil
}

// WrapHost wraps an existing byte slice as a host buffer without copying. The
// buffer does not own the slice: Free only marks it freed.
func WrapHost(b []byte) Buffer {
	h := &hostBuffer{b: b}
	h.alloc = Allocation{Device: CPU, Base: h.Ptr(), Size: len(b), ID: NextAllocationID()}
	return h
}

type hostBuffer struct {
	mu     sync.Mutex
	raw    []byte
	b      []byte
	alloc  Allocation
	freed  bool
	cached bool // raw goes back to the host cache on Free
}

func (h *hostBuffer) Device() Device { return CPU }
func (h *hostBuffer) Len() int       { return len(h.b) }
func (h *hostBuffer) Host() []byte   { return h.b }
func (h *hostBuffer) Ptr() uintptr {
	if cap(h.b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(h.b)))
}
func (h *hostBuffer) Allocation() Allocation { return h.alloc }

func (h *hostBuffer) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, len(h.b)); err != nil {
		return nil, err
	}
	return &hostView{parent: h, b: h.b[off : off+n : off+n]}, nil
}

func (h *hostBuffer) Free() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.freed {
		return ErrFreed
	}
	h.freed = true
	notifyFree(h.alloc)
	if h.cached && h.raw != nil {
		hcache.put(h.raw)
	}
	h.raw, h.b = nil, nil
	return nil
}

type hostView struct {
	parent *hostBuffer
	b      []byte
}

func (v *hostView) Device() Device { return CPU }
func (v *hostView) Len() int       { return len(v.b) }
func (v *hostView) Host() []byte   { return v.b }
func (v *hostView) Ptr() uintptr {
	if cap(v.b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(v.b)))
}
func (v *hostView) Allocation() Allocation { return v.parent.alloc }
func (v *hostView) Slice(off, n int) (Buffer, error) {
	if err := CheckRange(off, n, len(v.b)); err != nil {
		return nil, err
	}
	return &hostView{parent: v.parent, b: v.b[off : off+n : off+n]}, nil
}
func (v *hostView) Free() error { return nil }
