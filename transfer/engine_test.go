package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// The engine is tested here on its own: two engines of one process joined
// by fake links (the release and control frames one sends reach the
// other's handlers) and a fake channel ("memtest") that copies from the
// owner engine's store, with a gate that holds fetches.

var (
	testEnginesMu sync.Mutex
	testEngines   = map[string]*Engine{}
	memtestGate   = struct {
		sync.Mutex
		ch chan struct{} // nil: fetches go through
	}{}
)

func init() {
	rdma.MustRegister(rdma.Backend{
		Name:     "memtest",
		Priority: 1,
		Reach:    func(owner, fetcher *rdma.Caps, src, dst memory.Device) error { return nil },
		New:      func(env *rdma.Env) (rdma.Channel, error) { return &memtest{down: map[string]chan struct{}{}}, nil },
	})
}

// memtest fails its fetches from a node that went down, as channels do.
type memtest struct {
	mu   sync.Mutex
	down map[string]chan struct{} // owner → closed by PeerDown
}

func (m *memtest) Name() string { return "memtest" }
func (m *memtest) Offer(context.Context, *tensor.Export, string) ([]byte, error) {
	return nil, nil
}
func (m *memtest) PeerDown(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch := m.down[node]; ch != nil {
		close(ch)
	}
	m.down[node] = nil
}
func (m *memtest) Close() error { return nil }

// downCh returns the channel closed when owner goes down.
func (m *memtest) downCh(owner string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch, ok := m.down[owner]
	if !ok {
		ch = make(chan struct{})
		m.down[owner] = ch
	}
	if ch == nil { // down already
		ch = make(chan struct{})
		close(ch)
	}
	return ch
}

// memtestWaiting counts the memtest fetches held by the gate.
var memtestWaiting atomic.Int64

// memtestDirect turns memtest's FetchDirect on: it then fetches at once,
// whatever gate holds Fetch (holdFetches).
var memtestDirect atomic.Bool

func (m *memtest) FetchDirect(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) (bool, error) {
	if !memtestDirect.Load() {
		return false, nil
	}
	return true, m.copy(ctx, d, dst)
}

func (m *memtest) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	if err := m.gate(ctx, d); err != nil {
		return err
	}
	return m.copy(ctx, d, dst)
}

