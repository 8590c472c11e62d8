package ipc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/internal/deadline"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// errStuck is returned when queued device copies do not finish within
// Config.CancelGrace after a cancellation or failure.
var errStuck = errors.New("ipc: device copy did not finish")

// endTimeout bounds the end request sent after a copy, which runs even when
// the fetch's context is done (the owner must stop holding the export).
const endTimeout = 10 * time.Second

// mapKey names one mapping: an owner's allocation opened in one device.
type mapKey struct {
	owner string
	inc   uint64
	alloc uint64
	dev   memory.Device
}

// mapping is an owner's allocation mapped into this process, cached for
// later fetches. Fields other than ready are guarded by Channel.fmu; buf,
// shift, size and err are written once, before ready is closed.
type mapping struct {
	key     mapKey
	ready   chan struct{} // closed once opened or failed
	buf     memory.Buffer // the whole driver allocation
	shift   uint64        // offer offsets start here in buf
	size    uint64
	err     error
	users   int
	dropped error // non-nil once removed from the table: why
	lastUse time.Time
}

func (m *mapping) opening() bool {
	select {
	case <-m.ready:
		return false
	default:
		return true
	}
}

// Fetch copies the export d describes into the start of dst, a CUDA buffer.
//
// Cost: under a direct offer (this node is the holder and already maps the
// allocation), the device copy alone. Otherwise one control round trip to
// acquire the export on the owner (its lease, holder and bounds are
// checked; the first fetch of an allocation also gets its IPC handle, and
// the first fetch from an owner proves this node is on its host, two more
// round trips) and one, not waited for, to end the acquisition, plus the
// device copy. Errors: rdma.ErrTooSmall,
// rdma.ErrNoOffer, tensor.ErrUnknownExport, ErrBadLease or ErrStale from
// the owner, rdma.ErrPeerDown when the owner cannot be reached or went down
// during the copy, rdma.ErrClosed, and the context's error.
func (c *Channel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	return c.FetchStream(ctx, d, dst, rdma.Progress{})
}

// FetchStream implements rdma.StreamFetcher: Fetch, queuing no chunk of
// the copy before p.Ready says the owner holds it, and telling p.Landed
// as each chunk lands (Config.CopyChunk bytes at a time).
func (c *Channel) FetchStream(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, p rdma.Progress) error {
	return c.transfer(ctx, d, dst, p, fromOwner)
}

// PutStream implements rdma.Putter: FetchStream the other way, writing
// src into the export d describes, which its owner lent to this node.
// The owner checks the export as for a fetch (holder, lease, allocation,
// bounds); the copy runs on a lane of src's device, into this node's
// mapping of the owner's allocation. Errors: those of Fetch.
func (c *Channel) PutStream(ctx context.Context, d *tensor.Descriptor, src memory.Buffer, p rdma.Progress) error {
	return c.transfer(ctx, d, src, p, toOwner)
}

// direction says which way a copy between an owner's export and a buffer
// of this node (local) goes.
type direction bool

const (
	fromOwner direction = false // Fetch: the export into local
	toOwner   direction = true  // PutStream: local into the export
)

