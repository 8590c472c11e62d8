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
	"github.com/tinylib/msgp/msgp"
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
	src   *tensor.Tensor     // the leader's destination; read only after ready (if err is nil) or up to landed
	err   error
	// landed counts the bytes of src fetched from its start, when the
	// leader fetches in chunks (Flow.RelayChunkBytes); grew is closed
	// (and replaced) when it grows. Under mu.
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
	t       *tensor.Tensor // the tensor lent
	members []RelayMember  // in the order of their first export
	live    int            // exports of it not ended
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
// (d.Relay), or from the owner when there is none or it cannot serve;
// chunk by chunk when Flow.RelayChunkBytes says so, telling f (the
// flight dst belongs to; nil: none) as each chunk lands.
func (e *Engine) fetchRelayed(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, f *relayFlight) error {
	if c := e.cfg.Flow.RelayChunkBytes; c > 0 && d.Bytes > c && e.relayEligible(d) && !e.relayOnMyGPU(d, dst) {
		if err := e.fetchChunked(ctx, d, dst, f); err == nil || ctx.Err() != nil {
			return err
		}
		return e.fetchInto(ctx, d, dst)
	}
	if from := e.namedRelay(d); from != "" && e.relayEligible(d) {
		err := e.relayed(from, d, e.fetchFromHolder(ctx, d, dst))
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return e.fetchInto(ctx, d, dst)
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

// relayOnMyGPU reports whether the receiver the owner named for d is
// another node whose GPU is dst's: chunks from it would make that GPU
// switch between the two processes' contexts at every chunk (2xH200, 3
// nodes on one GPU: 1 GiB in 64 MiB chunks 6.2 ms, whole 4.6 ms), so it
// is copied whole.
func (e *Engine) relayOnMyGPU(d *tensor.Descriptor, dst *tensor.Tensor) bool {
	from := e.namedRelay(d)
	if from == "" {
		return false
	}
	p := e.peer(from)
	mine := e.caps.DeviceUUID(dst.Device())
	return p != nil && mine != "" && len(p.caps.Devices) > 0 && p.caps.Devices[0].UUID == mine
}

// fetchChunked fetches d into dst in chunks of Flow.RelayChunkBytes from
// the receiver the owner named, or from the owner (which serves chunks of
// what it lends), the next chunk asked for while one is fetched. A
// failure from a named receiver counts as a fallback; the caller then
// fetches the whole from the owner.
func (e *Engine) fetchChunked(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, f *relayFlight) error {
	from := d.Owner
	if r := e.namedRelay(d); r != "" {
		from = r
	}
	if p := e.peer(from); p == nil || !p.relay {
		return fmt.Errorf("%w: relay %s", ErrPeerDown, from)
	}
	size := e.cfg.Flow.RelayChunkBytes
	n := (d.Bytes + size - 1) / size
	ask := func(i int64) chan chunkAnswer {
		ch := make(chan chunkAnswer, 1)
		go func() {
			hd, err := e.askHolder(ctx, from, d, uint64(i+1), size)
			ch <- chunkAnswer{hd, err}
		}()
		return ch
	}
	// A chunk's loan is given back once the next chunk's is made, so
	// that the holder's flight never sees every loan ended before the
	// last chunk (it would end, and the next ask find nothing).
	var err error
	var prev *tensor.Descriptor
	next := ask(0)
	for i := int64(0); i < n; i++ {
		a := <-next
		next = nil
		if prev != nil {
			_ = e.release(ctx, prev)
			prev = nil
		}
		if err = a.err; err != nil {
			break
		}
		prev = a.hd
		if i+1 < n {
			next = ask(i + 1)
		}
		off, m := i*size, min(size, d.Bytes-i*size)
		var view *tensor.Tensor
		if view, err = viewOf(dst, off, m); err == nil {
			err = e.fetchInto(ctx, a.hd, view)
		}
		if err != nil {
			break
		}
		f.land(off + m)
	}
	if prev != nil {
		_ = e.release(ctx, prev)
	}
	if next != nil { // asked already: give its copy back
		go func() {
			if a := <-next; a.err == nil {
				_ = e.release(context.WithoutCancel(ctx), a.hd)
			}
		}()
	}
	if from != d.Owner {
		return e.relayed(from, d, err)
	}
	return err
}

type chunkAnswer struct {
	hd  *tensor.Descriptor
	err error
}

// viewOf returns the n bytes of t from off as a tensor of bytes sharing
// t's memory.
func viewOf(t *tensor.Tensor, off, n int64) (*tensor.Tensor, error) {
	b, err := t.Buffer().Slice(int(off), int(n))
	if err != nil {
		return nil, err
	}
	return tensor.FromBuffer(b, tensor.Uint8, tensor.Shape{n})
}

// land records that f's source holds its first n bytes (f may be nil).
func (f *relayFlight) land(n int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.landed = n
	if f.grew != nil {
		close(f.grew)
		f.grew = nil
	}
	f.mu.Unlock()
}

// waitLanded waits until f's source holds its first n bytes or f's fetch
// ended; it returns f's error, if its fetch failed.
func (f *relayFlight) waitLanded(ctx context.Context, n int64) error {
	for {
		f.mu.Lock()
		if f.landed >= n {
			f.mu.Unlock()
			return nil
		}
		if f.grew == nil {
			f.grew = make(chan struct{})
		}
		grew := f.grew
		f.mu.Unlock()
		select {
		case <-grew:
		case <-f.ready:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// askHolder asks node from for its copy of d's content: chunk (1-based)
// of size bytes, or all of it when chunk is 0. It returns the descriptor
// of that copy, lent to this node.
func (e *Engine) askHolder(ctx context.Context, from string, d *tensor.Descriptor, chunk uint64, size int64) (*tensor.Descriptor, error) {
	q := tensor.Descriptor{Owner: d.Owner, Incarnation: d.Incarnation, DType: d.DType, Shape: d.Shape,
		Bytes: d.Bytes, Device: d.Device, Content: d.Content}
	body, err := encodeRelayAsk(relayAsk{chunk: chunk, size: size, d: &q})
	if err != nil {
		return nil, err
	}
	resp, err := e.control(ctx, from, relayTarget, body)
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
	want := &q
	if chunk > 0 {
		off := int64(chunk-1) * size
		want = &tensor.Descriptor{DType: tensor.Uint8, Shape: tensor.Shape{min(size, d.Bytes-off)}, Bytes: min(size, d.Bytes-off)}
	}
	if hd.Owner != from || !sameContent(want, &hd) {
		_ = e.release(ctx, &hd)
		return nil, fmt.Errorf("transfer: relay %s answered %v for %v", from, &hd, d)
	}
	return &hd, nil
}

// relayAsk is a relay request: the content's descriptor (no lease, export
// or offers) and which part of it: chunk (1-based) of size bytes, or all
// of it (chunk 0).
type relayAsk struct {
	chunk uint64
	size  int64
	d     *tensor.Descriptor
}

// encodeRelayAsk writes a relay request: chunk and size as msgpack
// integers, then the descriptor.
func encodeRelayAsk(a relayAsk) ([]byte, error) {
	b := msgp.AppendInt64(msgp.AppendUint64(nil, a.chunk), a.size)
	return a.d.MarshalMsg(b)
}

// decodeRelayAsk reads a relay request from a peer, checking it: a valid
// descriptor with a content, and a chunk within it.
func decodeRelayAsk(b []byte) (relayAsk, error) {
	var a relayAsk
	var err error
	if a.chunk, b, err = msgp.ReadUint64Bytes(b); err == nil {
		a.size, b, err = msgp.ReadInt64Bytes(b)
	}
	var d tensor.Descriptor
	if err == nil {
		var rest []byte
		if rest, err = d.UnmarshalMsg(b); err == nil && len(rest) != 0 {
			err = fmt.Errorf("%w: %d bytes after it", tensor.ErrBadDescriptor, len(rest))
		}
	}
	if err == nil {
		err = d.Validate()
	}
	if err == nil && d.Content == 0 {
		err = errors.New("no content")
	}
	if err == nil && a.chunk > 0 && (a.size <= 0 || a.size > d.Bytes || a.chunk > uint64((d.Bytes+a.size-1)/a.size)) {
		err = fmt.Errorf("chunk %d of %d bytes in %d", a.chunk, a.size, d.Bytes)
	}
	if err != nil {
		return relayAsk{}, fmt.Errorf("transfer: bad relay request: %w", err)
	}
	a.d = &d
	return a, nil
}

// fetchFromHolder asks d.Relay for its copy of d's content and fetches it
// into dst, then gives that copy's lease back.
func (e *Engine) fetchFromHolder(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if p := e.peer(d.Relay); p == nil || !p.relay {
		return fmt.Errorf("%w: relay %s", ErrPeerDown, d.Relay)
	}
	hd, err := e.askHolder(ctx, d.Relay, d, 0, 0)
	if err != nil {
		return err
	}
	err = e.fetchInto(ctx, hd, dst)
	_ = e.release(ctx, hd)
	return err
}

// serveRelay answers a relay request of peer (relayTarget): once this
// node's fetch of the content ended, it lends its copy to peer. The
// copy's flight does not deliver it (nor free it) until that lease ends.
func (e *Engine) serveRelay(ctx context.Context, peer string, req []byte) ([]byte, error) {
	a, err := decodeRelayAsk(req)
	if err != nil {
		return nil, err
	}
	d := a.d
	off, n := int64(0), d.Bytes
	if a.chunk > 0 {
		off = int64(a.chunk-1) * a.size
		n = min(a.size, d.Bytes-off)
	}
	if d.Owner == e.cfg.Node {
		return e.serveOwnChunk(peer, a, off, n)
	}
	f, err := e.joinFlight(ctx, d)
	if err != nil {
		return nil, err
	}
	// One copy joined f: done when the loan below ends, or now if none
	// is made.
	if err := f.waitLanded(ctx, off+n); err != nil {
		e.relays.copied(f)
		return nil, fmt.Errorf("transfer: relay: this node's fetch failed: %w", err)
	}
	src := f.src
	if a.chunk > 0 {
		if src, err = viewOf(f.src, off, n); err != nil {
			e.relays.copied(f)
			return nil, err
		}
		e.relays.mu.Lock()
		e.relays.lending[src] = f
		e.relays.mu.Unlock()
	}
	x, hd, err := e.store.Export(src, peer, e.cfg.Flow.TransferTimeout)
	if err != nil {
		e.relays.mu.Lock()
		if src != f.src {
			delete(e.relays.lending, src)
		}
		e.relays.mu.Unlock()
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

// serveOwnChunk answers a request for a chunk of a content this node owns
// and lends now: it lends that chunk of the tensor (a view) to peer.
func (e *Engine) serveOwnChunk(peer string, a relayAsk, off, n int64) ([]byte, error) {
	d := a.d
	e.relays.mu.Lock()
	var t *tensor.Tensor
	if c := e.relays.lent[d.Content]; c != nil && d.Incarnation == e.cfg.Incarnation {
		t = c.t
	}
	e.relays.mu.Unlock()
	if t == nil || a.chunk == 0 || t.DType() != d.DType || !slices.Equal(t.Shape(), d.Shape) {
		return nil, fmt.Errorf("%w: %v content %d (the owner serves chunks of what it lends)", ErrNotHeld, d, d.Content)
	}
	v, err := viewOf(t, off, n)
	if err != nil {
		return nil, err
	}
	x, hd, err := e.store.Export(v, peer, e.cfg.Flow.TransferTimeout)
	if err != nil {
		return nil, err
	}
	e.offer(x, peer, hd)
	e.relays.publish()
	return hd.MarshalMsg(nil)
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
		c = &lentContent{t: x.Tensor}
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
		if x.Tensor != f.src { // a chunk's view
			delete(r.lending, x.Tensor)
		}
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
	start := time.Now()
	if c := e.cfg.Flow.RelayChunkBytes; c > 0 && d.Bytes > c {
		// Chunk by chunk, as the leader's land.
		for off := int64(0); off < d.Bytes; off += c {
			n := min(c, d.Bytes-off)
			if err := f.waitLanded(ctx, off+n); err != nil {
				return err
			}
			s, err := viewOf(f.src, off, n)
			var t *tensor.Tensor
			if err == nil {
				t, err = viewOf(dst, off, n)
			}
			if err == nil {
				err = memory.Copy(ctx, t.Buffer(), s.Buffer())
			}
			if err != nil {
				return err
			}
		}
		e.stats.addBytes(d.Owner, RelayChannel, d.Bytes, time.Since(start))
		return nil
	}
	select {
	case <-f.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.err != nil {
		return f.err
	}
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
