package transfer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/internal/deadline"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// ErrOutboxFull: a message could not wait for the peer's credits: too many
// messages wait already (MaxOutbox) or it waited TransferTimeout.
var ErrOutboxFull = errors.New("transfer: the peer has not fetched earlier tensors")

// MaxOutbox bounds the messages of one sender node waiting for a peer's
// credits.
const MaxOutbox = 4096

// Outgoing is a message's tensors, taken out for sending to one peer: the
// table that travels beside its body, and the exports it lends.
type Outgoing struct {
	// Table is the message's tensor table (wire.Message.Tensors).
	Table []byte

	e       *Engine
	peer    string
	msgType reflect.Type
	entries []entry
	exports []*tensor.Export
	fetched []*tensor.Export // those the peer fetches before delivery (not Refs)
	bytes   int64            // of fetched: what the credit takes
	w       walker
	// Room for the common message's few tensors, without allocating.
	entriesBuf [2]entry
	exportsBuf [2]*tensor.Export
	fetchedBuf [2]*tensor.Export
}

// Export takes the tensors out of msg for sending to peer, walking msg
// once: tensors of at most InlineThreshold bytes are copied into the table,
// larger ones are exported (lent until the peer releases them) with each
// running channel's offer, Refs are exported as Refs (or forwarded with
// their descriptor). It returns nil when msg holds no tensor.
func (e *Engine) Export(peer string, msg any) (*Outgoing, error) {
	return e.ExportContext(context.Background(), peer, msg)
}

// ExportContext is Export within a trace: when the engine has a
// TracerProvider, a message with tensors gets a span "tensorferry.export",
// child of the span in ctx.
func (e *Engine) ExportContext(ctx context.Context, peer string, msg any) (*Outgoing, error) {
	if msg == nil {
		return nil, nil
	}
	typ := reflect.TypeOf(msg)
	if !HoldsTensors(typ) {
		return nil, nil
	}
	_, sp := e.tr.Start(ctx, "tensorferry.export", tracehook.KindInternal)
	o := &Outgoing{e: e, peer: peer, msgType: typ}
	o.w.v = o
	o.entries, o.exports, o.fetched = o.entriesBuf[:0], o.exportsBuf[:0], o.fetchedBuf[:0]
	err := o.w.walk(msg)
	if sp.On() {
		sp.SetString(tracehook.AttrPeer, peer)
		sp.SetInt(tracehook.AttrTensors, int64(len(o.exports)))
		sp.SetInt(tracehook.AttrInline, int64(len(o.entries)-len(o.exports)))
		sp.SetInt(tracehook.AttrBytes, o.bytes)
	}
	if err == nil && len(o.entries) > 0 {
		o.Table, err = encodeTable(o.entries)
	}
	o.entries = nil // inline entries alias the tensors' memory
	sp.End(err)
	if err != nil {
		o.Abort()
		return nil, err
	}
	if len(o.Table) == 0 {
		return nil, nil
	}
	return o, nil
}

// seen fails for a tensor or Ref met twice in one message.
func (o *Outgoing) seen(id uint64) error {
	if find(o.entries, id) != nil {
		return fmt.Errorf("transfer: the same tensor or Ref appears twice in one %v", o.msgType)
	}
	return nil
}

func (o *Outgoing) visitTensor(t *tensor.Tensor) error {
	if err := o.seen(t.WireID()); err != nil {
		return err
	}
	if _, ok := tensor.Placeholder(t); ok {
		return errors.New("transfer: an unfilled tensor placeholder cannot be sent")
	}
	if t.ByteSize() <= o.e.cfg.InlineThreshold && !o.directSmall(t) {
		data, err := hostBytes(t)
		if err != nil {
			return err
		}
		o.entries = append(o.entries, entry{ID: t.WireID(), Kind: entryInline, DType: t.DType(), Shape: t.Shape(), Data: data})
		return nil
	}
	d, err := o.export(t, false)
	if err != nil {
		return err
	}
	o.entries = append(o.entries, entry{ID: t.WireID(), Kind: entryFetch, Desc: d})
	return nil
}