// gate waits while holdFetches holds memtest's fetches.
func (m *memtest) gate(ctx context.Context, d *tensor.Descriptor) error {
	memtestGate.Lock()
	gate := memtestGate.ch
	memtestGate.Unlock()
	if gate != nil {
		memtestWaiting.Add(1)
		defer memtestWaiting.Add(-1)
		select {
		case <-gate:
		case <-m.downCh(d.Owner):
			return fmt.Errorf("memtest: %w: %s", rdma.ErrPeerDown, d.Owner)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// memtestPieces is how many pieces memtest's FetchStream copies in, each
// waiting for the gate (holdFetches) and for the source to hold it.
var memtestPieces atomic.Int64

func init() { memtestPieces.Store(1) }

// memtestInPieces makes memtest's FetchStream (and PutStream) copy in n
// pieces until the test ends.
func memtestInPieces(t *testing.T, n int64) {
	memtestPieces.Store(n)
	t.Cleanup(func() { memtestPieces.Store(1) })
}

func (m *memtest) FetchStream(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, p rdma.Progress) error {
	n := memtestPieces.Load()
	for i := int64(1); i <= n; i++ {
		end := d.Bytes * i / n
		if p.Ready != nil {
			if _, err := p.Ready(ctx, end); err != nil {
				return err
			}
		}
		if err := m.gate(ctx, d); err != nil {
			return err
		}
		if err := m.copyRange(ctx, d, dst, d.Bytes*(i-1)/n, end); err != nil {
			return err
		}
		if p.Landed != nil {
			p.Landed(end)
		}
	}
	return nil
}

// memtestPuts counts the pieces memtest's PutStream wrote.
var memtestPuts atomic.Int64

// PutStream writes src into the export d describes, in the owner
// engine's store, in memtestPieces pieces as FetchStream copies them:
// each once p.Ready says src holds it, past the gate (holdFetches).
func (m *memtest) PutStream(ctx context.Context, d *tensor.Descriptor, src memory.Buffer, p rdma.Progress) error {
	n := memtestPieces.Load()
	for i := int64(1); i <= n; i++ {
		from, end := d.Bytes*(i-1)/n, d.Bytes*i/n
		if p.Ready != nil {
			if _, err := p.Ready(ctx, end); err != nil {
				return err
			}
		}
		if err := m.gate(ctx, d); err != nil {
			return err
		}
		testEnginesMu.Lock()
		owner := testEngines[d.Owner]
		testEnginesMu.Unlock()
		if owner == nil {
			return fmt.Errorf("memtest: no engine %s", d.Owner)
		}
		x, done, err := owner.store.Acquire(d.Incarnation, d.ExportID, d.Lease)
		if err != nil {
			return err
		}
		t, err := x.Tensor.Buffer().Slice(int(from), int(end-from))
		var s memory.Buffer
		if err == nil {
			s, err = src.Slice(int(from), int(end-from))
		}
		if err == nil {
			err = memory.Copy(ctx, t, s)
		}
		done()
		if err != nil {
			return err
		}
		memtestPuts.Add(1)
		if p.Landed != nil {
			p.Landed(end)
		}
	}
	return nil
}

// memtestNoPut is memtest without PutStream: a channel that cannot write
// into a peer's memory.
type memtestNoPut struct {
	rdma.Channel
	rdma.StreamFetcher
}

// noPutChannels makes an engine's memtest a memtestNoPut.
func noPutChannels() map[string]ChannelFactory {
	return map[string]ChannelFactory{"memtest": func(*rdma.Env) (rdma.Channel, error) {
		m := &memtest{down: map[string]chan struct{}{}}
		return memtestNoPut{m, m}, nil
	}}
}

// copy copies d from its owner's store.
func (m *memtest) copy(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	testEnginesMu.Lock()
	owner := testEngines[d.Owner]
	testEnginesMu.Unlock()
	if owner == nil {
		return fmt.Errorf("memtest: no engine %s", d.Owner)
	}
	x, done, err := owner.store.Acquire(d.Incarnation, d.ExportID, d.Lease)
	if err != nil {
		return err
	}
	defer done()
	return memory.Copy(ctx, dst, x.Tensor.Buffer())
}

// copyRange copies bytes [from, to) of d from its owner's store.
func (m *memtest) copyRange(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, from, to int64) error {
	testEnginesMu.Lock()
	owner := testEngines[d.Owner]
	testEnginesMu.Unlock()
	if owner == nil {
		return fmt.Errorf("memtest: no engine %s", d.Owner)
	}
	x, done, err := owner.store.Acquire(d.Incarnation, d.ExportID, d.Lease)
	if err != nil {
		return err
	}
	defer done()
	s, err := x.Tensor.Buffer().Slice(int(from), int(to-from))
	if err != nil {
		return err
	}
	t, err := dst.Slice(int(from), int(to-from))
	if err != nil {
		return err
	}
	return memory.Copy(ctx, t, s)
}

// holdFetches holds every memtest fetch until open is called (at the
// latest when the test ends).
func holdFetches(t *testing.T) (open func()) {
	open, _ = holdFetchesOneByOne(t)
	return open
}

// holdFetchesOneByOne is holdFetches, and pass lets one held fetch go on
// (it waits for one to be held).
func holdFetchesOneByOne(t *testing.T) (open, pass func()) {
	gate := make(chan struct{})
	pass = func() { gate <- struct{}{} }
	memtestGate.Lock()
	memtestGate.ch = gate
	memtestGate.Unlock()
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() {
		open()
		memtestGate.Lock()
		memtestGate.ch = nil
		memtestGate.Unlock()
	})
	return open, pass
}

// link is one engine's fake connection to another.
type link struct {
	from string
	to   *Engine
	mu   sync.Mutex
	err  error // Close's cause
}

func (l *link) Send(_ context.Context, t wire.FrameType, _ wire.Flags, _ uint32, body any) error {
	switch t {
	case wire.FrameRelease:
		go l.to.HandleRelease(l.from, body.(*wire.Release))
	case wire.FrameMessage:
		m := *body.(*wire.Message)
		go l.to.HandleControl(l.from, &m)
	case wire.FrameError:
		go l.to.HandleError(l.from, body.(*wire.Error))
	}
	return nil
}

func (l *link) Close(cause error) {
	l.mu.Lock()
	l.err = cause
	l.mu.Unlock()
}

func (l *link) closed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// enginePair starts engines a and b with cfg's limits, each up for the
// other; ab is a's link to b, ba b's to a.
func enginePair(t *testing.T, cfg Config) (a, b *Engine, ab, ba *link) {
	t.Helper()
	mk := func(name string, inc uint64) *Engine {
		c := cfg
		c.Node, c.Incarnation = name, inc
		c.Disabled = func(ch string) bool { return ch != "memtest" }
		c.Dial = func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no data connections here")
		}
		e := New(c)
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		testEnginesMu.Lock()
		testEngines[name] = e
		testEnginesMu.Unlock()
		return e
	}
	a, b = mk(t.Name()+"-a", 1), mk(t.Name()+"-b", 2)
	ab, ba = &link{from: a.cfg.Node, to: b}, &link{from: b.cfg.Node, to: a}
	advA, _ := a.Advert()
	advB, _ := b.Advert()
	if _, err := a.PeerUp(b.cfg.Node, 2, advB, ab); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PeerUp(a.cfg.Node, 1, advA, ba); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
		testEnginesMu.Lock()
		delete(testEngines, a.cfg.Node)
		delete(testEngines, b.cfg.Node)
		testEnginesMu.Unlock()
	})
	return a, b, ab, ba
}

