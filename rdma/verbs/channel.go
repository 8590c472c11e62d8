package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

var (
	_ rdma.Channel        = (*Channel)(nil)
	_ rdma.ControlHandler = (*Channel)(nil)
)

// Config tunes the channel: the verbs section of the node's config
// (config.VerbsConfig, whose zero fields take its defaults).
type Config struct {
	config.VerbsConfig
	// GPU is the PCI bus id of the GPU whose nearest NIC the channel uses
	// when Device is "" (as NVML, CUDA or lspci print it): a NIC of the
	// GPU's nearest PCIe/NUMA distance class (internal/pcitopo: PIX, PXB,
	// PHB, NODE, SYS) when one has a usable port, else the nearest usable
	// one farther away. "" means CUDA device 0 of this process when there
	// is one (under CUDA_VISIBLE_DEVICES, the GPU the process was given);
	// without a GPU the first device with a usable port is taken.
	GPU string
	// Connect are the queue pair parameters (timeouts, retries, outstanding
	// reads); NewWithConfig sets them from VerbsConfig's.
	Connect ibverbs.ConnectOptions
	// Rails is the most RDMA devices (NICs) one transfer is split across,
	// each slice on a queue pair of its own between the two nodes' devices
	// of the same rail index: the NICs of the GPU's nearest distance class
	// (rail 0 the one Device or GPU picks), or without a GPU every usable
	// device. Default 0: all of those; 1 with Device set. RailMinBytes is
	// the smallest slice (default 8 MiB): a transfer of n bytes uses
	// min(Rails, n / RailMinBytes) rails, at least one. A slice whose rail
	// fails is read again over the others.
	Rails        int
	RailMinBytes int64
	// Grants is how exports are granted to peers (default GrantAuto:
	// memory windows where the device confines reads to them, else
	// per-export registration); see GrantMode.
	Grants GrantMode
	// OwnerBudget bounds the allocations the owner keeps registered across
	// exports with memory windows (memory.RegCache "verbs-owner", one per
	// memory device, per-peer entries); zero fields get memory.PinBudget of
	// the device (RLIMIT_MEMLOCK for host memory, free BAR1 for a GPU) and
	// CacheEntries. Idle ones are deregistered least recently used first.
	OwnerBudget memory.RegBudget
}

// defaultRailMinBytes is Config.RailMinBytes's default.
const defaultRailMinBytes = 8 << 20

// withConnect returns the Config of v, its queue pair parameters copied
// into Connect.
func withConnect(v config.VerbsConfig) Config {
	return Config{VerbsConfig: v, Connect: ibverbs.ConnectOptions{
		Timeout: v.AckTimeout, RetryCount: v.RetryCount, RNRRetry: v.RNRRetry,
		MaxRdAtomic: v.MaxRdAtomic, MaxDestRdAtomic: v.MaxDestRdAtomic, MinRNRTimer: v.MinRNRTimer,
		HopLimit: v.HopLimit, TrafficClass: v.TrafficClass, ServiceLevel: v.ServiceLevel,
	}}
}

// Stats counts registrations, for tests and `ferry topo`.
type Stats struct {
	// Owner side: regions registered for exports (per export, or per
	// allocation and peer with windows), offers that found their region
	// registered already, regions deregistered (with windows: evicted,
	// dropped with the peer or the freed allocation).
	OwnerRegistrations, OwnerHits, OwnerDeregistrations int64
	// Owner side with windows: windows bound, and windows invalidated or
	// deallocated (export ended, queue pair replaced, peer down).
	WindowBinds, WindowInvalidations int64
	// Fetcher side: destination registrations made, reused, evicted or
	// dropped (LRU, freed allocation, peer down), from the registration
	// cache's counters.
	FetchRegistrations, FetchHits, FetchEvictions int64
	// Connections made to owners (queue pairs connected, one per rail).
	Connections int64
	// RailFailovers counts transfer slices read again over another rail
	// after theirs failed.
	RailFailovers int64
}

