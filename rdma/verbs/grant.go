package verbs

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/zap"
)

// GrantMode is how an owner grants a peer remote read access to an export.
type GrantMode uint8

const (
	// GrantAuto (the default) uses memory windows where the device has
	// type-2 windows and confines reads to them (ibverbs.ProbeWindows, run
	// once per device and port), else per-export registration.
	GrantAuto GrantMode = iota
	// GrantWindows registers each allocation once per peer protection
	// domain (memory.RegCache "verbs-owner", for binding windows only) and
	// grants each export through a type-2 memory window bound to exactly its
	// range on the peer's queue pair, invalidated (IBV_WR_LOCAL_INV) when
	// the export ends: a pin per allocation instead of one per transfer. It
	// falls back to per-export registration where the device has no type-2
	// windows, but does not probe their bounds.
	GrantWindows
	// GrantRegister registers each export's bytes in the peer's protection
	// domain with remote read access and deregisters them when it ends.
	GrantRegister
)

func (m GrantMode) String() string {
	switch m {
	case GrantAuto:
		return "auto"
	case GrantWindows:
		return "memory windows"
	case GrantRegister:
		return "per-export registration"
	}
	return fmt.Sprintf("GrantMode(%d)", uint8(m))
}

// windowTimeout bounds the wait for a bind or an invalidation to complete.
const windowTimeout = 5 * time.Second

// maxFreeWindows bounds the invalidated windows a peer keeps for reuse.
const maxFreeWindows = 64

// probes remembers ProbeWindows's verdict per device and port.
var probes sync.Map // "device/port" -> error (nil when windows are enforced)

// chooseGrants decides the channel's grant mode on ctx's port: the mode and
// why, for logs and `ferry topo`.
func chooseGrants(ctx *ibverbs.Context, port ibverbs.PortInfo, want GrantMode) (GrantMode, string) {
	if want == GrantRegister {
		return GrantRegister, "configured"
	}
	attr, err := ctx.QueryDevice()
	if err != nil {
		return GrantRegister, fmt.Sprintf("querying %s: %v", ctx.Name(), err)
	}
	if !attr.MemoryWindowType2() {
		return GrantRegister, fmt.Sprintf("%s has no type-2 memory windows (device_cap_flags %#x)", ctx.Name(), uint32(attr.CapFlags))
	}
	if want == GrantWindows {
		return GrantWindows, fmt.Sprintf("configured; %s has type-2 memory windows (bounds not probed)", ctx.Name())
	}
	key := fmt.Sprintf("%s/%d", ctx.Name(), port.Num)
	v, ok := probes.Load(key)
	if !ok {
		v, _ = probes.LoadOrStore(key, probeErr{ibverbs.ProbeWindows(ctx, port)})
	}
	if err := v.(probeErr).err; err != nil {
		return GrantRegister, fmt.Sprintf("memory windows unusable: %v", err)
	}
	return GrantWindows, fmt.Sprintf("%s confines reads to type-2 memory windows (probed)", ctx.Name())
}

type probeErr struct{ err error }

// Grants returns how this channel grants exports to peers (GrantWindows or
// GrantRegister) and why, as `ferry topo` shows it.
func (c *Channel) Grants() (GrantMode, string) { return c.grants, c.grantWhy }

// GrantsOf opens the device cfg selects, decides the grant mode a channel
// with cfg would run (probing windows where GrantAuto needs it) and closes
// it: for tools that report it without running a channel. Without a usable
// device it returns an error wrapping rdma.ErrNotViable.
func GrantsOf(cfg Config) (GrantMode, string, error) {
	var plan nicPlan
	if cfg.Device == "" {
		plan = planNICs(cfg.GPU, "/")
	}
	name, port, _, err := pickPort(cfg, plan)
	if err != nil {
		return GrantRegister, "", err
	}
	ctx, err := ibverbs.Open(name)
	if err != nil {
		return GrantRegister, "", err
	}
	defer ctx.Close()
	m, why := chooseGrants(ctx, port, cfg.Grants)
	return m, why, nil
}

// pdRegistrar registers whole allocations in the protection domain named by
// the cache's peer string (a connection key of the fetcher, or an owner
// peer's key), with the given access.
type pdRegistrar struct {
	c      *Channel
	access ibverbs.Access
}

