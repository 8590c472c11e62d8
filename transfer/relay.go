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
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tinylib/msgp/msgp"
	"go.uber.org/zap"
)

// RelayChannel is the name under which Stats counts the bytes a node
// copied from its own copy of a content instead of fetching them again
// (fan-out by relay, relay.go).
const RelayChannel = "relay"

// RelayPushChannel is the name under which Stats counts the bytes another
// receiver of the same content wrote into this node's destination
// (relay by push, Flow.NoRelayPush).
const RelayPushChannel = "relay-push"

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
	src   *tensor.Tensor     // the leader's destination; read only after ready (if err is nil) or up to landed
	err   error
	// landed counts the bytes of src that hold their copy, from its
	// start, as the leader's fetch reports them (rdma.Progress.Landed);
	// grew is closed (and replaced) when it grows. Under mu.
	mu     sync.Mutex
	landed int64
	grew   chan struct{}
	// copies counts the followers that joined and the loans of the
	// destination (or its chunks) to other nodes, under relays.mu; idle
	// is closed when it drops to 0. The leader's destination
	// stays unchanged (neither delivered nor freed) until they copied it.
	copies int
	idle   chan struct{}
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
	// started is closed (and replaced) when a flight starts or an
	// expected one is withdrawn, for relay requests waiting for theirs.
	started chan struct{}
	// expected counts, by content, the messages this node received whose
	// fetch will lead a flight of it and has not started: a relay request
	// for such a content waits for the flight instead of giving up after
	// relayGrace.
	expected map[relayKey]int

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
		f.copies++
		f.joined++
		e.relays.mu.Unlock()
		err := e.follow(ctx, f, d, dst)
		e.relays.copied(f)
		if err == nil {
			return nil
		}
		return e.fetchInto(ctx, d, dst) // the leader failed: from the owner
	}
	f := &relayFlight{d: d, ready: make(chan struct{}), src: dst}
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
	err := e.fetchRelayed(ctx, d, dst, f)
	f.err = err
	close(f.ready)
	// Others may still join a flight that succeeded (a loan of its next
	// chunk, a late message of the same content) until every copy ended;
	// then it leaves the map under the same lock, and nothing joins it.
	// A failed one leaves at once: fetches from now on lead again.
	e.relays.mu.Lock()
	if err != nil && e.relays.m[k] == f {
		delete(e.relays.m, k)
	}
	for f.copies > 0 {
		if f.idle == nil {
			f.idle = make(chan struct{})
		}
		idle := f.idle
		e.relays.mu.Unlock()
		<-idle
		e.relays.mu.Lock()
	}
	if e.relays.m[k] == f {
		delete(e.relays.m, k)
	}
	delete(e.relays.lending, dst)
	e.relays.mu.Unlock()
	return err
}

// copied ends one copy of f (a follower's, or a loan to another node).
func (r *relays) copied(f *relayFlight) {
	r.mu.Lock()
	r.copiedLocked(f)
	r.mu.Unlock()
}