// Channel is the verbs channel: both ends of one-sided RDMA READ transfers.
// As an owner it registers exports (Offer) in a protection domain of the
// peer they were lent to and answers that peer's control messages; as a
// fetcher it connects one RC queue pair per owner, lazily, and reads into
// its registered destination. It is safe for concurrent use.
type Channel struct {
	env   *rdma.Env
	log   *zap.Logger
	cfg   Config
	rails []rail // rails[0] is the device of Config.Device or Config.GPU

	mu      sync.Mutex
	closed  bool
	owners  map[railKey]*ownerPeer // peers we lent exports to, by rail
	fetches map[railKey]*fetchPeer // owners we read from, by rail
	bg      sync.WaitGroup         // teardowns and pollers

	// dests caches destination registrations; the peer string of an entry
	// is its connection's key (fetchPeer.destKey), which destPDs maps to the
	// connection's protection domain (and owner keys to theirs).
	dests   *memory.RegCache
	destPDs map[string]*ibverbs.PD // guarded by mu
	destSeq atomic.Uint64

	fetching atomic.Int64
	stats    struct {
		// fetchReg counts destinations registered outside the cache.
		ownerReg, ownerHit, ownerDereg, fetchReg, conns, winBind, winInval, failovers atomic.Int64
	}
	// grants is how exports are granted (GrantWindows or GrantRegister),
	// grantWhy why; owned holds the owner registration caches by memory
	// device (guarded by mu), under the peer keys of ownerPeer.key, which
	// destPDs maps to the peer's protection domain too.
	grants     GrantMode
	grantWhy   string
	noWindows  sync.Map // memory.Kind -> why windows failed over that memory
	owned      map[memory.Device]*memory.RegCache
	ownSeq     atomic.Uint64
	cancelFree func()
}

// Available returns nil when an RDMA device with a usable port exists here,
// else an error wrapping rdma.ErrNotViable with the reason.
func Available() error {
	_, _, _, err := pickPort(Config{}, nicPlan{})
	return err
}

// pickPort returns the first usable port of cfg's device, or of the
// devices in plan's order (nearest the GPU first), with the device's
// distance class from the GPU.
func pickPort(cfg Config, plan nicPlan) (string, ibverbs.PortInfo, pcitopo.Class, error) {
	devs, err := ibverbs.Devices()
	if err != nil {
		return "", ibverbs.PortInfo{}, 0, fmt.Errorf("%w: verbs: %w", rdma.ErrNotViable, err)
	}
	devs, class := plan.order(devs)
	var why []string
	for _, d := range devs {
		if cfg.Device != "" && d.Name != cfg.Device {
			continue
		}
		if d.Err != nil {
			why = append(why, d.Err.Error())
			continue
		}
		for _, p := range d.Ports {
			if cfg.Port != 0 && p.Num != cfg.Port {
				continue
			}
			if p.Usable() {
				return d.Name, p, class[d.Name], nil
			}
			why = append(why, fmt.Sprintf("%s port %d: %s, %s, no usable GID/LID", d.Name, p.Num, p.State, p.LinkLayer))
		}
	}
	if len(devs) == 0 {
		return "", ibverbs.PortInfo{}, 0, fmt.Errorf("%w: verbs: no RDMA device", rdma.ErrNotViable)
	}
	if cfg.Device != "" && len(why) == 0 {
		return "", ibverbs.PortInfo{}, 0, fmt.Errorf("%w: verbs: no device %q with port %d", rdma.ErrNotViable, cfg.Device, cfg.Port)
	}
	return "", ibverbs.PortInfo{}, 0, fmt.Errorf("%w: verbs: no usable RDMA port: %v", rdma.ErrNotViable, why)
}

// New returns the verbs channel of the node described by env (which needs a
// Store and Control), configured by env.Verbs, or an error wrapping
// rdma.ErrNotViable where no RDMA device can be used.
func New(env *rdma.Env) (*Channel, error) {
	if env == nil {
		return nil, errors.New("verbs: Env with a Store and Control required")
	}
	return NewWithConfig(env, Config{VerbsConfig: env.Verbs})
}

// NewWithConfig is New with a configuration in place of env.Verbs; its
// Connect field is ignored (set from the VerbsConfig).
func NewWithConfig(env *rdma.Env, cfg Config) (*Channel, error) {
	if env == nil || env.Store == nil || env.Control == nil {
		return nil, errors.New("verbs: Env with a Store and Control required")
	}
	mine := cfg
	cfg = withConnect(cfg.WithDefaults())
	cfg.GPU, cfg.Rails, cfg.RailMinBytes, cfg.Grants, cfg.OwnerBudget = mine.GPU, mine.Rails, mine.RailMinBytes, mine.Grants, mine.OwnerBudget
	if cfg.RailMinBytes <= 0 {
		cfg.RailMinBytes = defaultRailMinBytes
	}
	cfg.Window = min(cfg.Window, cfg.SendQueue)
	cfg.ChunkSize = min(cfg.ChunkSize, 1<<30)
	if cfg.GPU != "" {
		if _, err := pcitopo.ParseBusID(cfg.GPU); err != nil {
			return nil, fmt.Errorf("verbs: Config.GPU: %w", err)
		}
	}
	var plan nicPlan
	if cfg.Device == "" {
		plan = planNICs(cfg.GPU, "/")
	}
	rails, class, err := openRails(cfg, plan)
	if err != nil {
		return nil, err
	}
	c := &Channel{env: env, log: env.Logger().Named("verbs"), cfg: cfg, rails: rails,
		owners: map[railKey]*ownerPeer{}, fetches: map[railKey]*fetchPeer{}, destPDs: map[string]*ibverbs.PD{},
		owned: map[memory.Device]*memory.RegCache{}}
	c.grants, c.grantWhy = GrantWindows, ""
	for _, r := range rails {
		// Windows only where every rail has them.
		m, why := chooseGrants(r.ctx, r.port, cfg.Grants)
		if c.grantWhy == "" || m == GrantRegister && c.grants == GrantWindows {
			c.grants, c.grantWhy = m, why
		}
	}
	name, port := rails[0].ctx.Name(), rails[0].port
	c.dests = memory.NewRegCache("verbs", pdRegistrar{c: c, access: ibverbs.AccessLocalWrite}, memory.RegBudget{Bytes: cfg.CacheBytes, Count: cfg.CacheEntries})
	env.Store.OnEnd(c.exportEnded)
	c.cancelFree = memory.OnFree(c.allocationFreed)
	c.log.Debug("verbs channel", zap.String("device", name), zap.Uint8("port", port.Num), zap.Strings("rails", c.Rails()),
		zap.Stringer("link", port.LinkLayer), zap.Stringer("mtu", port.ActiveMTU),
		zap.Stringer("grants", c.grants), zap.String("why", c.grantWhy))
	plan.report(c.log, name, class)
	return c, nil
}