// Register registers a in the protection domain of key.
func (r pdRegistrar) Register(a memory.Allocation, key string) (memory.Registration, error) {
	r.c.mu.Lock()
	pd := r.c.destPDs[key]
	r.c.mu.Unlock()
	if pd == nil {
		return nil, fmt.Errorf("verbs: no protection domain for %s: %w", key, errCacheClosed)
	}
	mr, err := regBuffer(pd, allocationBuffer{a}, 0, a.Size, r.access)
	if err != nil {
		return nil, fmt.Errorf("verbs: registering an allocation: %w", err)
	}
	return &destReg{alloc: a, mr: mr}, nil
}

// Unregister deregisters a registration made by Register.
func (r pdRegistrar) Unregister(reg memory.Registration) error {
	d, ok := reg.(*destReg)
	if !ok {
		return fmt.Errorf("verbs: foreign registration %T", reg)
	}
	if err := d.mr.Close(); err != nil {
		return fmt.Errorf("verbs: deregistering an allocation: %w", err)
	}
	return nil
}

// ownerCache returns the cache of owner registrations of memory on dev
// (host kinds share one), creating it with Config.OwnerBudget, whose zero
// fields get memory.PinBudget(dev) and Config.CacheEntries.
func (c *Channel) ownerCache(dev memory.Device) *memory.RegCache {
	if dev.IsHost() {
		dev = memory.CPU
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if rc := c.owned[dev]; rc != nil {
		return rc
	}
	b := c.cfg.OwnerBudget
	if b.Bytes <= 0 {
		pb, err := memory.PinBudget(dev)
		if err != nil {
			c.log.Debug("no pin budget: owner registrations bounded by count", zap.Stringer("device", dev), zap.Error(err))
		}
		b.Bytes = pb.Bytes
	}
	if b.Count <= 0 {
		b.Count = c.cfg.CacheEntries
	}
	rc := memory.NewRegCache("verbs-owner", pdRegistrar{c: c, access: ibverbs.AccessMWBind}, b)
	c.owned[dev] = rc
	return rc
}

// ownerCaches returns the owner registration caches made so far.
func (c *Channel) ownerCaches() []*memory.RegCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*memory.RegCache, 0, len(c.owned))
	for _, rc := range c.owned {
		out = append(out, rc)
	}
	return out
}

// maxWindow is the largest window the channel binds: mlx5 binds at most
// 2 GiB; a larger export is registered on its own.
const maxWindow = 1 << 31

// windowed reports whether an export of buf is granted through a window:
// the channel runs windows, buf's allocation can be registered whole and
// buf fits in one window.
func (c *Channel) windowed(buf memory.Buffer) bool {
	if c.grants != GrantWindows || buf.Len() == 0 || buf.Len() > maxWindow || !cacheable(buf) {
		return false
	}
	_, refused := c.noWindows.Load(buf.Device().Kind)
	return !refused
}

// refuseWindows makes exports of dev's kind of memory registered per export
// from now on, after a window over such memory could not be bound.
func (c *Channel) refuseWindows(dev memory.Device, err error) {
	if _, had := c.noWindows.LoadOrStore(dev.Kind, err.Error()); !had {
		c.log.Warn("memory windows refused: exports of this memory registered per export from now on",
			zap.Stringer("device", dev), zap.Error(err))
	}
}

// grant is one export granted to the peer through a memory window over its
// allocation's cached registration.
type grant struct {
	id     uint64
	addr   uint64
	n      int
	mr     *ibverbs.MR
	put    func() // releases the cached registration
	mw     *ibverbs.MW
	rkey   uint32
	qp     *ibverbs.QP // the queue pair mw is bound through; nil when unbound
	active int         // reads in progress
	ended  bool        // the export ended: revoke when no read is in progress
}