type grad struct {
	Step int
	W    *tensor.Tensor
	R    tensor.Ref
}

// carry sends msg from a to b as a node would: a's Export, the body
// encoded and decoded, b's Import.
func carry(t *testing.T, a, b *Engine, msg *grad) (*Outgoing, *grad, *Incoming, error) {
	t.Helper()
	return carryWith(t, a, b, msg, nil)
}

// carryWith is carry with the receiver's destinations (nil: none).
func carryWith(t *testing.T, a, b *Engine, msg *grad, dests Destinations) (*Outgoing, *grad, *Incoming, error) {
	t.Helper()
	out, err := a.Export(b.cfg.Node, msg)
	if err != nil {
		t.Fatal(err)
	}
	body, err := msgpack.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	var got grad
	if err := msgpack.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	var table []byte
	if out != nil {
		table = out.Table
	}
	in, err := b.ImportInto(context.Background(), a.cfg.Node, table, &got, memory.CPU, dests)
	return out, &got, in, err
}

// delivery records Deliver calls in order.
type delivery struct {
	ch chan error
}

func (d *delivery) Deliver(err error) { d.ch <- err }

func newTensor(t *testing.T, n int64, fill byte) *tensor.Tensor {
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{n})
	if err != nil {
		t.Fatal(err)
	}
	for i := range x.Host() {
		x.Host()[i] = fill
	}
	t.Cleanup(func() { _ = x.Free() })
	return x
}

func TestEngineMovesTensorsInOrder(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	d := &delivery{ch: make(chan error, 8)}
	var msgs []*grad
	for i := range 6 {
		out, got, in, err := carry(t, a, b, &grad{Step: i, W: newTensor(t, 1000, byte(i))})
		if err != nil || out == nil || in == nil {
			t.Fatalf("message %d: out %v in %v err %v", i, out, in, err)
		}
		if err := b.Enqueue(a.cfg.Node, in, 100, d); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, got)
	}
	for i, m := range msgs {
		if err := <-d.ch; err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Step != i || m.W.ByteSize() != 1000 || m.W.Host()[999] != byte(i) {
			t.Fatalf("message %d: step %d, %v", i, m.Step, m.W)
		}
		_ = m.W.Free()
	}
	waitFor(t, func() bool { return a.Store().Len() == 0 })
	if s := b.Stats(); s.Channels["memtest"].Transfers != 6 || s.BudgetInUse != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEngineInlineAndRefs(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 64})
	small, big := newTensor(t, 8, 7), newTensor(t, 1000, 9)
	_, got, in, err := carry(t, a, b, &grad{W: small, R: tensor.NewRef(big)})
	if err != nil || in != nil {
		t.Fatalf("in %v err %v", in, err)
	}
	if got.W.Host()[7] != 7 {
		t.Fatalf("inline tensor %v", got.W.Host())
	}
	r, err := got.R.Fetch(t.Context(), memory.CPU)
	if err != nil || r.Host()[999] != 9 {
		t.Fatalf("ref fetch %v %v", r, err)
	}
	_ = r.Free()
	_ = got.W.Free()
	waitFor(t, func() bool { return a.Store().Len() == 0 })
}