// transfer is Fetch and PutStream: it copies between the export d
// describes and local in direction dir, following p.
func (c *Channel) transfer(ctx context.Context, d *tensor.Descriptor, local memory.Buffer, p rdma.Progress, dir direction) error {
	o, err := c.check(ctx, d, local)
	if err != nil {
		return err
	}
	req := request{Op: opBegin, Incarnation: d.Incarnation, ExportID: d.ExportID, Lease: d.Lease,
		Alloc: o.Alloc, Offset: o.Offset, Bytes: o.Bytes}
	if d.Bytes == 0 {
		// Nothing to copy: check the export and end at once.
		if _, err := c.begin(ctx, d.Owner, &req); err != nil {
			return err
		}
		_ = c.end(ctx, d.Owner, req.Acq)
		return nil
	}
	key := mapKey{owner: d.Owner, inc: d.Incarnation, alloc: o.Alloc, dev: local.Device()}
	if done, err := c.tryDirect(ctx, d, key, o, local, p, dir); done {
		tracehook.CacheHit(ctx, true)
		return err
	}
	m, opener, err := c.claim(ctx, key)
	if err != nil {
		return err
	}
	tracehook.CacheHit(ctx, !opener) // the opener maps the allocation: a miss
	req.WantHandle = opener
	rep, err := c.begin(ctx, d.Owner, &req)
	if err != nil {
		if opener {
			c.failOpen(m, err)
		} else {
			c.unuse(m)
		}
		return err
	}
	c.revoke(d.Owner, d.Incarnation, rep.Revoked)
	if opener {
		if err := c.open(m, rep); err != nil {
			_ = c.end(ctx, d.Owner, req.Acq)
			return err
		}
	}
	err = c.copyWith(ctx, m, o, local, p, dir)
	if err == nil {
		// The bytes are here: the owner's hold is ended without waiting
		// for its answer (one control round trip less per fetch). The
		// connection to the owner is ordered, so the end arrives before
		// the lease release the caller sends next.
		if why := c.unuse(m); why != nil {
			_ = c.end(ctx, d.Owner, req.Acq)
			return fmt.Errorf("ipc: copy with %s: %w", d.Owner, why)
		}
		c.endAsync(d.Owner, req.Acq)
		return nil
	}
	endErr := c.end(ctx, d.Owner, req.Acq)
	if why := c.unuse(m); why != nil && err == nil {
		err = fmt.Errorf("ipc: copy with %s: %w", d.Owner, why)
	}
	if err != nil && ctx.Err() == nil && errors.Is(endErr, rdma.ErrPeerDown) && !errors.Is(err, rdma.ErrPeerDown) {
		// The owner went away during the copy: that is why it failed.
		err = fmt.Errorf("%w: %w", rdma.ErrPeerDown, err)
	}
	return err
}

// FetchDirect implements rdma.DirectFetcher: under a direct offer, when
// this node is the holder and already maps the allocation, it copies as
// Fetch does (the device copy alone) and reports done; otherwise, or when
// too little of the lease is left, it reports done=false having done
// nothing. A descriptor Fetch would refuse is done, with Fetch's error.
func (c *Channel) FetchDirect(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) (done bool, err error) {
	o, err := c.check(ctx, d, dst)
	if err != nil {
		return true, err
	}
	if d.Bytes == 0 {
		return false, nil // Fetch checks the export with its owner
	}
	return c.tryDirect(ctx, d, mapKey{owner: d.Owner, inc: d.Incarnation, alloc: o.Alloc, dev: dst.Device()}, o, dst, rdma.Progress{}, fromOwner)
}

var (
	_ rdma.DirectFetcher = (*Channel)(nil)
	_ rdma.StreamFetcher = (*Channel)(nil)
	_ rdma.Putter        = (*Channel)(nil)
)

// check checks what Fetch, FetchDirect and PutStream are asked to do,
// between the export d describes and local (the destination of a fetch,
// the source of a put), and returns d's offer.
func (c *Channel) check(ctx context.Context, d *tensor.Descriptor, local memory.Buffer) (offer, error) {
	if int64(local.Len()) < d.Bytes {
		return offer{}, fmt.Errorf("ipc: %w: %d bytes for %d", rdma.ErrTooSmall, local.Len(), d.Bytes)
	}
	if err := ctx.Err(); err != nil {
		return offer{}, err
	}
	c.fmu.Lock()
	closed := c.fclosed
	c.fmu.Unlock()
	if closed {
		return offer{}, rdma.ErrClosed
	}
	raw, ok := d.Offers[rdma.IPC]
	if !ok {
		return offer{}, fmt.Errorf("ipc: %w", rdma.ErrNoOffer)
	}
	o, err := decodeOffer(raw)
	if err != nil {
		return offer{}, err
	}
	if d.Bytes < 0 || o.Bytes != uint64(d.Bytes) {
		return offer{}, fmt.Errorf("%w: offer of %d bytes for a descriptor of %d", errBadMessage, o.Bytes, d.Bytes)
	}
	if d.Bytes > 0 && local.Device().Kind != memory.KindCUDA {
		return offer{}, fmt.Errorf("ipc: local buffer in %s memory, not CUDA memory", local.Device())
	}
	return o, nil
}

