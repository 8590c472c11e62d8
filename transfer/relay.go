package transfer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// RelayChannel is the name under which Stats counts the bytes a node
// copied from its own copy of a content instead of fetching them again
// (fan-out by relay, relay.go).
const RelayChannel = "relay"

// relayKey names one content: what descriptors with the same key lend is
// the same bytes (tensor.Descriptor.Content).
type relayKey struct {
	owner       string
	incarnation uint64
	content     uint64
}

// relayFlight is a fetch of one content in progress on this node, which
// later fetches of that content join instead of crossing the link again.
type relayFlight struct {
	d     *tensor.Descriptor // the leader's: followers must match its type
	ready chan struct{}      // closed when the leader's fetch ended
	src   *tensor.Tensor     // the leader's destination; read only after ready, if err is nil
	err   error
	// copies counts the followers that joined: the leader's destination
	// stays unchanged (neither delivered nor freed) until they copied it.
	copies sync.WaitGroup
	joined int // followers that joined, under relays.mu (for tests)
}

// relays is a node's fan-out by relay: as receiver, its fetches of
// contents in flight and the copies it lends from them to other receivers;
// as owner, the receivers of each content it lends, in order, which its
// plan places in a tree.
type relays struct {
	mu sync.Mutex
	m  map[relayKey]*relayFlight
	// lending maps a flight's destination to its flight while this node
	// lends it to other receivers: each export of it that ends is one
	// copy done (every export of a destination is a relay's).
	lending map[*tensor.Tensor]*relayFlight
	// started is closed (and replaced) when a flight starts, for relay
	// requests waiting for theirs (relayGrace).
	started chan struct{}

	// The owner's side: the receivers of each content lent now, and which
	// content each export lends.
	lent     map[uint64]*lentContent
	byExport map[uint64]uint64
	gpus     map[string]int // GPU UUID → a small number for PlanRelay
}

// lentContent is one content this node lends to several receivers.
type lentContent struct {
	members []RelayMember // in the order of their first export
	live    int           // exports of it not ended
}

// relayTarget is the Target of a relay request: a control request to a
// receiver the owner named (Descriptor.Relay) for its copy of a content.
// Its body is the content's descriptor without lease, export or offers;
// the answer is the descriptor of the receiver's copy, lent to the asker.
const relayTarget = "$relay"

// ErrNotHeld: a node asked for its copy of a content does not hold one
// (it never received it, or delivered it already).
var ErrNotHeld = errors.New("transfer: content not held here")

// relayGrace is how long a relay request waits for its content's fetch
// to start on the node asked: the owner lent the content to both about
// at once, and the asker may be quicker. Past it the asker fetches from
// the owner.
var relayGrace atomic.Int64 // nanoseconds

func init() { relayGrace.Store(int64(5 * time.Millisecond)) }

// relayEligible reports whether a fetch of d may lead or join a relay.
func (e *Engine) relayEligible(d *tensor.Descriptor) bool {
	return !e.cfg.Flow.NoRelay && d.Content != 0 && d.Bytes >= e.cfg.Flow.RelayMinBytes
}

// mayRelay reports whether one of in's fetches may lead or join a relay:
// such a message is fetched on a goroutine of its own, not on the reader
// or the delivery loop, so that the peer's next messages, which may lend
// the same content, are read and join its fetch instead of waiting for
// it. (What that costs, a goroutine's start, is small beside a transfer
// of RelayMinBytes.)
func (in *Incoming) mayRelay() bool {
	if in == nil {
		return false
	}
	for _, j := range in.jobs {
		if in.e.relayEligible(j.d) {
			return true
		}
	}
	return false
}

// fetchShared is fetchInto for a descriptor whose content this node may
// already be fetching: the first fetch of a content (the leader) goes to
// the owner; a fetch that starts while it runs (a follower) waits for it
// and copies the leader's destination on this node, device to device. The
// leader returns only once its followers have copied, so its destination
// is neither delivered (and written by its actor) nor freed before. A
// follower whose leader failed, or whose copy fails, fetches from the
// owner. Each fetch keeps its own descriptor, whose lease is released to
// the owner as any other.
func (e *Engine) fetchShared(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if !e.relayEligible(d) {
		return e.fetchInto(ctx, d, dst)
	}
	k := relayKey{d.Owner, d.Incarnation, d.Content}
	e.relays.mu.Lock()
	if f := e.relays.m[k]; f != nil && sameContent(f.d, d) {
		f.copies.Add(1)
		f.joined++
		e.relays.mu.Unlock()
		err := e.follow(ctx, f, d, dst)
		f.copies.Done()
		if err == nil {
			return nil
		}
		return e.fetchInto(ctx, d, dst) // the leader failed: from the owner
	}
	f := &relayFlight{d: d, ready: make(chan struct{})}
	if e.relays.m == nil {
		e.relays.m = map[relayKey]*relayFlight{}
		e.relays.lending = map[*tensor.Tensor]*relayFlight{}
	}
	e.relays.m[k] = f
	e.relays.lending[dst] = f
	if e.relays.started != nil {
		close(e.relays.started)
		e.relays.started = nil
	}
	e.relays.mu.Unlock()
	err := e.fetchRelayed(ctx, d, dst)
	f.src, f.err = dst, err
	close(f.ready)
	e.relays.mu.Lock()
	if e.relays.m[k] == f {
		delete(e.relays.m, k)
	}
	e.relays.mu.Unlock()
	f.copies.Wait() // no follower joins f any more; every copy lent ended
	e.relays.mu.Lock()
	delete(e.relays.lending, dst)
	e.relays.mu.Unlock()
	return err
}

