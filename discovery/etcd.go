package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tensorferry/tensorferry/config"
)

// Backoff of the reconnections to etcd: the first retry waits
// retryMin, doubling up to retryMax (the keepalive's up to its interval).
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// NewEtcd returns the Discovery of cfg.Discovery.Etcd: Start registers
// the node under {prefix}{cluster}/nodes/{name} with a lease of lease_ttl,
// kept alive every third of it, and watches the other registrations. cfg
// must be validated.
//
// When the key is still held by another lease (the node's previous run,
// crashed less than lease_ttl ago), Start waits for it to expire: give
// Start a context of at least lease_ttl + dial_timeout, or it fails then.
// A live node of the same name keeps the key, and Start fails. log receives the registrations skipped as invalid
// and the troubles with etcd; nil logs nothing.
func NewEtcd(cfg *config.Config, log *zap.Logger) (Discovery, error) {
	if cfg.Discovery == nil || cfg.Discovery.Etcd == nil {
		return nil, errors.New("discovery: the config has no discovery.etcd section")
	}
	e := cfg.Discovery.Etcd.WithDefaults()
	if len(e.Endpoints) == 0 {
		return nil, errors.New("discovery: discovery.etcd.endpoints is empty")
	}
	if err := config.CheckName(cfg.Cluster); err != nil {
		return nil, fmt.Errorf("discovery: cluster: %w", err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	ttl := int64((e.LeaseTTL + time.Second - 1) / time.Second)
	d := &etcd{
		endpoints: slices.Clone(e.Endpoints),
		dir:       e.Prefix + cfg.Cluster + "/nodes/",
		ttl:       ttl,
		interval:  time.Duration(ttl) * time.Second / 3,
		timeout:   e.DialTimeout,
		c:         newClient(slices.Clone(e.Endpoints), e.DialTimeout),
		known:     make(map[string]member),
		check:     make(chan struct{}, 1),
	}
	d.log = log.With(zap.Stringer("discovery", d))
	return d, nil
}

// etcd is the Discovery through etcd.
type etcd struct {
	endpoints []string
	dir       string // every key: dir + node name
	ttl       int64  // of the lease, in seconds
	interval  time.Duration
	timeout   time.Duration
	c         *client
	log       *zap.Logger

	startMu sync.Mutex // held by Start and Close
	mu      sync.Mutex
	used    bool // Start was called (or Close)
	running bool // the goroutines run
	lease   int64
	cancel  context.CancelFunc
	unwatch context.CancelFunc // ends the current watch stream
	wg      sync.WaitGroup

	// Set by Start, then read by the goroutines only.
	self  config.NodeConfig
	key   []byte
	value []byte
	fn    func(Event)
	// known and rev belong to Start, then to the watch goroutine.
	known map[string]member
	rev   int64 // the last revision applied

	// Test hooks. keepalivePaused skips the keepalives while set (the
	// node looks dead to etcd). resyncGate, when set, is received from
	// before each reconnection of the watch.
	keepalivePaused atomic.Bool
	resyncGate      chan struct{}

	// check is signalled by the watch when this node's own key changed
	// under it (deleted, or overwritten): the keepalives goroutine then
	// puts the registration back (reassert).
	check chan struct{}
}

// member is a node known from etcd.
type member struct {
	node    config.NodeConfig
	leaving bool
}

func (d *etcd) String() string { return "etcd(" + strings.Join(d.endpoints, ",") + ")" }

func (d *etcd) Start(ctx context.Context, self config.NodeConfig, fn func(Event)) error {
	d.startMu.Lock()
	defer d.startMu.Unlock()
	d.mu.Lock()
	if d.used {
		d.mu.Unlock()
		return ErrStarted
	}
	d.used = true
	d.mu.Unlock()
	self = public(self)
	if err := config.CheckNode(&self); err != nil {
		return fmt.Errorf("discovery: self: %w", err)
	}
	value, err := encodeNode(self, false)
	if err != nil {
		return err
	}
	d.self, d.key, d.value, d.fn = self, []byte(d.dir+self.Name), value, fn
	lease, err := d.register(ctx, true)
	if err != nil {
		d.c.close()
		return err
	}
	// The keepalives start before the range, which may take long.
	bg, cancel := context.WithCancel(context.Background())
	d.mu.Lock()
	d.cancel, d.lease, d.running = cancel, lease, true
	d.mu.Unlock()
	d.wg.Add(1)
	go d.keepalives(bg)
	cur, rev, err := d.read(ctx)
	if err != nil {
		_ = d.shutdown()
		return err
	}
	d.resync(cur, nil)
	d.rev = rev
	// Counted before the watch starts: from then on only it touches known.
	members := len(d.known)
	d.wg.Add(1)
	go d.watch(bg)
	d.log.Info("registered", zap.String("key", string(d.key)), zap.Int64("ttl_s", d.ttl), zap.Int("members", members))
	return nil
}

// register grants a lease and puts the node's registration under it. When
// the key is held by another lease (this node's previous run, whose lease
// has not expired yet, or another live node of the same name), it retries
// until the key is free; wait bounds that to a lease's TTL and a bit.
func (d *etcd) register(ctx context.Context, wait bool) (int64, error) {
	lease, _, err := d.c.grant(ctx, d.ttl)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(time.Duration(d.ttl)*time.Second + d.timeout)
	delay := retryMin
	for {
		ok, cur, err := d.c.create(ctx, d.key, d.value, lease)
		if err == nil && ok {
			return lease, nil
		}
		if err == nil {
			var holder int64
			if len(cur) > 0 {
				holder = int64(cur[0].Lease)
			}
			err = fmt.Errorf("discovery: %q is registered by another process (lease %x); is a node of that name still running?", d.self.Name, holder)
			if wait && time.Now().Before(deadline) {
				d.log.Info("waiting for the previous registration to expire", zap.String("key", string(d.key)), zap.Int64("lease", holder))
				if sleep(ctx, delay) {
					delay = min(2*delay, time.Second)
					continue
				}
				err = fmt.Errorf("%w: %w", err, ctx.Err())
			}
		}
		d.revoke(lease)
		return 0, err
	}
}

// revoke ends lease, logging a failure other than the lease being gone.
func (d *etcd) revoke(lease int64) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	if err := d.c.revoke(ctx, lease); err != nil && !errors.Is(err, errLeaseNotFound) {
		d.log.Warn("revoke lease", zap.Int64("lease", lease), zap.Error(err))
	}
}

// Close marks the registration as leaving, revokes its lease (which
// deletes it) and waits for the goroutines. It waits for a Start under
// way to return.
func (d *etcd) Close() error {
	d.startMu.Lock()
	defer d.startMu.Unlock()
	return d.shutdown()
}

func (d *etcd) shutdown() error {
	d.mu.Lock()
	d.used = true
	running := d.running
	d.running = false
	cancel := d.cancel
	d.mu.Unlock()
	if !running {
		return nil
	}
	cancel()
	d.wg.Wait()
	defer d.c.close()
	ctx, stop := context.WithTimeout(context.Background(), 2*d.timeout)
	defer stop()
	d.mu.Lock()
	lease := d.lease
	d.mu.Unlock()
	if value, err := encodeNode(d.self, true); err == nil {
		// Only while the key is still this lease's: never overwrite a
		// registration of another process.
		if _, err := d.c.putIfLease(ctx, d.key, value, lease); err != nil {
			d.log.Debug("mark leaving", zap.Error(err))
		}
	}
	if err := d.c.revoke(ctx, lease); err != nil && !errors.Is(err, errLeaseNotFound) {
		return fmt.Errorf("discovery: deregister %q: %w", d.self.Name, err)
	}
	d.log.Info("deregistered", zap.String("key", string(d.key)))
	return nil
}

// keepalives renews the lease every third of its TTL. When etcd says the
// lease is gone (this node was cut off from etcd for a TTL), it registers
// again under a new lease. When a keepalive fails, the watch is restarted
// too: a stream on a dead connection may never notice by itself.
func (d *etcd) keepalives(ctx context.Context) {
	defer d.wg.Done()
	delay := retryMin
	wait := d.interval
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-d.check:
			t.Stop()
			d.reassert(ctx)
			continue
		case <-t.C:
		}
		wait = d.interval
		if d.keepalivePaused.Load() {
			continue
		}
		d.mu.Lock()
		lease := d.lease
		d.mu.Unlock()
		ttl, err := d.c.keepalive(ctx, lease)
		if err == nil && ttl == 0 {
			d.log.Warn("lease expired: registering again", zap.Int64("lease", lease))
			lease, err = d.register(ctx, false)
			if err == nil {
				d.mu.Lock()
				d.lease = lease
				d.mu.Unlock()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Warn("lease keepalive", zap.Error(err), zap.Duration("retry_in", delay))
			d.restartWatch()
			wait, delay = delay, min(2*delay, d.interval)
			continue
		}
		delay = retryMin
	}
}

