package memory

import (
	"sync"
	"unsafe"
)

// Host buffers of at least hostCacheMin bytes made by NewHostBufferUninit
// go back to a cache when freed, up to hostCacheBudget bytes, so that a
// node receiving tensors of the same sizes again and again reuses memory
// whose pages are already faulted in (first-touch page faults cost about a
// second per GiB on a VM) instead of asking the OS again.
const (
	hostCacheMin    = 1 << 20
	hostCacheBudget = 2 << 30
)

type hostCache struct {
	mu    sync.Mutex
	free  map[int][][]byte // exact raw length → raw slices
	bytes int
	hits  uint64
}

var hcache = &hostCache{free: map[int][][]byte{}}

// HostCacheStats reports the cached bytes and how many allocations the
// cache served.
func HostCacheStats() (cachedBytes int, hits uint64) {
	hcache.mu.Lock()
	defer hcache.mu.Unlock()
	return hcache.bytes, hcache.hits
}

func (c *hostCache) get(n int) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.free[n]
	if len(l) == 0 {
		return nil
	}
	raw := l[len(l)-1]
	l[len(l)-1] = nil
	c.free[n] = l[:len(l)-1]
	c.bytes -= len(raw)
	c.hits++
	return raw
}

func (c *hostCache) put(raw []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes+len(raw) > hostCacheBudget {
		return // let the GC have it
	}
	c.free[len(raw)] = append(c.free[len(raw)], raw)
	c.bytes += len(raw)
}

// NewHostBufferUninit is NewHostBuffer without the promise of zeroed
// memory: buffers of 1 MiB or more may reuse memory freed earlier. It is
// meant for destinations that are overwritten whole (received tensors).
func NewHostBufferUninit(n int) (Buffer, error) {
	if n < hostCacheMin {
		return NewHostBuffer(n)
	}
	raw := hcache.get(n + HostAlign)
	if raw == nil {
		b, err := NewHostBuffer(n)
		if err != nil {
			return nil, err
		}
		b.(*hostBuffer).cached = true
		return b, nil
	}
	off := 0
	if r := uintptr(unsafe.Pointer(&raw[0])) % HostAlign; r != 0 {
		off = HostAlign - int(r)
	}
	h := &hostBuffer{raw: raw, b: raw[off : off+n : off+n], cached: true}
	h.alloc = Allocation{Device: CPU, Base: h.Ptr(), Size: n, ID: NextAllocationID()}
	return h, nil
}