// fetchRelayed fetches d into dst from the receiver the owner named
// (d.Relay), or from the owner when there is none or it cannot serve.
func (e *Engine) fetchRelayed(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if d.Relay != "" && d.Relay != e.cfg.Node && d.Relay != d.Owner && e.relayEligible(d) {
		err := e.fetchFromHolder(ctx, d, dst)
		if err == nil {
			e.stats.relayFetched.Add(1)
			return nil
		}
		e.stats.relayFallbacks.Add(1)
		e.log.Debug("relay: fetching from the owner", zap.String("relay", d.Relay), zap.Stringer("descriptor", d), zap.Error(err))
		if ctx.Err() != nil {
			return err
		}
	}
	return e.fetchInto(ctx, d, dst)
}

// fetchFromHolder asks d.Relay for its copy of d's content and fetches it
// into dst, then gives that copy's lease back.
func (e *Engine) fetchFromHolder(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if p := e.peer(d.Relay); p == nil || !p.relay {
		return fmt.Errorf("%w: relay %s", ErrPeerDown, d.Relay)
	}
	ask := tensor.Descriptor{Owner: d.Owner, Incarnation: d.Incarnation, DType: d.DType, Shape: d.Shape,
		Bytes: d.Bytes, Device: d.Device, Content: d.Content}
	body, err := ask.MarshalMsg(nil)
	if err != nil {
		return err
	}
	resp, err := e.control(ctx, d.Relay, relayTarget, body)
	if err != nil {
		return err
	}
	var hd tensor.Descriptor
	rest, err := hd.UnmarshalMsg(resp)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %d bytes after it", tensor.ErrBadDescriptor, len(rest))
	}
	if err == nil {
		err = hd.Validate()
	}
	if err != nil {
		return fmt.Errorf("transfer: relay %s answered: %w", d.Relay, err)
	}
	if hd.Owner != d.Relay || !sameContent(d, &hd) {
		_ = e.release(ctx, &hd)
		return fmt.Errorf("transfer: relay %s answered %v for %v", d.Relay, &hd, d)
	}
	err = e.fetchInto(ctx, &hd, dst)
	_ = e.release(ctx, &hd)
	return err
}

// serveRelay answers a relay request of peer (relayTarget): once this
// node's fetch of the content ended, it lends its copy to peer. The
// copy's flight does not deliver it (nor free it) until that lease ends.
func (e *Engine) serveRelay(ctx context.Context, peer string, req []byte) ([]byte, error) {
	var d tensor.Descriptor
	rest, err := d.UnmarshalMsg(req)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %d bytes after it", tensor.ErrBadDescriptor, len(rest))
	}
	if err == nil {
		err = d.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("transfer: bad relay request: %w", err)
	}
	f, err := e.joinFlight(ctx, &d)
	if err != nil {
		return nil, err
	}
	select {
	case <-f.ready:
	case <-ctx.Done():
		f.copies.Done()
		return nil, ctx.Err()
	}
	if f.err != nil {
		f.copies.Done()
		return nil, fmt.Errorf("transfer: relay: this node's fetch failed: %w", f.err)
	}
	x, hd, err := e.store.Export(f.src, peer, e.cfg.Flow.TransferTimeout)
	if err != nil {
		f.copies.Done()
		return nil, err
	}
	e.offer(x, peer, hd)
	e.stats.relayServed.Add(1)
	return hd.MarshalMsg(nil)
}

