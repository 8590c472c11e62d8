package transfer

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Incoming is a received message whose tensors are not all there yet: the
// descriptors to fetch, each with the placeholder field it fills. Nothing
// is allocated for them until their fetch starts (within the receiver's
// budgets).
type Incoming struct {
	e       *Engine
	peer    string
	device  memory.Device
	entries []entry
	jobs    []job
	refs    []tensor.Ref
	made    []*tensor.Tensor // filled (inline or fetched): freed if the message fails
	bytes   int64            // of jobs
	parent  tracehook.Parent // of the fetches' spans
	msg     any              // the message, for dests
	dests   Destinations     // nil: every destination is allocated
	// expecting: this message's fetches that will lead a relay flight
	// are announced (Engine.expectRelay) until its fetch starts them.
	expecting bool
	w         walker
	// Room for the common message's few tensors, without allocating.
	jobsBuf [2]job
	madeBuf [2]*tensor.Tensor
}

type job struct {
	d   *tensor.Descriptor
	t   *tensor.Tensor // the placeholder it fills
	dst *tensor.Tensor // the receiver's destination (Destinations), nil: allocate one
}

// Destinations gives the tensors a message's tensor fields are fetched
// into, so that a receiver that gets same-shaped tensors again and again
// allocates nothing for them. It is called once per tensor field of a
// received message (inline or fetched) with the decoded message, whose
// other fields are set, and the tensor's descriptor (dtype, shape, bytes);
// it returns nil to have the engine allocate the destination as usual.
// A tensor it returns must have the descriptor's dtype and shape (else the
// message fails with an error wrapping tensor.ErrDestination) and may be
// on any device; it is written through Write, so it must not be lent.
//
// Ownership: the caller keeps owning the tensor it returns. The message's
// field becomes a view of it (same memory; its Free does nothing), so the
// handler reads the field or the tensor alike. From the call until the
// message is delivered (or its delivery fails) the engine writes the
// tensor: the receiver must not use it then, which holds by construction
// when it gives a tensor only for the answer it waits for (the weights it
// pulled) and reuses it for the next request once the answer is handled.
// It runs on the node's goroutines (the connection's reader or the peer's
// delivery loop), not the actor's: it must not block, and what it reads of
// the actor must be safe to read there.
type Destinations func(msg any, d *tensor.Descriptor) *tensor.Tensor

// Bytes returns the bytes the message's fetches allocate.
func (in *Incoming) Bytes() int64 {
	if in == nil {
		return 0
	}
	return in.bytes
}

// Import puts the tensors of a message received from peer back into msg,
// from the table that came beside its body: inline tensors at once on dev,
// Refs as lazy Refs fetched through this engine; descriptors to fetch are
// kept in the returned Incoming (nil when there are none) for Enqueue.
// Every tensor and Ref field must refer to one entry, and every entry be
// referred to once. A message whose fetches exceed the per-peer budget is
// refused (ErrOverBudget). On error, what the table lent is released.
func (e *Engine) Import(peer string, table []byte, msg any, dev memory.Device) (*Incoming, error) {
	return e.ImportContext(context.Background(), peer, table, msg, dev)
}

// ImportContext is Import within a trace: when the engine has a
// TracerProvider, each fetch of the message's tensors gets a span
// "tensorferry.fetch", child of the span in ctx (the message's receipt),
// with the channel, the bytes, and what the channel reports (registration
// cache hit or miss, stripes).
func (e *Engine) ImportContext(ctx context.Context, peer string, table []byte, msg any, dev memory.Device) (*Incoming, error) {
	return e.ImportInto(ctx, peer, table, msg, dev, nil)
}

// ImportInto is ImportContext with the receiver's destinations: the tensor
// fields for which dests returns a tensor are filled into it instead of a
// tensor allocated on dev (see Destinations).
func (e *Engine) ImportInto(ctx context.Context, peer string, table []byte, msg any, dev memory.Device, dests Destinations) (*Incoming, error) {
	if len(table) == 0 && (msg == nil || !HoldsTensors(reflect.TypeOf(msg))) {
		return nil, nil
	}
	entries, err := decodeTable(table)
	if err != nil {
		return nil, err
	}
	in := &Incoming{e: e, peer: peer, device: dev, entries: entries, parent: e.tr.ParentOf(ctx)}
	if dests != nil {
		in.msg, in.dests = msg, dests
	}
	in.w.v = in
	in.jobs, in.made = in.jobsBuf[:0], in.madeBuf[:0]
	if err = in.w.walk(msg); err == nil {
		for i := range entries {
			if !entries[i].used {
				err = fmt.Errorf("%w: entry %d (id %d) is not referred to by any field of %T", ErrBadTable, i, entries[i].ID, msg)
				break
			}
		}
	}
	if err == nil && in.bytes > e.cfg.Flow.ReceiveBudgetPerPeer {
		err = fmt.Errorf("%w: %d bytes to fetch, the receive budget per peer is %d", ErrOverBudget, in.bytes, e.cfg.Flow.ReceiveBudgetPerPeer)
		e.stats.addFailure(err)
	}
	in.entries = nil
	if err != nil {
		in.unexpect()
		in.free()
		e.releaseEntries(entries)
		return nil, err
	}
	if len(in.jobs) == 0 {
		return nil, nil
	}
	return in, nil
}

