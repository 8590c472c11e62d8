package memory

import (
	"container/list"
	"errors"
	"expvar"
	"fmt"
	"slices"
	"sync"
)

// Registration is the result of registering one allocation with some
// backend (host pinning, an RDMA memory region, a CUDA IPC mapping).
type Registration interface {
	// Allocation is what was registered.
	Allocation() Allocation
}

// Registrar registers and unregisters whole allocations; a RegCache calls it
// and decides when. Register may be slow (that is why the cache exists) and
// is called without the cache's lock held; both may be called concurrently
// for different allocations. peer is the peer of RegCache.Get ("" when the
// registration is not per peer).
type Registrar interface {
	Register(a Allocation, peer string) (Registration, error)
	Unregister(r Registration) error
}

// RegBudget bounds what a RegCache keeps registered. Zero fields are
// unlimited. The budget is a target: registrations in use are never evicted,
// so the cache exceeds it while more than the budget is in use at once.
type RegBudget struct {
	Bytes int64 // registered bytes (pinned memory, BAR1 space)
	Count int   // registrations (memory regions, mappings)
}

// RegStats are a RegCache's counters.
type RegStats struct {
	Hits             int64 // Get served by an existing (or pending) registration
	Misses           int64 // Get that registered
	Evictions        int64 // idle registrations unregistered to fit the budget
	Invalidations    int64 // registrations dropped by Invalidate, DropPeer or Close
	RegisterErrors   int64
	UnregisterErrors int64
	Registered       int64 // registrations held now (in use or idle)
	Bytes            int64 // bytes registered now
	InUse            int64 // registrations with outstanding Get references
}

// ErrCacheClosed is returned by Get after Close.
var ErrCacheClosed = errors.New("memory: registration cache closed")

type regKey struct {
	id   uint64
	peer string
}

type regEntry struct {
	key   regKey
	alloc Allocation
	reg   Registration
	err   error
	ready chan struct{} // closed once Register returned

	refs   int           // outstanding Get references
	elem   *list.Element // position in the idle list when refs == 0
	doomed bool          // out of the maps: unregister at the last release
	gone   chan struct{} // closed once unregistered
}

// RegCache keeps registrations of whole allocations alive across transfers
// (lazy unpinning): the first Get of an allocation registers it, later Gets
// reuse it, releasing a reference keeps it registered, and idle
// registrations are unregistered least recently used first when the budget
// is exceeded. It subscribes to OnFree so a freed allocation's registration
// goes away with it. Keys are (Allocation.ID, peer): peer is "" for
// registrations that serve everyone and a peer name for per-peer ones (RDMA
// protection domains, IPC mappings of one remote process); DropPeer drops a
// dead peer's. A RegCache is safe for concurrent use.
//
// Counters are published with expvar as "tensorferry.regcache.<name>"
// (summed over live caches of the same name).
type RegCache struct {
	name   string
	r      Registrar
	budget RegBudget
	unsub  func()

	mu      sync.Mutex
	closed  bool
	entries map[regKey]*regEntry
	byID    map[uint64]map[string]*regEntry
	idle    *list.List           // entries with refs == 0, least recently released first
	leaving map[regKey]*regEntry // being unregistered: a new Get waits for it
	stats   RegStats
}

// NewRegCache returns an empty cache that registers through r.
func NewRegCache(name string, r Registrar, budget RegBudget) *RegCache {
	c := &RegCache{
		name:    name,
		r:       r,
		budget:  budget,
		entries: map[regKey]*regEntry{},
		byID:    map[uint64]map[string]*regEntry{},
		idle:    list.New(),
		leaving: map[regKey]*regEntry{},
	}
	c.unsub = OnFree(func(a Allocation) { _ = c.Invalidate(a.ID) })
	publishRegCache(c)
	return c
}

// Name returns the cache's name.
func (c *RegCache) Name() string { return c.name }