// tryDirect copies (in direction dir) under a direct offer for which this
// node is the holder and has key's mapping open; done=false, nothing
// done, otherwise.
func (c *Channel) tryDirect(ctx context.Context, d *tensor.Descriptor, key mapKey, o offer, local memory.Buffer, p rdma.Progress, dir direction) (done bool, err error) {
	if !o.direct() || d.Holder != c.env.Node {
		return false, nil
	}
	m := c.claimOpen(key)
	if m == nil {
		return false, nil
	}
	return c.copyDirect(ctx, d, m, o, local, p, dir)
}

// errLeaseOutlived is returned when a direct copy could not finish before
// the lease's deadline: the owner may have reused the memory meanwhile, so
// the bytes are not trusted.
var errLeaseOutlived = errors.New("ipc: the copy outlived the lease's deadline")

// directSlack is kept between the end of a direct copy and the lease's
// deadline.
const directSlack = time.Millisecond

// copyDirect copies under a direct offer: m is this node's mapping of the
// allocation, claimed by the caller, and the lease alone keeps the tensor
// on the owner until o.Deadline. It reports done=false (m released, nothing
// copied) when too little of the lease is left, for the caller to begin
// instead.
func (c *Channel) copyDirect(ctx context.Context, d *tensor.Descriptor, m *mapping, o offer, local memory.Buffer, p rdma.Progress, dir direction) (done bool, err error) {
	now, ok := monoNow()
	if !ok || (o.Deadline != 0 && now+uint64(c.cfg.DirectMargin) > o.Deadline) {
		c.unuse(m)
		return false, nil
	}
	cctx := ctx
	if o.Deadline != 0 {
		var cancel context.CancelFunc
		// No timer unless waited on: the copy polls cctx.Err.
		cctx, cancel = deadline.WithDeadline(ctx, time.Now().Add(time.Duration(o.Deadline-now)-directSlack))
		defer cancel()
	}
	err = c.copyWith(cctx, m, o, local, p, dir)
	if why := c.unuse(m); why != nil && err == nil {
		err = fmt.Errorf("ipc: copy with %s: %w", d.Owner, why)
	}
	if err == nil && o.Deadline != 0 {
		if end, _ := monoNow(); end+uint64(directSlack) > o.Deadline {
			err = fmt.Errorf("%w: %v", errLeaseOutlived, d)
		}
	}
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		err = fmt.Errorf("%w: %v: %w", errLeaseOutlived, d, err)
	}
	if err == nil {
		c.fmu.Lock()
		c.fetchStats.direct++
		c.fmu.Unlock()
	}
	return true, err
}

// claimOpen counts a user of key's mapping when it is open and usable, and
// returns it; nil when there is none (or it is still opening).
func (c *Channel) claimOpen(key mapKey) *mapping {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	m := c.mappings[key]
	if c.fclosed || m == nil || m.opening() || m.err != nil || m.dropped != nil {
		return nil
	}
	m.users++
	c.fetchStats.reuses++
	return m
}