func (in *Incoming) visitTensor(t *tensor.Tensor) error {
	id, ok := tensor.Placeholder(t)
	if !ok {
		return fmt.Errorf("%w: a decoded tensor field is not a placeholder", ErrBadTable)
	}
	x, err := use(in.entries, id)
	if err != nil {
		return err
	}
	var dst *tensor.Tensor
	if in.dests != nil && (x.Kind == entryInline || x.Kind == entryFetch) {
		if dst, err = in.destination(x); err != nil {
			return err
		}
	}
	switch x.Kind {
	case entryInline:
		if dst != nil {
			return in.fillInline(t, dst, x.Data)
		}
		src, err := tensor.NewUninit(in.device, x.DType, x.Shape)
		if err != nil {
			return err
		}
		if h := src.Host(); h != nil {
			copy(h, x.Data)
		} else if err := memory.Copy(in.e.ctx, src.Buffer(), memory.WrapHost(x.Data)); err != nil {
			_ = src.Free()
			return err
		}
		if err := tensor.Fill(t, src); err != nil {
			_ = src.Free()
			return err
		}
		in.made = append(in.made, t)
	case entryFetch:
		in.jobs = append(in.jobs, job{d: x.Desc, t: t, dst: dst})
		if dst == nil && in.e.relayEligible(x.Desc) {
			in.e.expectRelay(x.Desc, 1)
			in.expecting = true
		}
		in.bytes += x.Desc.Bytes
	default:
		return fmt.Errorf("%w: tensor field refers to entry %d of kind %d", ErrBadTable, id, x.Kind)
	}
	return nil
}

// destination asks the receiver's Destinations for x's tensor: nil when it
// gives none, an error when the one it gives does not fit.
func (in *Incoming) destination(x *entry) (*tensor.Tensor, error) {
	d := x.Desc
	if d == nil {
		// An inline entry: what the descriptor of its tensor would say.
		d = &tensor.Descriptor{DType: x.DType, Shape: x.Shape, Bytes: int64(len(x.Data)), Device: memory.CPU.String()}
	}
	dst := in.dests(in.msg, d)
	if dst == nil {
		return nil, nil
	}
	if err := tensor.CheckDestination(dst, d.DType, d.Shape); err != nil {
		return nil, fmt.Errorf("transfer: the receiver's destination for %T: %w", in.msg, err)
	}
	return dst, nil
}

// fillInline copies an inline tensor's bytes into the receiver's dst and
// makes the field t a view of it.
func (in *Incoming) fillInline(t, dst *tensor.Tensor, data []byte) error {
	if int64(len(data)) != dst.ByteSize() {
		return fmt.Errorf("%w: inline tensor of %d bytes for %v", ErrBadTable, len(data), dst)
	}
	err := dst.Write(func(buf memory.Buffer) error {
		if h := buf.Host(); h != nil {
			copy(h, data)
			return nil
		}
		return memory.Copy(in.e.ctx, buf, memory.WrapHost(data))
	})
	if err == nil {
		err = fillView(t, dst)
	}
	if err != nil {
		return err
	}
	in.made = append(in.made, t)
	return nil
}

// fillView makes the placeholder t a view of dst: its memory, without
// owning it (t.Free does nothing).
func fillView(t, dst *tensor.Tensor) error {
	buf := dst.Buffer()
	v, err := buf.Slice(0, buf.Len())
	if err != nil {
		return err
	}
	vt, err := tensor.FromBuffer(v, dst.DType(), dst.Shape())
	if err != nil {
		return err
	}
	return tensor.Fill(t, vt)
}