// Get returns the registration of a for peer (peer "" when not per peer),
// registering it on first use, and a release function to call, once, when
// the caller no longer needs it (more calls do nothing). Concurrent Gets of
// an allocation being registered wait for that registration. It returns
// ErrCacheClosed after Close, or the Registrar's error (which is not cached).
func (c *RegCache) Get(a Allocation, peer string) (Registration, func(), error) {
	k := regKey{a.ID, peer}
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return nil, nil, ErrCacheClosed
		}
		l, ok := c.leaving[k]
		if !ok {
			break
		}
		// An unregistration of the same key is under way: registering again
		// before it ends could fail (memory already registered).
		c.mu.Unlock()
		<-l.gone
		c.mu.Lock()
	}
	if e, ok := c.entries[k]; ok {
		c.acquireLocked(e)
		c.stats.Hits++
		c.mu.Unlock()
		<-e.ready
		if e.err != nil {
			c.release(e)
			return nil, nil, e.err
		}
		return e.reg, c.releaser(e), nil
	}
	e := &regEntry{key: k, alloc: a, ready: make(chan struct{})}
	c.acquireLocked(e)
	c.entries[k] = e
	if c.byID[a.ID] == nil {
		c.byID[a.ID] = map[string]*regEntry{}
	}
	c.byID[a.ID][peer] = e
	c.stats.Misses++
	c.mu.Unlock()

	reg, err := c.r.Register(a, peer)

	c.mu.Lock()
	e.reg, e.err = reg, err
	if err != nil {
		e.err = fmt.Errorf("memory: regcache %s: register %s allocation %d (%d bytes): %w", c.name, a.Device, a.ID, a.Size, err)
		c.stats.RegisterErrors++
		if !e.doomed {
			c.removeLocked(e)
		}
		e.doomed = true // nothing to unregister
		if e.gone != nil {
			if c.leaving[k] == e {
				delete(c.leaving, k)
			}
			close(e.gone)
		}
		close(e.ready)
		c.mu.Unlock()
		c.release(e)
		return nil, nil, e.err
	}
	c.stats.Registered++
	c.stats.Bytes += int64(a.Size)
	close(e.ready)
	evict := c.evictLocked()
	c.mu.Unlock()
	c.unregister(evict)
	return reg, c.releaser(e), nil
}

func (c *RegCache) acquireLocked(e *regEntry) {
	if e.refs == 0 {
		c.stats.InUse++
	}
	e.refs++
	if e.elem != nil {
		c.idle.Remove(e.elem)
		e.elem = nil
	}
}

func (c *RegCache) releaser(e *regEntry) func() {
	var once sync.Once
	return func() { once.Do(func() { c.release(e) }) }
}

// release drops one reference of e.
func (c *RegCache) release(e *regEntry) {
	c.mu.Lock()
	e.refs--
	if e.refs > 0 {
		c.mu.Unlock()
		return
	}
	c.stats.InUse--
	var evict []*regEntry
	switch {
	case e.doomed && e.err == nil:
		c.dropLocked(e)
		evict = []*regEntry{e}
	case e.doomed:
	default:
		e.elem = c.idle.PushBack(e)
		evict = c.evictLocked()
	}
	c.mu.Unlock()
	c.unregister(evict)
}

// removeLocked takes e out of the lookup maps.
func (c *RegCache) removeLocked(e *regEntry) {
	delete(c.entries, e.key)
	if m := c.byID[e.key.id]; m != nil {
		delete(m, e.key.peer)
		if len(m) == 0 {
			delete(c.byID, e.key.id)
		}
	}
}

// dropLocked accounts for a registered entry about to be unregistered.
func (c *RegCache) dropLocked(e *regEntry) {
	if e.elem != nil {
		c.idle.Remove(e.elem)
		e.elem = nil
	}
	c.leavingLocked(e)
	c.stats.Registered--
	c.stats.Bytes -= int64(e.alloc.Size)
}

func (c *RegCache) overLocked() bool {
	return (c.budget.Bytes > 0 && c.stats.Bytes > c.budget.Bytes) ||
		(c.budget.Count > 0 && c.stats.Registered > int64(c.budget.Count))
}

// evictLocked picks idle entries, least recently released first, until the
// cache fits its budget.
func (c *RegCache) evictLocked() []*regEntry {
	var evict []*regEntry
	for c.overLocked() && c.idle.Len() > 0 {
		e := c.idle.Front().Value.(*regEntry)
		c.removeLocked(e)
		c.dropLocked(e)
		c.stats.Evictions++
		evict = append(evict, e)
	}
	return evict
}

// leavingLocked makes Gets of e's key wait until e is unregistered.
func (c *RegCache) leavingLocked(e *regEntry) {
	if e.gone == nil {
		e.gone = make(chan struct{})
	}
	c.leaving[e.key] = e
}

// doomLocked takes e out of the cache: it is unregistered now when idle
// (returned) or at its last release.
func (c *RegCache) doomLocked(e *regEntry) *regEntry {
	c.removeLocked(e)
	c.leavingLocked(e)
	e.doomed = true
	c.stats.Invalidations++
	if e.refs > 0 {
		return nil
	}
	c.dropLocked(e)
	return e
}