func TestEngineRefusesBadTables(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16, Flow: config.FlowConfig{ReceiveBudgetPerPeer: 1 << 20, ReceiveBudget: 2 << 20}})
	// Beyond the per-peer budget.
	if _, _, _, err := carry(t, a, b, &grad{W: newTensor(t, 2<<20, 1)}); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("over budget: %v", err)
	}
	waitFor(t, func() bool { return a.Store().Len() == 0 }) // its lease was released
	// A field with no entry, an entry with no field.
	out, err := a.Export(b.cfg.Node, &grad{W: newTensor(t, 100, 1)})
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []any{&grad{}, &struct{ N int }{}} {
		if _, err := b.Import(a.cfg.Node, out.Table, msg, memory.CPU); !errors.Is(err, ErrBadTable) {
			t.Fatalf("%T: %v", msg, err)
		}
	}
	var orphan grad
	if err := msgpack.Unmarshal([]byte{0x81, 0xa1, 'W', 0x92, 0x01, 0x09}, &orphan); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Import(a.cfg.Node, nil, &orphan, memory.CPU); !errors.Is(err, ErrBadTable) {
		t.Fatalf("field without a table: %v", err)
	}
}

// TestEngineWindow: a peer that sends messages with tensors beyond the
// window it was given gets them refused, and its connection closed once it
// keeps doing so.
func TestEngineWindow(t *testing.T) {
	holdFetches(t)
	a, b, _, ba := enginePair(t, Config{InlineThreshold: 16, Flow: config.FlowConfig{ReceiveWindow: 2}})
	d := &delivery{ch: make(chan error, 128)}
	refused := 0
	for i := range 2 + maxStrikes {
		_, _, in, err := carry(t, a, b, &grad{Step: i, W: newTensor(t, 100, 1)})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Enqueue(a.cfg.Node, in, 10, d); errors.Is(err, ErrInboxFull) {
			refused++
			in.Abort()
		} else if err != nil {
			t.Fatal(err)
		}
	}
	// The first is being fetched (gated), the second waits: 2 in the
	// window, the rest refused.
	if refused != maxStrikes || ba.closed() == nil {
		t.Fatalf("%d refused, connection closed: %v", refused, ba.closed())
	}
}

// TestEngineBudgetWaits: a message whose tensors do not fit in what is
// left of the node's budget waits for it, and is fetched once it is free.
func TestEngineBudgetWaits(t *testing.T) {
	open := holdFetches(t)
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16, Flow: config.FlowConfig{ReceiveBudget: 1500, ReceiveBudgetPerPeer: 1500}})
	d := &delivery{ch: make(chan error, 4)}
	var got []*grad
	for i := range 2 {
		_, g, in, err := carry(t, a, b, &grad{Step: i, W: newTensor(t, 1000, byte(i))})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Enqueue(a.cfg.Node, in, 10, d); err != nil {
			t.Fatal(err)
		}
		got = append(got, g)
	}
	// The first holds 1000 of 1500 bytes while its fetch is held; the
	// second needs 1000: it waits.
	waitFor(t, func() bool { return b.Stats().BudgetInUse == 1000 })
	open()
	for i := range 2 {
		if err := <-d.ch; err != nil {
			t.Fatal(err)
		}
		_ = got[i].W.Free()
	}
	if u := b.Stats().BudgetInUse; u != 0 {
		t.Fatalf("%d bytes of budget still taken", u)
	}
}