// reassert puts this node's registration back when its key no longer
// holds it under its lease: deleted (by hand, or an operator's mistake),
// or overwritten with another value or lease. Without it the other nodes
// would take a live node for gone until its lease expired, which a live
// node's keepalives never let happen. A valid registration of this name
// under another live lease is another process's: it is left alone, and
// said so.
func (d *etcd) reassert(ctx context.Context) {
	d.mu.Lock()
	lease := d.lease
	d.mu.Unlock()
	ok, cur, err := d.c.create(ctx, d.key, d.value, lease)
	switch {
	case err != nil:
		d.log.Warn("check own registration", zap.Error(err))
		return
	case ok:
		d.log.Warn("own registration was deleted: put back", zap.String("key", string(d.key)))
		return
	case len(cur) != 1:
		return
	}
	kv := cur[0]
	if bytes.Equal(kv.Value, d.value) && int64(kv.Lease) == lease {
		return // as it should be
	}
	if _, n, _, perr := d.parse(kv); perr == nil && int64(kv.Lease) != 0 && int64(kv.Lease) != lease && n.Name == d.self.Name {
		d.log.Error("own name registered under another lease: is another process running as this node?",
			zap.String("key", string(d.key)), zap.Int64("lease", int64(kv.Lease)))
		return
	}
	if ok, err := d.c.replace(ctx, d.key, d.value, lease, int64(kv.ModRevision)); err != nil {
		d.log.Warn("put own registration back", zap.Error(err))
	} else if ok {
		d.log.Warn("own registration was overwritten: put back", zap.String("key", string(d.key)))
	}
}

