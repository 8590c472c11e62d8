package verbs

import (
	"container/list"
	"sync"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/zap"
)

// destReg is a destination allocation registered for local writes.
type destReg struct {
	alloc uint64
	base  uintptr
	size  int
	mr    *ibverbs.MR
	users int  // transfers using it now
	dead  bool // freed or evicted while in use: deregister when unused
	elem  *list.Element
}

// regCache keeps the destination registrations of one fetch peer, whole
// allocations keyed by allocation id, after their transfer (lazy
// deregistration), evicting the least recently used beyond a budget.
type regCache struct {
	c  *Channel
	pd *ibverbs.PD

	mu     sync.Mutex
	closed bool
	byID   map[uint64]*destReg
	lru    *list.List // front: most recent; idle entries only
	bytes  int64
}

func newRegCache(c *Channel, pd *ibverbs.PD) *regCache {
	return &regCache{c: c, pd: pd, byID: map[uint64]*destReg{}, lru: list.New()}
}

// get returns dst's allocation registered for local writes and a function
// that gives it back.
func (rc *regCache) get(dst memory.Buffer) (*destReg, func(), error) {
	a := dst.Allocation()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		return nil, nil, errCacheClosed
	}
	r := rc.byID[a.ID]
	if r != nil && (r.dead || r.base != a.Base || r.size != a.Size) {
		r = nil
	}
	if r != nil {
		rc.c.stats.fetchHit.Add(1)
	} else {
		whole, ok := wholeAllocation(dst)
		var mr *ibverbs.MR
		var err error
		if ok {
			mr, err = regBuffer(rc.pd, whole, 0, whole.Len(), ibverbs.AccessLocalWrite)
		} else {
			mr, err = regBuffer(rc.pd, dst, 0, dst.Len(), ibverbs.AccessLocalWrite)
			a = memory.Allocation{Device: dst.Device(), Base: dst.Ptr(), Size: dst.Len(), ID: a.ID}
		}
		if err != nil {
			return nil, nil, err
		}
		rc.c.stats.fetchReg.Add(1)
		if old := rc.byID[a.ID]; old != nil {
			rc.retire(old)
		}
		r = &destReg{alloc: a.ID, base: a.Base, size: a.Size, mr: mr}
		rc.byID[a.ID] = r
		rc.bytes += int64(a.Size)
	}
	if r.elem != nil {
		rc.lru.Remove(r.elem)
		r.elem = nil
	}
	r.users++
	var once sync.Once
	return r, func() { once.Do(func() { rc.put(r) }) }, nil
}

func (rc *regCache) put(r *destReg) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	r.users--
	if r.users > 0 {
		return
	}
	if r.dead || rc.closed {
		rc.dereg(r)
		return
	}
	r.elem = rc.lru.PushFront(r)
	rc.evict()
}

// evict deregisters idle entries beyond the budget. rc.mu must be held.
func (rc *regCache) evict() {
	for (rc.bytes > rc.c.cfg.CacheBytes || len(rc.byID) > rc.c.cfg.CacheEntries) && rc.lru.Len() > 0 {
		r := rc.lru.Remove(rc.lru.Back()).(*destReg)
		r.elem = nil
		rc.retire(r)
		rc.c.stats.fetchEvict.Add(1)
	}
}

// retire removes r from the table and deregisters it now or, when in use,
// after its last user. rc.mu must be held.
func (rc *regCache) retire(r *destReg) {
	if rc.byID[r.alloc] == r {
		delete(rc.byID, r.alloc)
		rc.bytes -= int64(r.size)
	}
	if r.elem != nil {
		rc.lru.Remove(r.elem)
		r.elem = nil
	}
	r.dead = true
	if r.users == 0 {
		rc.dereg(r)
	}
}

func (rc *regCache) dereg(r *destReg) {
	if r.mr == nil {
		return
	}
	if err := r.mr.Close(); err != nil {
		rc.c.log.Warn("deregistering a destination", zap.Error(err))
	}
	r.mr = nil
}

// drop forgets a freed allocation.
func (rc *regCache) drop(alloc uint64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r := rc.byID[alloc]; r != nil {
		rc.retire(r)
		rc.c.stats.fetchEvict.Add(1)
	}
}

// close deregisters every idle entry; entries in use go with their last
// user.
func (rc *regCache) close() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.closed = true
	for _, r := range rc.byID {
		rc.retire(r)
	}
}

// wholeAllocation returns a buffer spanning dst's whole allocation when dst
// is host memory that can be addressed from its allocation base.
func wholeAllocation(dst memory.Buffer) (memory.Buffer, bool) {
	a := dst.Allocation()
	if a.Size <= 0 || a.Base == 0 || dst.Ptr() < a.Base || dst.Ptr()+uintptr(dst.Len()) > a.Base+uintptr(a.Size) {
		return nil, false
	}
	off := int(dst.Ptr() - a.Base)
	if off == 0 && dst.Len() == a.Size {
		return dst, true
	}
	if !dst.Device().IsHost() {
		// Device views cannot be widened without their parent buffer.
		return nil, false
	}
	return wholeHost{dst: dst, a: a}, true
}

// wholeHost presents a host allocation as a buffer for registration only.
type wholeHost struct {
	dst memory.Buffer
	a   memory.Allocation
}

func (w wholeHost) Device() memory.Device                 { return w.dst.Device() }
func (w wholeHost) Len() int                              { return w.a.Size }
func (w wholeHost) Host() []byte                          { return nil }
func (w wholeHost) Ptr() uintptr                          { return w.a.Base }
func (w wholeHost) Allocation() memory.Allocation         { return w.a }
func (w wholeHost) Slice(int, int) (memory.Buffer, error) { return nil, memory.ErrNotSupported }
func (w wholeHost) Free() error                           { return nil }
