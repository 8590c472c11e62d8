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
}

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
	// Owner side: regions registered for exports, offers that found their
	// region registered already, regions deregistered.
	OwnerRegistrations, OwnerHits, OwnerDeregistrations int64
	// Fetcher side: destination registrations made, reused, evicted or
	// dropped (LRU, freed allocation, peer down), from the registration
	// cache's counters.
	FetchRegistrations, FetchHits, FetchEvictions int64
	// Connections made to owners (queue pairs connected).
	Connections int64
}

// Channel is the verbs channel: both ends of one-sided RDMA READ transfers.
// As an owner it registers exports (Offer) in a protection domain of the
// peer they were lent to and answers that peer's control messages; as a
// fetcher it connects one RC queue pair per owner, lazily, and reads into
// its registered destination. It is safe for concurrent use.
type Channel struct {
	env  *rdma.Env
	log  *zap.Logger
	cfg  Config
	ctx  *ibverbs.Context
	port ibverbs.PortInfo

	mu      sync.Mutex
	closed  bool
	owners  map[string]*ownerPeer // peers we lent exports to
	fetches map[string]*fetchPeer // owners we read from
	bg      sync.WaitGroup        // teardowns and pollers

	// dests caches destination registrations; the peer string of an entry
	// is its connection's key (fetchPeer.destKey), which destPDs maps to the
	// connection's protection domain.
	dests   *memory.RegCache
	destPDs map[string]*ibverbs.PD // guarded by mu
	destSeq atomic.Uint64

	fetching atomic.Int64
	stats    struct {
		// fetchReg counts destinations registered outside the cache.
		ownerReg, ownerHit, ownerDereg, fetchReg, conns atomic.Int64
	}
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
	cfg = withConnect(cfg.WithDefaults())
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
	name, port, class, err := pickPort(cfg, plan)
	if err != nil {
		return nil, err
	}
	ctx, err := ibverbs.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%w: verbs: %w", rdma.ErrNotViable, err)
	}
	c := &Channel{env: env, log: env.Logger().Named("verbs"), cfg: cfg, ctx: ctx, port: port,
		owners: map[string]*ownerPeer{}, fetches: map[string]*fetchPeer{}, destPDs: map[string]*ibverbs.PD{}}
	c.dests = memory.NewRegCache("verbs", destRegistrar{c}, memory.RegBudget{Bytes: cfg.CacheBytes, Count: cfg.CacheEntries})
	env.Store.OnEnd(c.exportEnded)
	c.cancelFree = memory.OnFree(c.allocationFreed)
	c.log.Debug("verbs channel", zap.String("device", name), zap.Uint8("port", port.Num),
		zap.Stringer("link", port.LinkLayer), zap.Stringer("mtu", port.ActiveMTU))
	plan.report(c.log, name, class)
	return c, nil
}

// Name returns rdma.Verbs.
func (c *Channel) Name() string { return rdma.Verbs }

// Device returns the RDMA device and port the channel uses.
func (c *Channel) Device() (string, ibverbs.PortInfo) { return c.ctx.Name(), c.port }

// Stats returns the registration counters.
func (c *Channel) Stats() Stats {
	rs := c.dests.Stats()
	return Stats{
		OwnerRegistrations: c.stats.ownerReg.Load(), OwnerHits: c.stats.ownerHit.Load(),
		OwnerDeregistrations: c.stats.ownerDereg.Load(),
		FetchRegistrations:   rs.Misses - rs.RegisterErrors + c.stats.fetchReg.Load(), FetchHits: rs.Hits,
		FetchEvictions: rs.Evictions + rs.Invalidations, Connections: c.stats.conns.Load(),
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

// Offer registers the export's bytes in peer's protection domain with
// remote read access only and returns their address, length and rkey. The
// region is deregistered when the export ends (released, expired, holder
// down) and no read of it is in progress, so a released export's rkey reads
// nothing, and an rkey is useless through another peer's queue pair.
func (c *Channel) Offer(ctx context.Context, e *tensor.Export, peer string) ([]byte, error) {
	buf := e.Tensor.Buffer()
	if buf.Len() == 0 {
		return offer{}.encode(), nil
	}
	op, err := c.ownerPeer(peer)
	if err != nil {
		return nil, err
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
	op, err := c.ownerPeer(peer)
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

// ownerPeer returns the owner-side state for peer, creating it.
func (c *Channel) ownerPeer(peer string) (*ownerPeer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, rdma.ErrClosed
	}
	if op := c.owners[peer]; op != nil {
		return op, nil
	}
	pd, err := c.ctx.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("verbs: protection domain for %s: %w", peer, err)
	}
	op := &ownerPeer{c: c, node: peer, pd: pd, byExport: map[uint64]*ownerReg{}, regs: map[regKey]*ownerReg{},
		acq: map[uint64]*acquisition{}}
	c.owners[peer] = op
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
	c.mu.Lock()
	op := c.owners[node]
	delete(c.owners, node)
	fp := c.fetches[node]
	delete(c.fetches, node)
	c.mu.Unlock()
	if op != nil {
		op.close()
	}
	if fp != nil {
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
	c.owners, c.fetches = map[string]*ownerPeer{}, map[string]*fetchPeer{}
	c.mu.Unlock()
	c.cancelFree()
	for _, fp := range fetches {
		fp.teardown(rdma.ErrClosed)
	}
	for _, op := range owners {
		op.close()
	}
	c.bg.Wait()
	// Every connection is destroyed and its registrations dropped: this
	// only unsubscribes the cache.
	if err := c.dests.Close(); err != nil {
		c.log.Warn("closing the destination registration cache", zap.Error(err))
	}
	if err := c.ctx.Close(); err != nil {
		return fmt.Errorf("verbs: close: %w", err)
	}
	return nil
}