// TestEnginePeerDownAborts: messages waiting when their peer goes down are
// reported failed and their leases released.
func TestEnginePeerDownAborts(t *testing.T) {
	holdFetches(t)
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	d := &delivery{ch: make(chan error, 8)}
	for i := range 3 {
		_, _, in, err := carry(t, a, b, &grad{Step: i, W: newTensor(t, 100, 1)})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Enqueue(a.cfg.Node, in, 10, d); err != nil {
			t.Fatal(err)
		}
	}
	b.PeerDown(a.cfg.Node)
	for range 3 {
		if err := <-d.ch; err == nil {
			t.Fatal("a message of a peer that went down was delivered")
		}
	}
	if err := b.Enqueue(a.cfg.Node, nil, 10, d); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("enqueue after peer down: %v", err)
	}
}

// sent records a Message's Send and Fail calls.
type sent struct {
	mu     sync.Mutex
	sends  int
	failed error
}

func (s *sent) Send() error { s.mu.Lock(); s.sends++; s.mu.Unlock(); return nil }
func (s *sent) Fail(err error) {
	s.mu.Lock()
	s.failed = err
	s.mu.Unlock()
}
func (s *sent) count() (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.sends, s.failed }

// TestEngineOutbox: with the peer's credits out, Send queues (never
// blocks), keeps later messages behind, and sends them as releases come.
func TestEngineOutbox(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16, Flow: config.FlowConfig{MaxInFlight: 1}})
	p := a.peer(b.cfg.Node)
	var ms []*sent
	var outs []*Outgoing
	for i := range 3 {
		out, err := a.Export(b.cfg.Node, &grad{Step: i, W: newTensor(t, 100, 1)})
		if err != nil {
			t.Fatal(err)
		}
		m := &sent{}
		a.Send(b.cfg.Node, out, m)
		ms, outs = append(ms, m), append(outs, out)
	}
	plain := &sent{}
	if !p.Backlogged() {
		t.Fatal("messages wait but the outbox is not backlogged")
	}
	a.Send(b.cfg.Node, nil, plain) // behind them
	if n, _ := ms[0].count(); n != 1 {
		t.Fatalf("first message sent %d times", n)
	}
	for i := 1; i < 3; i++ {
		if n, _ := ms[i].count(); n != 0 {
			t.Fatalf("message %d sent without a credit", i)
		}
	}
	if n, _ := plain.count(); n != 0 {
		t.Fatal("a message without tensors overtook the messages waiting for credits")
	}
	// The peer releases each message's export: the next goes.
	for i := range 3 {
		for _, x := range outs[i].fetched {
			if err := a.store.Release(x.ID, x.Lease); err != nil {
				t.Fatal(err)
			}
		}
		if i < 2 {
			waitFor(t, func() bool { n, _ := ms[i+1].count(); return n == 1 })
		}
	}
	waitFor(t, func() bool { n, _ := plain.count(); return n == 1 })
	waitFor(t, func() bool { return !p.Backlogged() })
}

// inlineDelivery runs its "handler" on the engine's goroutine: it calls
// handoff, reports, then blocks until release is closed.
type inlineDelivery struct {
	handed  chan struct{}
	release chan struct{}
}

func (d *inlineDelivery) Deliver(err error) { panic("Deliver instead of DeliverInline") }

func (d *inlineDelivery) DeliverInline(err error, handoff func()) {
	if err != nil {
		panic(err)
	}
	handoff()
	handoff() // a second call does nothing
	close(d.handed)
	<-d.release
}

// TestEngineInlineDeliveryMovesTheLoop: a lone message delivered inline
// blocks the goroutine that fetched it, not the peer's deliveries: the
// next message is delivered meanwhile, the sender gets its lease back, and
// Close returns without waiting for the blocked handler.
func TestEngineInlineDeliveryMovesTheLoop(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	first := &inlineDelivery{handed: make(chan struct{}), release: make(chan struct{})}
	defer close(first.release)
	x := newTensor(t, 1000, 7)
	_, got, in, err := carry(t, a, b, &grad{Step: 1, W: x})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(a.cfg.Node, in, 100, first); err != nil {
		t.Fatal(err)
	}
	<-first.handed
	if got.W.Host()[999] != 7 {
		t.Fatalf("delivered %v before its fetch", got.W)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released while the handler blocks: %v", err)
	}
	// The next message goes through while the first handler still blocks.
	d := &delivery{ch: make(chan error, 1)}
	_, got2, in2, err := carry(t, a, b, &grad{Step: 2, W: newTensor(t, 1000, 9)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(a.cfg.Node, in2, 100, d); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.ch:
		if err != nil || got2.W.Host()[0] != 9 {
			t.Fatalf("second message: %v, %v", err, got2.W)
		}
	case <-ctx.Done():
		t.Fatal("the second message waited for the first one's handler")
	}
	_ = got.W.Free()
	_ = got2.W.Free()
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close waited for a handler run inline")
	}
}