// ownLease reports whether lease is this node's current one.
func (d *etcd) ownLease(lease int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return lease == d.lease
}

// restartWatch ends the current watch stream; the watch reconnects and
// goes on from the last revision it applied.
func (d *etcd) restartWatch() {
	d.mu.Lock()
	if d.unwatch != nil {
		d.unwatch()
	}
	d.mu.Unlock()
}

// watch follows the registrations from the revision after the initial
// range. When the stream breaks it reconnects with backoff and goes on
// from the last revision applied, so no change is missed; when etcd has
// compacted those revisions, it ranges again and reports the difference.
func (d *etcd) watch(ctx context.Context) {
	defer d.wg.Done()
	delay := retryMin
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			if d.resyncGate != nil {
				select {
				case <-d.resyncGate:
				case <-ctx.Done():
					return
				}
			}
			if !sleep(ctx, delay) {
				return
			}
			delay = min(2*delay, retryMax)
		}
		err := d.follow(ctx, &delay)
		var compacted *errCompacted
		if errors.As(err, &compacted) || errors.Is(err, errTooLarge) {
			// The history is gone, or a batch of changes is beyond
			// what this node reads: the registrations as they are now
			// replace it.
			d.log.Info("watch: reading the registrations again", zap.Int64("from", d.rev+1), zap.Error(err))
			cur, rev, rerr := d.read(ctx)
			if rerr != nil {
				err = rerr
			} else {
				d.resync(cur, func(m member) string {
					if m.leaving {
						return ReasonLeft
					}
					return ReasonMissed
				})
				d.rev = rev
				delay = retryMin
				continue
			}
		}
		if ctx.Err() == nil {
			d.log.Warn("watch broken: reconnecting", zap.Error(err), zap.Duration("retry_in", delay))
		}
	}
}

// follow runs one watch stream from d.rev+1 until it breaks; delay is
// reset once the stream is established.
func (d *etcd) follow(ctx context.Context, delay *time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.mu.Lock()
	d.unwatch = cancel
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.unwatch = nil
		d.mu.Unlock()
	}()
	s, err := d.c.watch(sctx, []byte(d.dir), d.rev+1)
	if err != nil {
		return err
	}
	defer s.close()
	for {
		r, err := s.next()
		if err != nil {
			return err
		}
		if r.created {
			*delay = retryMin
		}
		for _, ev := range r.events {
			d.apply(ev)
			d.rev = max(d.rev, int64(ev.Kv.ModRevision))
		}
	}
}

// nameOf returns the node name of key, or an error for a key that is not
// dir + a valid name.
func (d *etcd) nameOf(key []byte) (string, error) {
	name, ok := strings.CutPrefix(string(key), d.dir)
	if !ok {
		return "", fmt.Errorf("key outside %q", d.dir)
	}
	if err := config.CheckName(name); err != nil {
		return "", fmt.Errorf("key: %w", err)
	}
	return name, nil
}