// Name returns rdma.Verbs.
func (c *Channel) Name() string { return rdma.Verbs }

// Device returns the RDMA device and port the channel uses first (rail 0).
func (c *Channel) Device() (string, ibverbs.PortInfo) { return c.rails[0].ctx.Name(), c.rails[0].port }

// Rails returns the RDMA devices the channel splits transfers across, rail
// 0 first.
func (c *Channel) Rails() []string {
	out := make([]string, len(c.rails))
	for i, r := range c.rails {
		out[i] = r.ctx.Name()
	}
	return out
}

// Stats returns the registration counters.
func (c *Channel) Stats() Stats {
	rs := c.dests.Stats()
	var os memory.RegStats
	for _, rc := range c.ownerCaches() {
		s := rc.Stats()
		os.Misses += s.Misses - s.RegisterErrors
		os.Hits += s.Hits
		os.Evictions += s.Evictions + s.Invalidations
	}
	return Stats{
		OwnerRegistrations: c.stats.ownerReg.Load() + os.Misses, OwnerHits: c.stats.ownerHit.Load() + os.Hits,
		OwnerDeregistrations: c.stats.ownerDereg.Load() + os.Evictions,
		WindowBinds:          c.stats.winBind.Load(), WindowInvalidations: c.stats.winInval.Load(),
		FetchRegistrations: rs.Misses - rs.RegisterErrors + c.stats.fetchReg.Load(), FetchHits: rs.Hits,
		FetchEvictions: rs.Evictions + rs.Invalidations, Connections: c.stats.conns.Load(),
		RailFailovers: c.stats.failovers.Load(),
	}
}

// dropDests drops the destination registrations of connection key (idle
// ones now, ones in use at their transfer's end).
func (c *Channel) dropDests(key string) {
	if err := c.dests.DropPeer(key); err != nil {
		c.log.Warn("dropping destination registrations", zap.String("connection", key), zap.Error(err))
	}
}

// InFlight returns the transfers in progress: fetches on this side plus
// exports a peer is reading (acquired and not yet ended).
func (c *Channel) InFlight() int {
	n := int(c.fetching.Load())
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, op := range c.owners {
		n += op.acquired()
	}
	return n
}

// Offer prepares the export for peer and returns its address and length
// (and, with per-export registration, its rkey). With memory windows
// (Grants) it registers the export's whole allocation in peer's protection
// domain for window binding, unless the owner cache holds it already; the
// window granting exactly the export's bytes is bound at the peer's first
// read (the rkey comes back then) and invalidated when the export ends.
// With per-export registration it registers the export's bytes with remote
// read access only and deregisters them when the export ends (released,
// expired, holder down) and no read of it is in progress. Either way a
// released export's rkey reads nothing, and an rkey is useless through
// another peer's queue pair.
func (c *Channel) Offer(ctx context.Context, e *tensor.Export, peer string) ([]byte, error) {
	buf := e.Tensor.Buffer()
	if buf.Len() == 0 {
		return offer{}.encode(), nil
	}
	op, err := c.ownerPeer(peer, 0)
	if err != nil {
		return nil, err
	}
	if c.windowed(buf) {
		if err := op.grantExport(e.ID, buf); err != nil {
			return nil, fmt.Errorf("verbs: offer of export %d to %s: %w", e.ID, peer, err)
		}
		return offer{Addr: uint64(buf.Ptr()), Len: int64(buf.Len())}.encode(), nil
	}
	reg, err := op.offer(e.ID, buf)
	if err != nil {
		return nil, fmt.Errorf("verbs: offer of export %d to %s: %w", e.ID, peer, err)
	}
	return offer{Addr: uint64(buf.Ptr()), Len: int64(buf.Len()), RKey: reg.mr.RKey()}.encode(), nil
}