// directSmall reports whether t, small enough to go inline, rather goes
// to the peer through a channel that moves small device tensors faster
// (see Config.InlineDevice).
func (o *Outgoing) directSmall(t *tensor.Tensor) bool {
	if o.e.cfg.InlineDevice || t.Device().Kind != memory.KindCUDA || t.ByteSize() == 0 {
		return false
	}
	p := o.e.peer(o.peer)
	return p != nil && rdma.DirectSmall(&o.e.caps, &p.caps, t.Device()) != ""
}

func (o *Outgoing) visitRef(r tensor.Ref) error {
	if err := o.seen(r.WireID()); err != nil {
		return err
	}
	if t := r.Local(); t != nil {
		d, err := o.export(t, true)
		if err != nil {
			return err
		}
		o.entries = append(o.entries, entry{ID: r.WireID(), Kind: entryRef, Desc: d})
		return nil
	}
	if _, ok := tensor.RefPlaceholder(r); ok {
		return errors.New("transfer: an unfilled Ref placeholder cannot be sent")
	}
	d, err := r.Forward()
	if err != nil {
		return err
	}
	o.entries = append(o.entries, entry{ID: r.WireID(), Kind: entryRef, Desc: d})
	return nil
}

// exportLeaseFactor: an export sent in a message lives TransferTimeout
// twice: once waiting in the outbox at most, once for the fetch.
const exportLeaseFactor = 2

func (o *Outgoing) export(t *tensor.Tensor, asRef bool) (*tensor.Descriptor, error) {
	e := o.e
	ttl := exportLeaseFactor * e.cfg.Flow.TransferTimeout
	if asRef {
		ttl = e.cfg.Flow.RefTTL
	}
	x, d, err := e.store.Export(t, o.peer, ttl)
	if err != nil {
		return nil, err
	}
	o.exports = append(o.exports, x)
	if !asRef {
		o.fetched = append(o.fetched, x)
		o.bytes += d.Bytes
	}
	e.planRelay(o.peer, x, d)
	e.offer(x, o.peer, d)
	e.stats.TensorsExported.Add(1)
	return d, nil
}

// offer adds each running channel's offer of x to peer to d.
func (e *Engine) offer(x *tensor.Export, peer string, d *tensor.Descriptor) {
	ctx, cancel := deadline.WithTimeout(e.ctx, e.cfg.Flow.TransferTimeout) // no timer unless waited on
	defer cancel()
	for name, ch := range e.channels {
		offer, err := ch.Offer(ctx, x, peer)
		if err != nil {
			e.log.Debug("channel makes no offer", zap.String("channel", name), zap.Error(err))
			continue
		}
		if offer != nil {
			if d.Offers == nil {
				d.Offers = map[string][]byte{}
			}
			d.Offers[name] = offer
		}
	}
}

// Abort ends the leases of a message that was not sent.
func (o *Outgoing) Abort() {
	if o == nil {
		return
	}
	for _, x := range o.exports {
		_ = o.e.store.Release(x.ID, x.Lease)
	}
	o.exports, o.fetched = nil, nil
}

// hostBytes returns t's bytes in host memory: t's own for a host tensor
// (valid while the table is encoded, within Export), else a copy.
func hostBytes(t *tensor.Tensor) ([]byte, error) {
	if b := t.Host(); b != nil || t.ByteSize() == 0 {
		return b, nil
	}
	host, err := t.To(context.Background(), memory.CPU)
	if err != nil {
		return nil, fmt.Errorf("transfer: inline copy of %v: %w", t, err)
	}
	defer host.Free()
	return append([]byte(nil), host.Host()...), nil
}

// outbox holds, in order, the messages to one peer that wait for its
// credits, and the messages sent after them.
type outbox struct {
	mu      sync.Mutex
	q       []*posted
	running bool
	busy    atomic.Bool // q not empty or being sent: later messages must queue (written under mu)
}

type posted struct {
	o        *Outgoing // nil for a message without tensors
	m        Message
	deadline time.Time
}