func (c *RegCache) unregister(es []*regEntry) error {
	var errs []error
	for _, e := range es {
		err := c.r.Unregister(e.reg)
		c.mu.Lock()
		if err != nil {
			errs = append(errs, fmt.Errorf("memory: regcache %s: unregister allocation %d: %w", c.name, e.alloc.ID, err))
			c.stats.UnregisterErrors++
		}
		if c.leaving[e.key] == e {
			delete(c.leaving, e.key)
		}
		close(e.gone)
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Invalidate drops every registration of the allocation (all peers), for
// example because it was freed: idle ones are unregistered now, ones in use
// at their last release. Until then a Get of the same allocation waits (it
// must not register the memory twice), so a caller must not Get an
// allocation it invalidated while itself holding a reference to it.
func (c *RegCache) Invalidate(allocID uint64) error {
	c.mu.Lock()
	var drop []*regEntry
	for _, e := range c.byID[allocID] {
		if d := c.doomLocked(e); d != nil {
			drop = append(drop, d)
		}
	}
	c.mu.Unlock()
	return c.unregister(drop)
}

// DropPeer drops every registration made for peer, as Invalidate does. It
// returns once the idle ones are unregistered, including those another
// goroutine was unregistering at the time (an allocation freed
// concurrently), so the caller may then tear down what they were registered
// with (an RDMA protection domain). Registrations still in use are
// unregistered at their last release.
func (c *RegCache) DropPeer(peer string) error {
	c.mu.Lock()
	var drop []*regEntry
	for k, e := range c.entries {
		if k.peer == peer {
			if d := c.doomLocked(e); d != nil {
				drop = append(drop, d)
			}
		}
	}
	var wait []chan struct{}
	for k, e := range c.leaving {
		if k.peer == peer && e.refs == 0 && !slices.Contains(drop, e) {
			wait = append(wait, e.gone)
		}
	}
	c.mu.Unlock()
	err := c.unregister(drop)
	for _, g := range wait {
		<-g
	}
	return err
}

// Close drops every registration (ones in use at their last release) and
// makes later Gets fail with ErrCacheClosed.
func (c *RegCache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var drop []*regEntry
	for _, e := range c.entries {
		if d := c.doomLocked(e); d != nil {
			drop = append(drop, d)
		}
	}
	c.mu.Unlock()
	c.unsub()
	unpublishRegCache(c)
	return c.unregister(drop)
}

// Stats returns the cache's counters.
func (c *RegCache) Stats() RegStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

var regVars struct {
	mu     sync.Mutex
	caches map[string]map[*RegCache]struct{}
}

// publishRegCache adds c to the expvar "tensorferry.regcache.<name>",
// publishing the variable the first time the name is seen.
func publishRegCache(c *RegCache) {
	regVars.mu.Lock()
	defer regVars.mu.Unlock()
	if regVars.caches == nil {
		regVars.caches = map[string]map[*RegCache]struct{}{}
	}
	set, ok := regVars.caches[c.name]
	if !ok {
		set = map[*RegCache]struct{}{}
		regVars.caches[c.name] = set
		name := c.name
		varName := "tensorferry.regcache." + name
		if expvar.Get(varName) == nil {
			expvar.Publish(varName, expvar.Func(func() any { return RegCacheStats(name) }))
		}
	}
	set[c] = struct{}{}
}

func unpublishRegCache(c *RegCache) {
	regVars.mu.Lock()
	defer regVars.mu.Unlock()
	delete(regVars.caches[c.name], c)
}

// RegCacheStats returns the counters of every open RegCache called name,
// summed (the value published with expvar).
func RegCacheStats(name string) RegStats {
	regVars.mu.Lock()
	caches := make([]*RegCache, 0, len(regVars.caches[name]))
	for c := range regVars.caches[name] {
		caches = append(caches, c)
	}
	regVars.mu.Unlock()
	var sum RegStats
	for _, c := range caches {
		s := c.Stats()
		sum.Hits += s.Hits
		sum.Misses += s.Misses
		sum.Evictions += s.Evictions
		sum.Invalidations += s.Invalidations
		sum.RegisterErrors += s.RegisterErrors
		sum.UnregisterErrors += s.UnregisterErrors
		sum.Registered += s.Registered
		sum.Bytes += s.Bytes
		sum.InUse += s.InUse
	}
	return sum
}