// HandleControl answers a fetcher's control message (connect, begin and
// end of a read). Errors met serving it go back in the reply; a malformed
// message gets an error.
func (c *Channel) HandleControl(ctx context.Context, peer string, b []byte) ([]byte, error) {
	req, err := decodeRequest(b)
	if err != nil {
		return nil, err
	}
	var rep reply
	op, err := c.ownerPeer(peer, int(req.Rail))
	if err == nil {
		switch req.Op {
		case opConnect:
			err = op.connect(req.Endpoint, &rep)
		case opBegin:
			err = op.begin(req, &rep)
		case opEnd:
			err = op.end(req.Token)
		}
	}
	if err != nil {
		rep = reply{Code: codes.Code(err), Msg: err.Error()}
	}
	return encode(&rep)
}

// ownerPeer returns the owner-side state for peer on a rail, creating it.
func (c *Channel) ownerPeer(peer string, rail int) (*ownerPeer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, rdma.ErrClosed
	}
	if rail < 0 || rail >= len(c.rails) {
		return nil, fmt.Errorf("verbs: no rail %d here (%d RDMA devices)", rail, len(c.rails))
	}
	k := railKey{peer, rail}
	if op := c.owners[k]; op != nil {
		return op, nil
	}
	pd, err := c.rails[rail].ctx.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("verbs: protection domain for %s: %w", peer, err)
	}
	op := &ownerPeer{c: c, node: peer, rail: c.rails[rail], pd: pd, byExport: map[uint64]*ownerReg{}, regs: map[regKey]*ownerReg{},
		acq: map[uint64]*acquisition{}, grants: map[uint64]*grant{}, key: fmt.Sprintf("%s@%d", peer, c.ownSeq.Add(1))}
	c.owners[k] = op
	c.destPDs[op.key] = pd
	return op, nil
}

// exportEnded drops the export's registrations (Store.OnEnd).
func (c *Channel) exportEnded(e *tensor.Export) {
	c.mu.Lock()
	ops := make([]*ownerPeer, 0, len(c.owners))
	for _, op := range c.owners {
		ops = append(ops, op)
	}
	c.mu.Unlock()
	for _, op := range ops {
		op.exportEnded(e.ID)
	}
}

// allocationFreed drops the owner-side registrations of a freed allocation
// (memory.OnFree); the destination cache drops its own.
func (c *Channel) allocationFreed(a memory.Allocation) {
	c.mu.Lock()
	ops := make([]*ownerPeer, 0, len(c.owners))
	for _, op := range c.owners {
		ops = append(ops, op)
	}
	c.mu.Unlock()
	for _, op := range ops {
		op.allocationFreed(a.ID)
	}
}

// PeerDown drops everything held for node: its queue pairs (transfers in
// flight from it fail), the regions registered for it and its reads in
// progress.
func (c *Channel) PeerDown(node string) {
	var ops []*ownerPeer
	var fps []*fetchPeer
	c.mu.Lock()
	for k, op := range c.owners {
		if k.node == node {
			ops = append(ops, op)
			delete(c.owners, k)
		}
	}
	for k, fp := range c.fetches {
		if k.node == node {
			fps = append(fps, fp)
			delete(c.fetches, k)
		}
	}
	c.mu.Unlock()
	for _, op := range ops {
		op.close()
	}
	for _, fp := range fps {
		fp.teardown(fmt.Errorf("verbs: %w: %s", rdma.ErrPeerDown, node))
	}
}

// Close tears down every queue pair and registration; transfers in flight
// fail. It waits for them to return.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	owners, fetches := c.owners, c.fetches
	c.owners, c.fetches = map[railKey]*ownerPeer{}, map[railKey]*fetchPeer{}
	c.mu.Unlock()
	c.cancelFree()
	for _, fp := range fetches {
		fp.teardown(rdma.ErrClosed)
	}
	for _, op := range owners {
		op.close()
	}
	c.bg.Wait()
	// Every connection and peer is destroyed and its registrations
	// dropped: this only unsubscribes the caches.
	if err := c.dests.Close(); err != nil {
		c.log.Warn("closing the destination registration cache", zap.Error(err))
	}
	for _, rc := range c.ownerCaches() {
		if err := rc.Close(); err != nil {
			c.log.Warn("closing an owner registration cache", zap.Error(err))
		}
	}
	var errs []error
	for _, r := range c.rails {
		if err := r.ctx.Close(); err != nil {
			errs = append(errs, fmt.Errorf("verbs: close: %w", err))
		}
	}
	return errors.Join(errs...)
}