// copyWith copies between the offer's range of m and the start of local,
// in direction dir, on a lane of local's device, following p.
func (c *Channel) copyWith(ctx context.Context, m *mapping, o offer, local memory.Buffer, p rdma.Progress, dir direction) error {
	if m.shift+o.Offset > m.size || o.Bytes > m.size-m.shift-o.Offset {
		return fmt.Errorf("%w: [%d, +%d) outside the owner's allocation of %d bytes", errBadMessage, m.shift+o.Offset, o.Bytes, m.size)
	}
	remote, err := m.buf.Slice(int(m.shift+o.Offset), int(o.Bytes))
	if err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	lv, err := local.Slice(0, int(o.Bytes))
	if err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	dv, src := lv, remote
	if dir == toOwner {
		dv, src = remote, lv
	}
	if c.copyFunc != nil { // tests without a GPU: one piece
		if _, err := p.Await(ctx, int64(src.Len())); err != nil {
			return err
		}
		if err := c.copyFunc(ctx, dv, src); err != nil {
			return err
		}
		if p.Landed != nil {
			p.Landed(int64(src.Len()))
		}
		return nil
	}
	l, err := c.getLane(local.Device())
	if err != nil {
		return err
	}
	state, err := c.copy(ctx, l, dv, src, p)
	c.putLane(l, state)
	return err
}

// claim finds the mapping for key and counts a user of it. When there is
// none, it makes an entry and reports that the caller must open it (open or
// failOpen); others wait for the opener.
func (c *Channel) claim(ctx context.Context, key mapKey) (m *mapping, opener bool, err error) {
	for tries := 0; ; tries++ {
		c.fmu.Lock()
		if c.fclosed {
			c.fmu.Unlock()
			return nil, false, rdma.ErrClosed
		}
		m = c.mappings[key]
		if m == nil {
			m = &mapping{key: key, ready: make(chan struct{}), users: 1}
			c.mappings[key] = m
			c.fmu.Unlock()
			return m, true, nil
		}
		m.users++
		c.fmu.Unlock()
		select {
		case <-m.ready:
		case <-ctx.Done():
			c.unuse(m)
			return nil, false, ctx.Err()
		}
		if m.err == nil {
			c.fmu.Lock()
			c.fetchStats.reuses++
			c.fmu.Unlock()
			return m, false, nil
		}
		c.unuse(m)
		if tries >= 2 {
			return nil, false, m.err
		}
	}
}

// failOpen gives up opening m.
func (c *Channel) failOpen(m *mapping, err error) {
	c.fmu.Lock()
	m.err = err
	m.users--
	if m.dropped == nil {
		m.dropped = err
		if c.mappings[m.key] == m {
			delete(c.mappings, m.key)
		}
	}
	c.fmu.Unlock()
	close(m.ready)
}

// open maps the allocation the owner's reply names.
func (c *Channel) open(m *mapping, rep *reply) error {
	if len(rep.Handle) != len(memory.IPCHandle{}.Handle) {
		err := fmt.Errorf("%w: begin reply without an IPC handle", errBadMessage)
		c.failOpen(m, err)
		return err
	}
	var (
		buf memory.Buffer
		err error
	)
	if bytes.Equal(rep.Process, processID[:]) {
		// The owner is this process, which cannot open its own handles:
		// address the allocation directly (the owner keeps it alive while
		// the export is acquired).
		buf, err = memory.WrapCUDA(memory.CUDA(rep.Device), uintptr(rep.Base), int(rep.MapSize), nil)
	} else {
		h := memory.IPCHandle{Size: int(rep.MapSize)}
		copy(h.Handle[:], rep.Handle)
		buf, err = memory.OpenIPC(m.key.dev, h)
	}
	if err != nil {
		err = fmt.Errorf("ipc: mapping allocation %d of %s: %w", m.key.alloc, m.key.owner, err)
		c.failOpen(m, err)
		return err
	}
	c.fmu.Lock()
	m.buf, m.shift, m.size = buf, rep.Shift, rep.MapSize
	c.fetchStats.opens++
	c.nOpen++
	c.fmu.Unlock()
	close(m.ready)
	c.evictIdle()
	return nil
}