// parse reads the registration kv; it logs and skips an invalid one.
func (d *etcd) parse(kv keyValue) (string, config.NodeConfig, bool, error) {
	name, err := d.nameOf(kv.Key)
	if err != nil {
		return "", config.NodeConfig{}, false, err
	}
	if kv.oversized {
		return name, config.NodeConfig{}, false, fmt.Errorf("value beyond the %d bytes an answer may hold", d.c.max)
	}
	n, leaving, err := decodeNode(kv.Value)
	if err != nil {
		return name, config.NodeConfig{}, false, err
	}
	if n.Name != name {
		return name, config.NodeConfig{}, false, fmt.Errorf("value names node %q", n.Name)
	}
	return name, n, leaving, nil
}

func (d *etcd) skip(kv keyValue, err error) {
	d.log.Warn("skipping an invalid registration", zap.ByteString("key", kv.Key[:min(len(kv.Key), 512)]),
		zap.Int("value_bytes", len(kv.Value)), zap.Error(err))
}

// apply reports the change one watch event makes.
func (d *etcd) apply(ev event) {
	if bytes.Equal(ev.Kv.Key, d.key) {
		// This node's own key: anything but its registration under its
		// lease is put back (reassert).
		if ev.Type == "DELETE" || !bytes.Equal(ev.Kv.Value, d.value) || !d.ownLease(int64(ev.Kv.Lease)) {
			select {
			case d.check <- struct{}{}:
			default:
			}
		}
		return
	}
	if ev.Type == "DELETE" {
		name, err := d.nameOf(ev.Kv.Key)
		if err != nil {
			return // never reported: nothing to take back
		}
		if m, ok := d.known[name]; ok {
			delete(d.known, name)
			reason := ReasonLeaseExpired
			if m.leaving {
				reason = ReasonLeft
			}
			d.fn(Event{Kind: Left, Node: m.node, Reason: reason})
		}
		return
	}
	name, n, leaving, err := d.parse(ev.Kv)
	if name == d.self.Name && name != "" {
		return
	}
	if err != nil {
		// An invalid value is skipped, not taken for a departure: a node
		// known from a valid registration stays known until its key is
		// deleted (its lease expires) or holds a valid one again, which
		// the node itself puts back (reassert).
		d.skip(ev.Kv, err)
		return
	}
	d.update(name, member{node: n, leaving: leaving})
}

// update records m as node name's registration and reports the change.
func (d *etcd) update(name string, m member) {
	old, ok := d.known[name]
	d.known[name] = m
	switch {
	case !ok:
		d.fn(Event{Kind: Joined, Node: m.node})
	case !sameNode(old.node, m.node):
		d.fn(Event{Kind: Left, Node: old.node, Reason: ReasonChanged})
		d.fn(Event{Kind: Joined, Node: m.node})
	}
}

// read returns the valid registrations in etcd but this node's, by name,
// and the revision they were read at. It logs and skips invalid ones.
func (d *etcd) read(ctx context.Context) (map[string]member, int64, error) {
	cur := make(map[string]member)
	rev, err := d.c.rangePrefix(ctx, []byte(d.dir), func(kv keyValue) {
		name, n, leaving, err := d.parse(kv)
		switch {
		case name == d.self.Name && name != "":
		case err != nil:
			d.skip(kv, err)
		default:
			cur[name] = member{node: n, leaving: leaving}
		}
	})
	if err != nil {
		return nil, 0, err
	}
	return cur, rev, nil
}

// resync reports the difference between the known nodes and cur, every
// registration as read: a Left for each known node missing from cur (with
// the reason gone says; ReasonMissed when gone is nil), a Joined for each
// new one. Both in the order of the names.
func (d *etcd) resync(cur map[string]member, gone func(member) string) {
	var left []string
	for name := range d.known {
		if _, ok := cur[name]; !ok {
			left = append(left, name)
		}
	}
	slices.Sort(left)
	for _, name := range left {
		m := d.known[name]
		delete(d.known, name)
		reason := ReasonMissed
		if gone != nil {
			reason = gone(m)
		}
		d.fn(Event{Kind: Left, Node: m.node, Reason: reason})
	}
	names := make([]string, 0, len(cur))
	for name := range cur {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		d.update(name, cur[name])
	}
}

// sleep waits for d or ctx's end, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