// copiedLocked is copied with r.mu held.
func (r *relays) copiedLocked(f *relayFlight) {
	if f.copies--; f.copies == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// fetchRelayed fetches d into dst from the receiver the owner named
// (d.Relay), or from the owner when there is none or it cannot serve,
// telling f (the flight dst belongs to; nil: none) as dst fills.
func (e *Engine) fetchRelayed(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, f *relayFlight) error {
	var p rdma.Progress
	if f != nil && !e.cfg.Flow.NoRelayStream {
		p.Landed = f.land
	}
	if from := e.namedRelay(d); from != "" && e.relayEligible(d) {
		err := e.relayed(from, d, e.fromHolder(ctx, d, dst, f, p))
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return e.fetchStream(ctx, d, dst, p)
}

// namedRelay returns the receiver the owner named in d to fetch from, if
// that is another node than this one and the owner; "" otherwise.
func (e *Engine) namedRelay(d *tensor.Descriptor) string {
	if d.Relay == e.cfg.Node || d.Relay == d.Owner {
		return ""
	}
	return d.Relay
}

// relayed counts how a fetch of d from the receiver from ended (err),
// and returns err.
func (e *Engine) relayed(from string, d *tensor.Descriptor, err error) error {
	if err == nil {
		e.stats.relayFetched.Add(1)
		return nil
	}
	e.stats.relayFallbacks.Add(1)
	e.log.Debug("relay: fetching from the owner", zap.String("relay", from), zap.Stringer("descriptor", d), zap.Error(err))
	return err
}

// land records that f's destination holds its first n bytes (f may be
// nil; n never shrinks it).
func (f *relayFlight) land(n int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	if n > f.landed {
		f.landed = n
		if f.grew != nil {
			close(f.grew)
			f.grew = nil
		}
	}
	f.mu.Unlock()
}

// waitLanded waits until f's destination holds at least its first n
// bytes, and returns how many it holds: all of them once f's fetch ended
// well, else f's error.
func (f *relayFlight) waitLanded(ctx context.Context, n int64) (int64, error) {
	for {
		f.mu.Lock()
		if f.landed >= n {
			l := f.landed
			f.mu.Unlock()
			return l, nil
		}
		if f.grew == nil {
			f.grew = make(chan struct{})
		}
		grew := f.grew
		f.mu.Unlock()
		select {
		case <-grew:
		case <-f.ready:
			if f.err != nil {
				return 0, f.err
			}
			return f.d.Bytes, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Relay request operations (relayAsk.op).
const (
	relayWhole    = 0 // lend your copy once it is whole
	relayStream   = 1 // lend your copy now; the asker follows its progress
	relayProgress = 2 // answer, once your copy holds its first n bytes, how many it holds
	relayPush     = 3 // write your copy into the destination I lend you (relayAsk.rd), as it fills
)

// askHolder asks node from to lend its copy of d's content (op
// relayWhole or relayStream), and returns the descriptor of that copy,
// lent to this node.
func (e *Engine) askHolder(ctx context.Context, from string, d *tensor.Descriptor, op uint64) (*tensor.Descriptor, error) {
	resp, err := e.control(ctx, from, relayTarget, encodeRelayAsk(relayAsk{op: op, d: contentOf(d)}))
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("transfer: relay %s answered: %w", from, err)
	}
	if hd.Owner != from || !sameContent(d, &hd) {
		_ = e.release(ctx, &hd)
		return nil, fmt.Errorf("transfer: relay %s answered %v for %v", from, &hd, d)
	}
	return &hd, nil
}

// askProgress asks node from how much of its copy of d's content it
// holds, once it holds at least n bytes.
func (e *Engine) askProgress(ctx context.Context, from string, d *tensor.Descriptor, n int64) (int64, error) {
	resp, err := e.control(ctx, from, relayTarget, encodeRelayAsk(relayAsk{op: relayProgress, n: n, d: contentOf(d)}))
	if err != nil {
		return 0, err
	}
	l, rest, err := msgp.ReadInt64Bytes(resp)
	if err == nil && (len(rest) != 0 || l < n || l > d.Bytes) {
		err = fmt.Errorf("%d bytes held of %d, asked for %d", l, d.Bytes, n)
	}
	if err != nil {
		return 0, fmt.Errorf("transfer: relay %s answered: %w", from, err)
	}
	return l, nil
}

// contentOf returns what a relay request says of d: its content, without
// lease, export or offers.
func contentOf(d *tensor.Descriptor) *tensor.Descriptor {
	return &tensor.Descriptor{Owner: d.Owner, Incarnation: d.Incarnation, DType: d.DType, Shape: d.Shape,
		Bytes: d.Bytes, Device: d.Device, Content: d.Content}
}

// relayAsk is a relay request: an operation, its count of bytes (n,
// relayProgress only), the content's descriptor (contentOf) and, for
// relayPush, the descriptor of the asker's destination, lent to the node
// asked (rd).
type relayAsk struct {
	op uint64
	n  int64
	d  *tensor.Descriptor
	rd *tensor.Descriptor
}

// encodeRelayAsk writes a relay request: op and n as msgpack integers,
// then the descriptor, then rd (relayPush only).
func encodeRelayAsk(a relayAsk) []byte {
	b, _ := a.d.MarshalMsg(msgp.AppendInt64(msgp.AppendUint64(nil, a.op), a.n)) // appending never fails
	if a.op == relayPush {
		b, _ = a.rd.MarshalMsg(b)
	}
	return b
}

// decodeRelayAsk reads a relay request from a peer, checking it: a known
// operation, a valid descriptor with a content, for relayProgress a
// count within it, and for relayPush a valid destination of the
// content's size. (Whose destination, lent to whom, serveRelay checks.)
func decodeRelayAsk(b []byte) (relayAsk, error) {
	var a relayAsk
	var err error
	if a.op, b, err = msgp.ReadUint64Bytes(b); err == nil {
		a.n, b, err = msgp.ReadInt64Bytes(b)
	}
	var d tensor.Descriptor
	if err == nil {
		b, err = d.UnmarshalMsg(b)
	}
	if err == nil && a.op == relayPush {
		a.rd = &tensor.Descriptor{}
		if b, err = a.rd.UnmarshalMsg(b); err == nil {
			err = a.rd.Validate()
		}
		if err != nil {
			err = fmt.Errorf("the destination: %w", err)
		}
	}
	if err == nil && len(b) != 0 {
		err = fmt.Errorf("%w: %d bytes after it", tensor.ErrBadDescriptor, len(b))
	}
	if err == nil {
		err = d.Validate()
	}
	switch {
	case err != nil:
	case d.Content == 0:
		err = errors.New("no content")
	case a.op > relayPush:
		err = fmt.Errorf("operation %d", a.op)
	case a.op == relayPush && a.rd.Bytes != d.Bytes:
		err = fmt.Errorf("a destination of %d bytes for %d", a.rd.Bytes, d.Bytes)
	case a.op == relayProgress && (a.n <= 0 || a.n > d.Bytes):
		err = fmt.Errorf("progress to %d bytes of %d", a.n, d.Bytes)
	case a.op != relayProgress && a.n != 0:
		err = fmt.Errorf("operation %d with a count (%d)", a.op, a.n)
	}
	if err != nil {
		return relayAsk{}, fmt.Errorf("transfer: bad relay request: %w", err)
	}
	a.d = &d
	return a, nil
}

// fetchFromHolder asks d.Relay for its copy of d's content and fetches it
// into dst, following that copy as it fills unless Flow.NoRelayStream,
// then gives that copy's lease back.
func (e *Engine) fetchFromHolder(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, p rdma.Progress) error {
	if p := e.peer(d.Relay); p == nil || !p.relay {
		return fmt.Errorf("%w: relay %s", ErrPeerDown, d.Relay)
	}
	op := uint64(relayWhole)
	if !e.cfg.Flow.NoRelayStream {
		op = relayStream
		p.Ready = func(ctx context.Context, n int64) (int64, error) { return e.askProgress(ctx, d.Relay, d, n) }
	}
	hd, err := e.askHolder(ctx, d.Relay, d, op)
	if err != nil {
		return err
	}
	err = e.fetchStream(ctx, hd, dst, p)
	_ = e.release(ctx, hd)
	return err
}

// serveRelay answers a relay request of peer (relayTarget): it lends
// this node's copy of the content to peer once it is whole (relayWhole)
// or at once (relayStream), or tells how much of it landed
// (relayProgress). The copy's flight does not deliver it (nor free it)
// until every such loan ended.
func (e *Engine) serveRelay(ctx context.Context, peer string, req []byte) ([]byte, error) {
	a, err := decodeRelayAsk(req)
	if err != nil {
		return nil, err
	}
	if a.op == relayPush {
		return e.servePush(ctx, peer, a)
	}
	if a.op == relayProgress {
		f := e.relays.flight(a.d)
		if f == nil {
			return nil, fmt.Errorf("%w: %v content %d", ErrNotHeld, a.d, a.d.Content)
		}
		l, err := f.waitLanded(ctx, a.n)
		if err != nil {
			return nil, fmt.Errorf("transfer: relay: this node's fetch failed: %w", err)
		}
		return msgp.AppendInt64(nil, l), nil
	}
	f, err := e.joinFlight(ctx, a.d)
	if err != nil {
		return nil, err
	}
	// One copy joined f: done when the loan below ends, or now if none
	// is made.
	if a.op == relayWhole {
		if _, err := f.waitLanded(ctx, a.d.Bytes); err != nil {
			e.relays.copied(f)
			return nil, fmt.Errorf("transfer: relay: this node's fetch failed: %w", err)
		}
	}
	x, hd, err := e.store.Export(f.src, peer, e.cfg.Flow.TransferTimeout)
	if err != nil {
		e.relays.copied(f)
		return nil, err
	}
	e.offer(x, peer, hd)
	e.stats.relayServed.Add(1)
	e.relays.publish()
	return hd.MarshalMsg(nil)
}

// publish orders what a relay answer read of a lent tensor (its buffer,
// its size) before the end of the loan, which the asker's release
// brings back through a socket, a path the race detector does not see:
// the end runs relayExportEnded under r.mu, and so does this.
func (r *relays) publish() {
	r.mu.Lock()
	//lint:ignore SA2001 an empty critical section: its ordering is the point
	r.mu.Unlock()
}

// expectRelay counts (delta 1) or withdraws (-1) a message whose fetch
// of d will lead a flight of d's content (relays.expected).
func (e *Engine) expectRelay(d *tensor.Descriptor, delta int) {
	k := relayKey{d.Owner, d.Incarnation, d.Content}
	r := &e.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expected == nil {
		r.expected = map[relayKey]int{}
	}
	if r.expected[k] += delta; r.expected[k] <= 0 {
		delete(r.expected, k)
		if r.started != nil {
			close(r.started)
			r.started = nil
		}
	}
}

// joinFlight returns the flight of d's content on this node, joined as
// one more copy (done when the lease of that copy ends), waiting for it
// to start while a message of this node is about to fetch it, else
// relayGrace at most.
func (e *Engine) joinFlight(ctx context.Context, d *tensor.Descriptor) (*relayFlight, error) {
	k := relayKey{d.Owner, d.Incarnation, d.Content}
	var grace <-chan time.Time
	for {
		e.relays.mu.Lock()
		f := e.relays.m[k]
		if f != nil && d.Content != 0 && sameContent(f.d, d) {
			f.copies++
			f.joined++
			e.relays.mu.Unlock()
			return f, nil
		}
		if f != nil || d.Content == 0 {
			e.relays.mu.Unlock()
			return nil, fmt.Errorf("%w: %v content %d", ErrNotHeld, d, d.Content)
		}
		expected := e.relays.expected[k] > 0
		if e.relays.started == nil {
			e.relays.started = make(chan struct{})
		}
		started := e.relays.started
		e.relays.mu.Unlock()
		var g <-chan time.Time // nil while expected: no grace
		if !expected {
			if grace == nil {
				t := time.NewTimer(time.Duration(relayGrace.Load()))
				defer t.Stop()
				grace = t.C
			}
			g = grace
		}
		select {
		case <-started:
		case <-g:
			return nil, fmt.Errorf("%w: %v content %d", ErrNotHeld, d, d.Content)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// flight returns the flight of d's content on this node, not joined;
// nil when there is none.
func (r *relays) flight(d *tensor.Descriptor) *relayFlight {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.m[relayKey{d.Owner, d.Incarnation, d.Content}]; f != nil && sameContent(f.d, d) {
		return f
	}
	return nil
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
		r.copiedLocked(f)
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

// follow copies f's content into dst as f's leader's destination fills
// (once it is whole when Flow.NoRelayStream).
func (e *Engine) follow(ctx context.Context, f *relayFlight, d *tensor.Descriptor, dst *tensor.Tensor) error {
	start := time.Now()
	step := int64(1)
	if e.cfg.Flow.NoRelayStream {
		step = d.Bytes
	}
	for off := int64(0); off < d.Bytes; {
		end, err := f.waitLanded(ctx, min(off+step, d.Bytes))
		if err != nil {
			return err
		}
		s, err := f.src.Buffer().Slice(int(off), int(end-off))
		var t memory.Buffer
		if err == nil {
			t, err = dst.Buffer().Slice(int(off), int(end-off))
		}
		if err == nil {
			err = memory.Copy(ctx, t, s)
		}
		if err != nil {
			return err
		}
		off = end
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

// mayPush reports whether this node has the receiver the owner named
// (from) write its copy into dst instead of copying it from there
// (unless Flow.NoRelayPush; with streaming on): when from is another node whose
// GPU is dst's, whose copies from dst's node would make that GPU switch
// between the two processes' contexts at every piece (2xH200, 3 nodes on
// one GPU, 256 MiB: 1.34 ms streamed, 0.79 ms in a probe where one
// process wrote the others' buffers).
func (e *Engine) mayPush(from string, dst *tensor.Tensor) bool {
	if e.cfg.Flow.NoRelayPush || e.cfg.Flow.NoRelayStream || from == "" || from == e.cfg.Node {
		return false
	}
	p := e.peer(from)
	mine := e.caps.DeviceUUID(dst.Device())
	return p != nil && p.relay && mine != "" && len(p.caps.Devices) > 0 && p.caps.Devices[0].UUID == mine
}

// fromHolder copies d's content into dst from the receiver the owner
// named (d.Relay): written by it (pushFromHolder) when mayPush and dst is
// a flight's destination (f; a destination the caller gave is being
// written, tensor.Tensor.Write, and cannot be lent), else, or when that
// fails, fetched from it (fetchFromHolder).
func (e *Engine) fromHolder(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, f *relayFlight, p rdma.Progress) error {
	if f != nil && e.mayPush(d.Relay, dst) {
		err := e.pushFromHolder(ctx, d, dst, f, p)
		if err == nil || ctx.Err() != nil {
			return err
		}
		e.log.Debug("relay: push refused or failed, fetching from the holder", zap.String("relay", d.Relay), zap.Stringer("descriptor", d), zap.Error(err))
	}
	return e.fetchFromHolder(ctx, d, dst, p)
}

// pushFromHolder lends dst to d.Relay (the holder) and asks it to write
// its copy of d's content there as that copy fills (relayPush), then
// tells p.Landed that dst is whole. The loan is one more copy of f (dst's
// flight: relayExportEnded counts every export of a flight's destination
// as one), so dst is neither delivered nor freed before it ended. The holder gives the loan back once its put ended; this node
// ends it too once the holder answered or went down, but not when this
// fetch's context ended first: the holder may still be writing, and the
// loan then ends with its put (or its going down, or the lease).
func (e *Engine) pushFromHolder(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, f *relayFlight, p rdma.Progress) error {
	from := d.Relay
	if pr := e.peer(from); pr == nil || !pr.relay {
		return fmt.Errorf("%w: relay %s", ErrPeerDown, from)
	}
	start := time.Now()
	e.relays.mu.Lock()
	f.copies++
	e.relays.mu.Unlock()
	x, rd, err := e.store.Export(dst, from, e.cfg.Flow.TransferTimeout)
	if err != nil {
		e.relays.copied(f)
		return fmt.Errorf("transfer: relay push: %w", err)
	}
	e.offer(x, from, rd)
	resp, err := e.control(ctx, from, relayTarget, encodeRelayAsk(relayAsk{op: relayPush, d: contentOf(d), rd: rd}))
	if ctx.Err() == nil {
		// The holder answered (it writes dst no more) or went down (its
		// leases end too): end the loan, unless its release came first.
		_ = e.store.Release(x.ID, x.Lease)
	}
	if err == nil && len(resp) != 0 {
		err = fmt.Errorf("%d bytes of answer", len(resp))
	}
	if err != nil {
		return fmt.Errorf("transfer: relay %s: push: %w", from, err)
	}
	e.stats.relayPushed.Add(1)
	e.stats.addBytes(from, RelayPushChannel, d.Bytes, time.Since(start))
	if p.Landed != nil {
		p.Landed(d.Bytes)
	}
	return nil
}

// servePush answers a relayPush request of peer: it writes this node's
// copy of a.d's content into a.rd, a destination peer lent this node,
// each piece once that copy holds it, through the channel between the two
// (which must write: rdma.Putter), then gives the loan back. The copy's
// flight is neither delivered nor freed until the put ended.
func (e *Engine) servePush(ctx context.Context, peer string, a relayAsk) ([]byte, error) {
	if a.rd.Owner != peer || a.rd.Holder != e.cfg.Node {
		return nil, fmt.Errorf("transfer: bad relay push from %s: a destination of %s lent to %q", peer, a.rd.Owner, a.rd.Holder)
	}
	err := e.putInto(ctx, a)
	_ = e.release(ctx, a.rd)
	if err != nil {
		return nil, fmt.Errorf("transfer: relay push to %s: %w", peer, err)
	}
	e.stats.relayServed.Add(1)
	return []byte{}, nil
}

// putInto writes this node's copy of a.d's content into a.rd as it fills.
func (e *Engine) putInto(ctx context.Context, a relayAsk) error {
	f, err := e.joinFlight(ctx, a.d)
	if err != nil {
		return err
	}
	defer e.relays.copied(f) // after the put: f.src stays unchanged until then
	name, ch, err := e.route(a.rd, f.src.Device())
	if err != nil {
		return err
	}
	put, ok := ch.(rdma.Putter)
	if !ok {
		return fmt.Errorf("channel %s does not write into a peer's memory", name)
	}
	return put.PutStream(ctx, a.rd, f.src.Buffer(), rdma.Progress{Ready: f.waitLanded})
}