// unuse ends a use of m and returns why m was dropped meanwhile (nil if it
// was not); the last user of a dropped mapping closes it.
func (c *Channel) unuse(m *mapping) error {
	c.fmu.Lock()
	m.users--
	m.lastUse = time.Now()
	why := m.dropped
	closeIt := why != nil && m.users == 0 && m.buf != nil && !m.opening()
	if closeIt {
		c.nOpen--
		c.fetchStats.closes++
	}
	c.fmu.Unlock()
	if closeIt {
		if err := m.buf.Free(); err != nil {
			c.log.Warn("closing an IPC mapping", zap.String("owner", m.key.owner), zap.Error(err))
		}
	}
	return why
}

// dropMappings removes the mappings key selects; idle ones are closed now,
// the others by their last user.
func (c *Channel) dropMappings(sel func(mapKey) bool, why error) error {
	var idle []*mapping
	c.fmu.Lock()
	for k, m := range c.mappings {
		if !sel(k) {
			continue
		}
		delete(c.mappings, k)
		m.dropped = why
		if m.users == 0 && !m.opening() && m.buf != nil {
			idle = append(idle, m)
			c.nOpen--
			c.fetchStats.closes++
		}
	}
	c.fmu.Unlock()
	var err error
	for _, m := range idle {
		err = errors.Join(err, m.buf.Free())
	}
	return err
}

// errRevoked and errEvicted say why a mapping was dropped while idle.
var (
	errRevoked = errors.New("ipc: allocation freed by its owner")
	errEvicted = errors.New("ipc: mapping evicted")
)

// revoke closes the mappings of allocations the owner freed.
func (c *Channel) revoke(owner string, inc uint64, ids []uint64) {
	if len(ids) == 0 {
		return
	}
	_ = c.dropMappings(func(k mapKey) bool {
		return k.owner == owner && k.inc == inc && slices.Contains(ids, k.alloc)
	}, errRevoked)
}

// evictIdle closes idle mappings, least recently used first, while more
// than MaxMappings are open.
func (c *Channel) evictIdle() {
	c.fmu.Lock()
	excess := len(c.mappings) - c.cfg.MaxMappings
	if excess <= 0 {
		c.fmu.Unlock()
		return
	}
	var idle []*mapping
	for _, m := range c.mappings {
		if m.users == 0 && !m.opening() {
			idle = append(idle, m)
		}
	}
	c.fmu.Unlock()
	slices.SortFunc(idle, func(a, b *mapping) int { return a.lastUse.Compare(b.lastUse) })
	victims := map[mapKey]bool{}
	for _, m := range idle[:min(excess, len(idle))] {
		victims[m.key] = true
	}
	_ = c.dropMappings(func(k mapKey) bool {
		if !victims[k] {
			return false
		}
		m := c.mappings[k] // fmu is held by dropMappings
		return m.users == 0
	}, errEvicted)
}

// call sends one control request to owner and decodes the reply.
func (c *Channel) call(ctx context.Context, owner string, req *request) (*reply, error) {
	b, err := encode(req)
	if err != nil {
		return nil, fmt.Errorf("ipc: %w", err)
	}
	rb, err := c.env.Control(ctx, owner, rdma.IPC, b)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("ipc: control request to %s: %w", owner, cerr)
		}
		if errors.Is(err, rdma.ErrPeerDown) {
			return nil, fmt.Errorf("ipc: control request to %s: %w", owner, err)
		}
		return nil, fmt.Errorf("ipc: control request to %s: %w: %w", owner, rdma.ErrPeerDown, err)
	}
	rep, err := decodeReply(rb)
	if err != nil {
		return nil, err
	}
	if err := rep.err(owner); err != nil {
		return nil, err
	}
	return rep, nil
}

// begin acquires the export on its owner for one copy. When the owner asks
// for a same-host proof first, begin proves this node and retries.
func (c *Channel) begin(ctx context.Context, owner string, req *request) (*reply, error) {
	for attempt := 0; ; attempt++ {
		c.fmu.Lock()
		c.nextAcq++
		req.Acq = c.nextAcq
		gen := c.proofGen[owner]
		c.fmu.Unlock()
		rep, err := c.call(ctx, owner, req)
		if err == nil {
			return rep, nil
		}
		if errors.Is(err, rdma.ErrPeerDown) || ctx.Err() != nil {
			// The request may have reached the owner: end it, in case.
			_ = c.end(ctx, owner, req.Acq)
			return nil, err
		}
		if !errors.Is(err, ErrUnproven) || attempt > 0 {
			return nil, err
		}
		if err := c.prove(ctx, owner, gen); err != nil {
			return nil, err
		}
	}
}