// stuckLink is a peer's connection that never takes a frame: Send blocks
// until its context ends or the link is opened.
type stuckLink struct {
	open    chan struct{}
	mu      sync.Mutex
	cur     int // Sends blocked now
	max     int // most Sends blocked at once
	sent    int
	atLimit chan struct{} // closed when cur first reaches MaxControlPerPeer
	reached bool
	want    int // allSent is closed after this many Sends
	allSent chan struct{}
}

func (l *stuckLink) Send(ctx context.Context, _ wire.FrameType, _ wire.Flags, _ uint32, _ any) error {
	l.mu.Lock()
	l.cur++
	l.max = max(l.max, l.cur)
	if l.cur == MaxControlPerPeer && !l.reached {
		l.reached = true
		close(l.atLimit)
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.cur--
		l.sent++
		if l.sent == l.want {
			close(l.allSent)
		}
		l.mu.Unlock()
	}()
	select {
	case <-l.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *stuckLink) Close(error) {}

// A peer that floods control requests and never reads the replies holds
// at most MaxControlPerPeer of them (and their goroutines) at once: its
// reader waits in HandleControl instead of starting one goroutine each.
func TestControlRequestsBoundedPerPeer(t *testing.T) {
	mk := func(name string, inc uint64) *Engine {
		e := New(Config{Node: name, Incarnation: inc, Disabled: func(ch string) bool { return ch != "memtest" },
			Dial: func(context.Context, string, string) (net.Conn, error) {
				return nil, errors.New("no data connections here")
			}})
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return e
	}
	e, peer := mk("srv", 1), mk("flood", 2)
	adv, err := peer.Advert()
	if err != nil {
		t.Fatal(err)
	}
	const n = 20 * MaxControlPerPeer
	l := &stuckLink{open: make(chan struct{}), atLimit: make(chan struct{}), want: n, allSent: make(chan struct{})}
	if _, err := e.PeerUp("flood", 2, adv, l); err != nil {
		t.Fatal(err)
	}
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for i := range n {
			e.HandleControl("flood", &wire.Message{Type: ctlRequestType, Target: "nosuchchannel", Request: uint64(i + 1)})
		}
	}()
	<-l.atLimit
	// The reader is now held: the flood cannot finish while every slot
	// waits on the stuck link.
	for e.Stats().ControlWaits == 0 {
		select {
		case <-flooded:
			t.Fatalf("%d control requests taken while %d replies were stuck: no backpressure", n, MaxControlPerPeer)
		default:
			runtime.Gosched()
		}
	}
	if g := runtime.NumGoroutine(); g > 4*MaxControlPerPeer+50 {
		t.Errorf("%d goroutines while the peer's requests are held", g)
	}
	close(l.open)
	<-flooded
	<-l.allSent
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > MaxControlPerPeer {
		t.Errorf("%d replies pending at once, want at most %d", l.max, MaxControlPerPeer)
	}
	if l.sent != n {
		t.Errorf("%d replies sent, want %d", l.sent, n)
	}
}

// A peer that answers one control request twice (or with a reply and an
// error) does not block the reader that takes the second answer.
func TestControlDuplicateReplyDoesNotBlock(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{})
	ch := make(chan ctlReply, 1)
	a.ctlMu.Lock()
	a.ctlWait[77] = ctlWaiter{node: b.cfg.Node, ch: ch}
	a.ctlMu.Unlock()
	for range 3 {
		a.HandleControl(b.cfg.Node, &wire.Message{Type: ctlReplyType, Request: 77, Body: []byte("x")})
		a.HandleError(b.cfg.Node, &wire.Error{Stream: 77, Msg: "again"})
	}
	if r := <-ch; string(r.body) != "x" {
		t.Fatalf("first answer %+v", r)
	}
}