// Message is a message Send sends: the node's side of it.
type Message interface {
	// Send writes the message (its body and its tensor table) to the
	// peer's connection.
	Send() error
	// Fail reports to the message's sender that it was not sent.
	Fail(err error)
}

// Backlogged reports whether messages to the peer wait in its outbox, so
// that a message without tensors must go through Send to keep its place.
func (p *PeerFlow) Backlogged() bool { return p.out.busy.Load() }

// Send sends m to peer once the peer's credits allow its tensors (o, nil
// for none), in order with the other messages Send queued for that peer. It
// never blocks: when credits are out, the message waits in the peer's
// outbox, at most TransferTimeout and behind at most MaxOutbox others, and
// m.Send is then called on another goroutine. A message that cannot be
// sent has its exports aborted and m.Fail called with the reason
// (ErrOutboxFull, ErrPeerDown, m.Send's error).
func (e *Engine) Send(peer string, o *Outgoing, m Message) {
	p := e.peer(peer)
	if p == nil {
		o.Abort()
		m.Fail(fmt.Errorf("%w: %s", ErrPeerDown, peer))
		return
	}
	p.out.mu.Lock()
	if !p.out.busy.Load() {
		var bytes int64
		if o != nil {
			bytes = o.bytes
		}
		if ok, _ := p.credits.tryAcquire(bytes); ok || o == nil {
			p.out.mu.Unlock()
			e.sendNow(p, o, m)
			return
		}
	}
	if len(p.out.q) >= MaxOutbox {
		p.out.mu.Unlock()
		o.Abort()
		m.Fail(fmt.Errorf("%w: %d messages wait for %s already", ErrOutboxFull, MaxOutbox, peer))
		return
	}
	p.out.q = append(p.out.q, &posted{o: o, m: m, deadline: time.Now().Add(e.cfg.Flow.TransferTimeout)})
	p.out.busy.Store(true)
	start := !p.out.running
	p.out.running = true
	p.out.mu.Unlock()
	if start {
		e.wg.Add(1)
		go e.pump(p)
	}
}

// sendNow sends a message whose credit (if it has tensors) is taken. The
// credit is tied to the message's exports before the message leaves: the
// peer may fetch and release them before send returns.
func (e *Engine) sendNow(p *PeerFlow, o *Outgoing, m Message) {
	if o != nil {
		e.track(p.credits, o.bytes, o.fetched)
	}
	if err := m.Send(); err != nil {
		o.Abort() // ending the exports gives the credit back
		m.Fail(err)
	}
}

// pump sends the messages of p's outbox in order as credits come back.
func (e *Engine) pump(p *PeerFlow) {
	defer e.wg.Done()
	for {
		p.out.mu.Lock()
		if len(p.out.q) == 0 {
			p.out.running = false
			p.out.busy.Store(false)
			p.out.mu.Unlock()
			return
		}
		m := p.out.q[0]
		p.out.mu.Unlock()
		if err := e.waitCredit(p, m); err != nil {
			m.o.Abort()
			m.m.Fail(err)
		} else {
			e.sendNow(p, m.o, m.m)
		}
		p.out.mu.Lock()
		p.out.q[0] = nil
		p.out.q = p.out.q[1:]
		p.out.mu.Unlock()
	}
}

// waitCredit takes the credit of m's tensors, waiting until m's deadline.
func (e *Engine) waitCredit(p *PeerFlow, m *posted) error {
	if m.o == nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(e.ctx, m.deadline)
	defer cancel()
	err := p.credits.acquire(ctx, p.done, m.o.bytes)
	// Waited since it was queued (its deadline is TransferTimeout after).
	e.stats.CreditWaits.Add(1)
	e.stats.CreditWaitNanos.Add(int64(time.Since(m.deadline) + e.cfg.Flow.TransferTimeout))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: waited %v for %s to release earlier tensors", ErrOutboxFull, e.cfg.Flow.TransferTimeout, p.name)
		}
		return err
	}
	return nil
}