// prove shows owner that this node runs on its host, unless another fetch
// did since gen.
func (c *Channel) prove(ctx context.Context, owner string, gen uint64) error {
	c.proofMu.Lock()
	defer c.proofMu.Unlock()
	c.fmu.Lock()
	done := c.proofGen[owner] != gen
	c.fmu.Unlock()
	if done {
		return nil
	}
	rep, err := c.call(ctx, owner, &request{Op: opChallenge})
	if err != nil {
		return err
	}
	mac, err := answerChallenge(c.cfg.ShmDir, rep.Path, c.env.Node)
	if err != nil {
		return err
	}
	if _, err := c.call(ctx, owner, &request{Op: opProve, Challenge: rep.Challenge, MAC: mac}); err != nil {
		return err
	}
	c.fmu.Lock()
	c.proofGen[owner]++
	c.fmu.Unlock()
	return nil
}

// end ends acquisition acq on owner, even when ctx is done. An error means
// the owner could not be told (it went down, or its channel closed, and
// then holds nothing for this node any more).
// endAsync ends an acquisition in the background; Close waits for it.
func (c *Channel) endAsync(owner string, acq uint64) {
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		if err := c.end(context.Background(), owner, acq); err != nil {
			c.log.Debug("ipc: ending a hold failed (the owner drops it with the peer)", zap.String("owner", owner), zap.Error(err))
		}
	}()
}

func (c *Channel) end(ctx context.Context, owner string, acq uint64) error {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	_, err := c.call(ectx, owner, &request{Op: opEnd, Acq: acq})
	return err
}

// lane is a stream of the channel with the events that track its chunks.
type lane struct {
	dev memory.Device
	s   *memory.Stream
	evs []*memory.Event
}

func newLane(dev memory.Device, window int) (*lane, error) {
	s, err := memory.NewStream(dev)
	if err != nil {
		return nil, fmt.Errorf("ipc: %w", err)
	}
	l := &lane{dev: dev, s: s}
	for range window {
		e, err := memory.NewEvent(dev)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("ipc: %w", err), l.close())
		}
		l.evs = append(l.evs, e)
	}
	return l, nil
}

func (l *lane) close() error {
	err := l.s.Close()
	for _, e := range l.evs {
		err = errors.Join(err, e.Close())
	}
	return err
}

// laneState says what to do with a lane after a copy.
type laneState int

const (
	laneReuse   laneState = iota // idle and healthy
	laneDiscard                  // idle, but a call failed on it: close it
	laneAbandon                  // copies still queued: never touch it again
)

func (c *Channel) getLane(dev memory.Device) (*lane, error) {
	c.fmu.Lock()
	if ls := c.lanes[dev]; len(ls) > 0 {
		l := ls[len(ls)-1]
		c.lanes[dev] = ls[:len(ls)-1]
		c.fmu.Unlock()
		return l, nil
	}
	c.nLanes++
	c.fmu.Unlock()
	l, err := newLane(dev, c.cfg.CopyWindow)
	if err != nil {
		c.fmu.Lock()
		c.nLanes--
		c.fmu.Unlock()
		return nil, err
	}
	return l, nil
}

func (c *Channel) putLane(l *lane, state laneState) {
	c.fmu.Lock()
	if state == laneAbandon {
		c.nLanes--
		c.fetchStats.abandoned++
		c.fmu.Unlock()
		c.log.Error("abandoning a CUDA stream whose copies did not finish", zap.Stringer("device", l.dev))
		return
	}
	if state == laneReuse && !c.fclosed && len(c.lanes[l.dev]) < c.cfg.IdleLanes {
		c.lanes[l.dev] = append(c.lanes[l.dev], l)
		c.fmu.Unlock()
		return
	}
	c.nLanes--
	c.fmu.Unlock()
	_ = l.close()
}