// joinFlight returns the flight of d's content on this node, joined as
// one more copy (done when the lease of that copy ends), waiting
// relayGrace at most for it to start.
func (e *Engine) joinFlight(ctx context.Context, d *tensor.Descriptor) (*relayFlight, error) {
	k := relayKey{d.Owner, d.Incarnation, d.Content}
	var grace <-chan time.Time
	for {
		e.relays.mu.Lock()
		f := e.relays.m[k]
		if f != nil && d.Content != 0 && sameContent(f.d, d) {
			f.copies.Add(1)
			f.joined++
			e.relays.mu.Unlock()
			return f, nil
		}
		if f != nil || d.Content == 0 {
			e.relays.mu.Unlock()
			return nil, fmt.Errorf("%w: %v content %d", ErrNotHeld, d, d.Content)
		}
		if e.relays.started == nil {
			e.relays.started = make(chan struct{})
		}
		started := e.relays.started
		e.relays.mu.Unlock()
		if grace == nil {
			t := time.NewTimer(time.Duration(relayGrace.Load()))
			defer t.Stop()
			grace = t.C
		}
		select {
		case <-started:
		case <-grace:
			return nil, fmt.Errorf("%w: %v content %d", ErrNotHeld, d, d.Content)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// planRelay is the owner's side: x lends its tensor to peer with
// descriptor d; when other receivers hold or fetch the same content,
// d.Relay names the one to fetch from (PlanRelay, the receivers in the
// order they were first lent it).
func (e *Engine) planRelay(peer string, x *tensor.Export, d *tensor.Descriptor) {
	if !e.relayEligible(d) {
		return
	}
	p := e.peer(peer)
	if p == nil || !p.relay {
		return
	}
	r := &e.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lent == nil {
		r.lent, r.byExport, r.gpus = map[uint64]*lentContent{}, map[uint64]uint64{}, map[string]int{}
	}
	c := r.lent[d.Content]
	if c == nil {
		c = &lentContent{}
		r.lent[d.Content] = c
	}
	c.live++
	r.byExport[x.ID] = d.Content
	if slices.ContainsFunc(c.members, func(m RelayMember) bool { return m.Node == peer }) {
		return // that node's own relay joins its first fetch
	}
	me := RelayMember{Node: peer, Host: p.caps.HostID, GPU: r.gpu("")}
	if len(p.caps.Devices) > 0 {
		me.GPU = r.gpu(p.caps.Devices[0].UUID)
	}
	c.members = append(c.members, me)
	owner := RelayMember{Node: e.cfg.Node, Host: e.caps.HostID, GPU: r.gpu(e.caps.DeviceUUID(x.Tensor.Device()))}
	if i := PlanRelay(owner, c.members, e.cfg.Flow.RelayFanout)[len(c.members)-1]; i != RelayOwner {
		d.Relay = c.members[i].Node
	}
}

// gpu numbers GPU UUIDs for PlanRelay; "" (host memory, or unknown) is
// -1. r.mu is held.
func (r *relays) gpu(uuid string) int {
	if uuid == "" {
		return -1
	}
	n, ok := r.gpus[uuid]
	if !ok {
		n = len(r.gpus)
		r.gpus[uuid] = n
	}
	return n
}

// relayExportEnded is the relay's part of the store's OnEnd hook: an
// owner's export of a lent content, or a receiver's loan of its copy,
// ended.
func (e *Engine) relayExportEnded(x *tensor.Export) {
	r := &e.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.lending[x.Tensor]; f != nil {
		f.copies.Done()
	}
	c, ok := r.byExport[x.ID]
	if !ok {
		return
	}
	delete(r.byExport, x.ID)
	if lc := r.lent[c]; lc != nil {
		if lc.live--; lc.live <= 0 {
			delete(r.lent, c)
		}
	}
}

// follow copies f's content into dst once f's leader has it.
func (e *Engine) follow(ctx context.Context, f *relayFlight, d *tensor.Descriptor, dst *tensor.Tensor) error {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.err != nil {
		return f.err
	}
	start := time.Now()
	if err := memory.Copy(ctx, dst.Buffer(), f.src.Buffer()); err != nil {
		return err
	}
	e.stats.addBytes(d.Owner, RelayChannel, d.Bytes, time.Since(start))
	return nil
}

// sameContent reports whether b, with a's content key, also has a's type:
// a descriptor that says otherwise is not trusted to name a's bytes.
func sameContent(a, b *tensor.Descriptor) bool {
	return a.DType == b.DType && a.Bytes == b.Bytes && slices.Equal(a.Shape, b.Shape)
}

// relayJoined returns how many followers joined the flight of content c
// of owner now in flight (-1: none in flight), for tests.
func (e *Engine) relayJoined(owner string, incarnation, c uint64) int {
	e.relays.mu.Lock()
	defer e.relays.mu.Unlock()
	if f := e.relays.m[relayKey{owner, incarnation, c}]; f != nil {
		return f.joined
	}
	return -1
}