// grantExport makes the grant of export id (buf) for the peer, registering
// buf's allocation in the peer's protection domain through the owner cache
// unless it is registered already. The window is bound at the first read.
func (op *ownerPeer) grantExport(id uint64, buf memory.Buffer) error {
	op.mu.Lock()
	closed, have := op.closed, op.grants[id] != nil
	op.mu.Unlock()
	if closed {
		return errCacheClosed
	}
	if have {
		return nil
	}
	reg, put, err := op.c.ownerCache(buf.Device()).Get(buf.Allocation(), op.key)
	if err != nil {
		return err
	}
	d, ok := reg.(*destReg)
	if !ok {
		put()
		return fmt.Errorf("verbs: foreign registration %T", reg)
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed || op.grants[id] != nil {
		put()
		if op.closed {
			return errCacheClosed
		}
		return nil
	}
	op.grants[id] = &grant{id: id, addr: uint64(buf.Ptr()), n: buf.Len(), mr: d.mr, put: put}
	return nil
}

// nextWRID returns a work request id for the peer's queue pair. op.mu held.
func (op *ownerPeer) nextWRID() uint64 {
	op.wrid++
	return op.wrid
}

// bind binds g's window on the peer's current queue pair, unless it is
// bound there already. op.mu must be held.
func (op *ownerPeer) bind(g *grant) error {
	if g.mw != nil && g.qp == op.qp {
		return nil
	}
	if op.qp == nil {
		return fmt.Errorf("verbs: %s has no queue pair to bind a window through", op.node)
	}
	op.unbind(g)
	var mw *ibverbs.MW
	if n := len(op.freeMWs); n > 0 {
		mw, op.freeMWs = op.freeMWs[n-1], op.freeMWs[:n-1]
	} else {
		var err error
		if mw, err = op.pd.AllocMW(); err != nil {
			return err
		}
	}
	wrid := op.nextWRID()
	rkey, err := op.qp.BindMW(wrid, mw, g.mr, g.addr, g.n, ibverbs.AccessRemoteRead)
	if err == nil {
		err = op.await(wrid)
	}
	if err != nil {
		op.closeMW(mw)
		return fmt.Errorf("verbs: binding a memory window for %s: %w", op.node, err)
	}
	g.mw, g.rkey, g.qp = mw, rkey, op.qp
	op.c.stats.winBind.Add(1)
	return nil
}

// await waits for the completion of work request wrid on the peer's CQ.
func (op *ownerPeer) await(wrid uint64) error {
	wc, err := op.cq.Await(wrid, windowTimeout)
	if err != nil {
		return err
	}
	return wc.Err()
}

// unbind takes g's window away: invalidated through the queue pair it was
// bound through (and kept for reuse) when that is the current one, else
// deallocated. op.mu must be held.
func (op *ownerPeer) unbind(g *grant) {
	mw := g.mw
	if mw == nil {
		return
	}
	g.mw, g.qp = nil, nil
	if op.qp != nil && len(op.freeMWs) < maxFreeWindows {
		wrid := op.nextWRID()
		err := op.qp.LocalInvalidate(wrid, g.rkey)
		if err == nil {
			err = op.await(wrid)
		}
		if err == nil {
			op.c.stats.winInval.Add(1)
			op.freeMWs = append(op.freeMWs, mw)
			return
		}
		op.c.log.Debug("invalidating a memory window", zap.String("peer", op.node), zap.Error(err))
	}
	op.closeMW(mw)
}

// closeMW deallocates a window (which invalidates it).
func (op *ownerPeer) closeMW(mw *ibverbs.MW) {
	if err := mw.Close(); err != nil && !errors.Is(err, ibverbs.ErrClosed) {
		op.c.log.Warn("deallocating a memory window", zap.String("peer", op.node), zap.Error(err))
	}
	op.c.stats.winInval.Add(1)
}

// revoke ends g: its window is invalidated, then its registration released
// (it stays cached). op.mu must be held.
func (op *ownerPeer) revoke(g *grant) {
	if op.grants[g.id] == g {
		delete(op.grants, g.id)
	}
	op.unbind(g)
	g.put()
}

// dropWindows deallocates every window bound through the queue pair about
// to be replaced or destroyed (it cannot invalidate them any more). op.mu
// must be held.
func (op *ownerPeer) dropWindows() {
	for _, g := range op.grants {
		if g.mw != nil {
			mw := g.mw
			g.mw, g.qp = nil, nil
			op.closeMW(mw)
		}
	}
}