// copy copies src into dst in chunks, keeping up to len(l.evs) chunks
// queued, and waits by polling events so that ctx is honoured. A chunk is
// queued only once p.Ready says the source holds it, and p.Landed is told
// as each one completes. (Smaller chunks for such streamed copies lose:
// 2xH200, 3 processes on one GPU following one fetch of 1 GiB, chunks of
// 64 / 16 / 8 / 4 MiB: 3456 / 4030 / 5493 / 19940 us, as the GPU
// switches between the processes' contexts at every chunk.) On failure
// or cancellation it stops queuing and waits, up to CancelGrace, for the
// queued chunks: the buffers are not in use by the device when it returns,
// unless it reports laneAbandon.
func (c *Channel) copy(ctx context.Context, l *lane, dst, src memory.Buffer, p rdma.Progress) (laneState, error) {
	n := src.Len()
	type queued struct {
		ev  *memory.Event
		end int // the chunk's end in dst
	}
	var (
		q     []queued
		ei    int
		off   int
		avail int64 // what the source holds, as far as p told
		err   error
	)
	for err == nil && (off < n || len(q) > 0) {
		for off < n && len(q) < len(l.evs) {
			if err = ctx.Err(); err != nil {
				break
			}
			m := min(c.cfg.CopyChunk, n-off)
			if int64(off+m) > avail {
				if avail, err = p.Await(ctx, int64(off+m)); err != nil {
					break
				}
			}
			d, derr := dst.Slice(off, m)
			s, serr := src.Slice(off, m)
			if err = errors.Join(derr, serr); err != nil {
				break
			}
			if err = l.s.CopyAsync(d, s); err != nil {
				break
			}
			ev := l.evs[ei]
			ei = (ei + 1) % len(l.evs)
			if err = l.s.Record(ev); err != nil {
				break
			}
			off += m
			q = append(q, queued{ev, off})
		}
		if err != nil || len(q) == 0 {
			break
		}
		if err = waitEvent(ctx, q[0].ev, time.Time{}); err != nil {
			break
		}
		if p.Landed != nil {
			p.Landed(int64(q[0].end))
		}
		q = q[1:]
	}
	if err == nil {
		return laneReuse, nil
	}
	if ctx.Err() == nil || !(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		err = fmt.Errorf("ipc: copy: %w", err)
	}
	// Wait for everything queued so far before the buffers may be reused.
	last := l.evs[ei]
	if rerr := l.s.Record(last); rerr != nil {
		return laneAbandon, errors.Join(err, fmt.Errorf("ipc: %w", rerr))
	}
	if werr := waitEvent(context.Background(), last, time.Now().Add(c.cfg.CancelGrace)); werr != nil {
		return laneAbandon, errors.Join(err, werr)
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return laneReuse, err
	}
	return laneDiscard, err
}

// waitEvent polls ev until it completes, ctx (when not nil) is done, or
// the deadline (when not zero) passes. It spins (yielding the processor)
// for the first spinFor, since a chunk takes well under a millisecond over
// NVLink and a sleep would add more than that, then sleeps with a growing
// pause.
func waitEvent(ctx context.Context, ev *memory.Event, deadline time.Time) error {
	const spinFor = 2 * time.Millisecond
	start := time.Now()
	pause := 20 * time.Microsecond
	for {
		done, err := ev.Query()
		if err != nil {
			return fmt.Errorf("ipc: %w", err)
		}
		if done {
			return nil
		}
		if ctx != nil {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		now := time.Now()
		if !deadline.IsZero() && now.After(deadline) {
			return errStuck
		}
		if now.Sub(start) < spinFor {
			runtime.Gosched()
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}