func (in *Incoming) visitRef(r tensor.Ref) error {
	id, ok := tensor.RefPlaceholder(r)
	if !ok {
		return fmt.Errorf("%w: a decoded Ref field is not a placeholder", ErrBadTable)
	}
	x, err := use(in.entries, id)
	if err != nil {
		return err
	}
	if x.Kind != entryRef {
		return fmt.Errorf("%w: Ref field refers to entry %d of kind %d", ErrBadTable, id, x.Kind)
	}
	if err := tensor.FillRef(r, x.Desc, (*refFetcher)(in.e)); err != nil {
		return err
	}
	in.refs = append(in.refs, r)
	return nil
}

// use marks the entry with id used, once.
func use(entries []entry, id uint64) (*entry, error) {
	x := find(entries, id)
	if x == nil {
		return nil, fmt.Errorf("%w: a field refers to id %d, absent from the table", ErrBadTable, id)
	}
	if x.used {
		return nil, fmt.Errorf("%w: two fields refer to id %d", ErrBadTable, id)
	}
	x.used = true
	return x, nil
}

// releaseEntries gives back the leases of a table whose message is refused.
func (e *Engine) releaseEntries(entries []entry) {
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	defer cancel()
	for _, x := range entries {
		if x.Desc != nil {
			_ = e.release(ctx, x.Desc)
		}
	}
}

// fetch allocates the destinations of in's descriptors on its device and
// fetches them, then calls fetched. On failure what was allocated is freed
// and every lease, including the Refs', released; on success the leases of
// the fetched descriptors stay held until releaseFetched, which the engine
// calls once the message is delivered: the release frames then leave after
// the message reached its receiver instead of before, off the path of a
// reply.
func (in *Incoming) fetch(ctx context.Context, fetched func()) error {
	ctx = in.parent.With(ctx)
	var first error
	for _, j := range in.jobs {
		if first = in.fetchOne(ctx, j); first != nil {
			break
		}
	}
	in.unexpect()
	fetched()
	if first != nil {
		in.abort(ctx)
	}
	return first
}

// releaseFetched gives back the leases of the descriptors fetch fetched.
// A release that cannot be sent is not an error of the message: it fails
// only when the owner's connection is gone, and the owner's leases end
// with its connection (or expire at their deadline).
func (in *Incoming) releaseFetched(ctx context.Context) {
	for _, j := range in.jobs {
		_ = in.e.release(ctx, j.d)
	}
	in.jobs = nil
}

func (in *Incoming) fetchOne(ctx context.Context, j job) error {
	if j.dst != nil {
		return in.placeInto(j, j.dst.Write(func(memory.Buffer) error { return in.e.fetchRelayed(ctx, j.d, j.dst, nil) }))
	}
	dst, err := tensor.NewUninit(in.device, j.d.DType, j.d.Shape)
	if err != nil {
		return err
	}
	return in.place(j, dst, in.e.fetchShared(ctx, j.d, dst))
}

// place puts dst, fetched for j (err: how the fetch ended), in j's field;
// dst is freed when the fetch or the fill failed.
func (in *Incoming) place(j job, dst *tensor.Tensor, err error) error {
	if err == nil {
		err = tensor.Fill(j.t, dst)
	}
	if err != nil {
		_ = dst.Free()
		return err
	}
	in.made = append(in.made, j.t)
	return nil
}

// placeInto makes j's field a view of the receiver's destination, fetched
// for j (err: how the fetch ended). The destination stays the receiver's.
func (in *Incoming) placeInto(j job, err error) error {
	if err == nil {
		err = fillView(j.t, j.dst)
	}
	if err != nil {
		return err
	}
	in.made = append(in.made, j.t)
	return nil
}

// fetchDirect fetches in's descriptor on the calling goroutine when the
// message has one and its channel can fetch it without waiting for
// another node (rdma.DirectFetcher); done=false, nothing done, otherwise.
// When done, it is as fetch: on failure what was allocated is freed and
// every lease released.
func (in *Incoming) fetchDirect(ctx context.Context) (done bool, err error) {
	if len(in.jobs) != 1 || in.mayRelay() {
		return false, nil
	}
	j := in.jobs[0]
	ctx = in.parent.With(ctx)
	name, ch, err := in.e.route(j.d, in.device)
	if err != nil {
		in.abort(ctx)
		return true, err
	}
	// The channel first, then the destination: nothing is allocated for a
	// message the delivery loop fetches.
	df, ok := ch.(rdma.DirectFetcher)
	if !ok {
		return false, nil
	}
	if j.dst != nil {
		err = j.dst.Write(func(memory.Buffer) error {
			done, err = in.e.fetchDirectWith(ctx, name, df, j.d, j.dst)
			return err
		})
		if !done && err == nil {
			return false, nil
		}
		if err = in.placeInto(j, err); err != nil {
			in.abort(ctx)
		}
		return true, err
	}
	dst, err := tensor.NewUninit(in.device, j.d.DType, j.d.Shape)
	if err != nil {
		return false, nil // the delivery loop's fetch fails with it
	}
	if done, err = in.e.fetchDirectWith(ctx, name, df, j.d, dst); !done {
		_ = dst.Free()
		return false, nil
	}
	if err = in.place(j, dst, err); err != nil {
		in.abort(ctx)
	}
	return true, err
}

// Abort releases every lease of a message that will not be delivered and
// frees what was allocated for it.
func (in *Incoming) Abort() {
	if in == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.e.ctx), time.Second)
	defer cancel()
	in.abort(ctx)
}

func (in *Incoming) abort(ctx context.Context) {
	in.unexpect()
	for _, j := range in.jobs {
		_ = in.e.release(ctx, j.d)
	}
	in.jobs = nil
	for _, r := range in.refs {
		_ = r.Release(ctx)
	}
	in.refs = nil
	in.free()
}

// unexpect withdraws what visitTensor announced of in's relay flights.
func (in *Incoming) unexpect() {
	if !in.expecting {
		return
	}
	in.expecting = false
	for _, j := range in.jobs {
		if j.dst == nil && in.e.relayEligible(j.d) {
			in.e.expectRelay(j.d, -1)
		}
	}
}

// free frees the tensors filled for the message.
func (in *Incoming) free() {
	for _, t := range in.made {
		_ = t.Free()
	}
	in.made = nil
}

// refFetcher is the tensor.Fetcher of the Refs an engine delivers.
type refFetcher Engine

func (f *refFetcher) FetchDescriptor(ctx context.Context, d *tensor.Descriptor, dev memory.Device) (*tensor.Tensor, error) {
	e := (*Engine)(f)
	if d.Bytes > e.cfg.Flow.ReceiveBudget {
		err := fmt.Errorf("%w: a Ref of %d bytes, the node's receive budget is %d", ErrOverBudget, d.Bytes, e.cfg.Flow.ReceiveBudget)
		e.stats.addFailure(err)
		return nil, err
	}
	t, err := tensor.NewUninit(dev, d.DType, d.Shape)
	if err != nil {
		return nil, err
	}
	if err := e.fetchShared(ctx, d, t); err != nil {
		_ = t.Free()
		return nil, err
	}
	return t, nil
}

func (f *refFetcher) FetchDescriptorInto(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if err := tensor.CheckDestination(dst, d.DType, d.Shape); err != nil {
		return fmt.Errorf("transfer: fetch %v: %w", d, err)
	}
	e := (*Engine)(f)
	return dst.Write(func(memory.Buffer) error { return e.fetchRelayed(ctx, d, dst, nil) })
}

func (f *refFetcher) ReleaseDescriptor(ctx context.Context, d *tensor.Descriptor) error {
	return (*Engine)(f).release(ctx, d)
}

// ownerCaps returns the capabilities of a descriptor's owner, checking that
// the descriptor comes from the owner's current incarnation.
func (e *Engine) ownerCaps(d *tensor.Descriptor) (*rdma.Caps, error) {
	if d.Owner == e.cfg.Node {
		if d.Incarnation != e.cfg.Incarnation {
			return nil, fmt.Errorf("%w: %s", tensor.ErrStale, d)
		}
		return &e.caps, nil
	}
	p := e.peer(d.Owner)
	if p == nil {
		return nil, fmt.Errorf("%w: owner %s of %v", ErrPeerDown, d.Owner, d)
	}
	if p.caps.Incarnation != d.Incarnation {
		return nil, fmt.Errorf("%w: %s is now incarnation %d", tensor.ErrStale, d, p.caps.Incarnation)
	}
	return &p.caps, nil
}

// route returns the channel that fetches d to dst, and its name.
func (e *Engine) route(d *tensor.Descriptor, dst memory.Device) (string, rdma.Channel, error) {
	oc, err := e.ownerCaps(d)
	if err != nil {
		e.stats.addFailure(err)
		return "", nil, err
	}
	src, err := memory.ParseDevice(d.Device)
	if err != nil {
		e.stats.addFailure(err)
		return "", nil, err
	}
	fc := e.fetcherCaps(d)
	name := rdma.Choose(oc, fc, src, dst)
	ch := e.channels[name]
	if ch == nil {
		// Select again, for the reason of each backend passed over.
		err := fmt.Errorf("%w: %s -> %s: %v", ErrNoChannel, src, dst, rdma.Select(oc, fc, src, dst).Rejected)
		e.stats.addFailure(err)
		return "", nil, err
	}
	return name, ch, nil
}

// fetchAttrs are the attributes of a fetch's span.
func fetchAttrs(name string, d *tensor.Descriptor, dst memory.Device) []tracehook.Attr {
	return []tracehook.Attr{
		tracehook.String(tracehook.AttrChannel, name),
		tracehook.String(tracehook.AttrPeer, d.Owner),
		tracehook.Int(tracehook.AttrBytes, d.Bytes),
		tracehook.String(tracehook.AttrSrc, d.Device),
		tracehook.String(tracehook.AttrDst, dst.String()),
	}
}

func (e *Engine) fetchInto(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	return e.fetchStream(ctx, d, dst, rdma.Progress{})
}

// fetchStream is fetchInto following p: through the channel's
// FetchStream where it has one, else waiting for the whole source first
// and telling p.Landed once at the end.
func (e *Engine) fetchStream(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor, p rdma.Progress) error {
	name, ch, err := e.route(d, dst.Device())
	if err != nil {
		return err
	}
	var sp tracehook.Span
	if e.tr.On() {
		ctx, sp = e.tr.Start(ctx, "tensorferry.fetch", tracehook.KindClient, fetchAttrs(name, d, dst.Device())...)
	}
	start := time.Now()
	if sf, ok := ch.(rdma.StreamFetcher); ok && (p.Ready != nil || p.Landed != nil) {
		err = sf.FetchStream(ctx, d, dst.Buffer(), p)
	} else {
		if _, err = p.Await(ctx, d.Bytes); err == nil {
			err = ch.Fetch(ctx, d, dst.Buffer())
		}
		if err == nil && p.Landed != nil {
			p.Landed(d.Bytes)
		}
	}
	sp.End(e.fetchEnded(name, d, start, err))
	return err
}

// fetchDirectWith is fetchInto through the named channel's FetchDirect:
// done=false, nothing done, when it cannot fetch d without waiting for
// another node.
func (e *Engine) fetchDirectWith(ctx context.Context, name string, df rdma.DirectFetcher, d *tensor.Descriptor, dst *tensor.Tensor) (done bool, err error) {
	start := time.Now()
	if done, err = df.FetchDirect(ctx, d, dst.Buffer()); !done {
		return false, nil
	}
	err = e.fetchEnded(name, d, start, err)
	if e.tr.On() {
		// Made once the fetch is known to have run here: a direct fetch
		// is a cache hit (the mapping was open).
		sp := e.tr.StartAt(ctx, start, "tensorferry.fetch", tracehook.KindClient,
			append(fetchAttrs(name, d, dst.Device()), tracehook.String(tracehook.AttrCache, "hit"))...)
		sp.End(err)
	}
	return true, err
}

// fetchEnded counts a fetch over the named channel that began at start and
// ended with err, and returns err with what was fetched.
func (e *Engine) fetchEnded(name string, d *tensor.Descriptor, start time.Time, err error) error {
	if err != nil {
		err = fmt.Errorf("transfer: fetch %v over %s: %w", d, name, err)
		e.stats.addFailure(err)
		return err
	}
	e.stats.addBytes(d.Owner, name, d.Bytes, time.Since(start))
	return nil
}

// release ends a descriptor's lease on its owner.
func (e *Engine) release(ctx context.Context, d *tensor.Descriptor) error {
	if d.Owner == e.cfg.Node {
		if d.Incarnation != e.cfg.Incarnation {
			return nil // that life's leases died with it
		}
		return e.store.Release(d.ExportID, d.Lease)
	}
	p := e.peer(d.Owner)
	if p == nil {
		return nil // the owner is down: its leases died with it
	}
	return p.link.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: d.ExportID, Lease: d.Lease, Incarnation: d.Incarnation})
}

// Refuse gives back what the table of a message that will not be decoded
// lends (its sender's node learns why from the caller).
func (e *Engine) Refuse(peer string, table []byte) {
	entries, err := decodeTable(table)
	if err != nil {
		e.log.Debug("refused message with a bad tensor table", zap.String("peer", peer), zap.Error(err))
		return
	}
	e.releaseEntries(entries)
}

// Discard frees the tensors of a delivered-to-nobody message and releases
// its Refs.
func Discard(msg any) { _ = walk(msg, discarder{}) }

type discarder struct{}

func (discarder) visitTensor(t *tensor.Tensor) error { _ = t.Free(); return nil }

func (discarder) visitRef(r tensor.Ref) error { _ = r.Release(context.Background()); return nil }
