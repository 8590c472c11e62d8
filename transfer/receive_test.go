package transfer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/tensor"
)

// directFetches turns memtest's FetchDirect on for the test.
func directFetches(t *testing.T) {
	memtestDirect.Store(true)
	t.Cleanup(func() { memtestDirect.Store(false) })
}

// recorder records the messages it delivers, in order, and whether each
// ran inline (with the handoff it was given).
type recorder struct {
	mu      sync.Mutex
	order   []int
	errs    []error
	check   func(id int) // called as the message is delivered
	handler func(id int) // an InlineDelivery's handler, run after handoff
}

type recorded struct {
	r      *recorder
	id     int
	inline bool
}

func (r *recorder) delivery(id int, inline bool) Delivery {
	d := &recorded{r: r, id: id}
	if inline {
		return &recordedInline{d}
	}
	return d
}

func (d *recorded) Deliver(err error) {
	if err == nil && d.r.check != nil {
		d.r.check(d.id)
	}
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	d.r.order = append(d.r.order, d.id)
	d.r.errs = append(d.r.errs, err)
}

type recordedInline struct{ *recorded }

// DeliverInline records the message (its place downstream), then calls
// handoff, as the contract asks.
func (d *recordedInline) DeliverInline(err error, handoff func()) {
	d.inline = true
	d.Deliver(err)
	handoff()
	if d.r.handler != nil {
		d.r.handler(d.id)
	}
}

func (r *recorder) got() ([]int, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order), slices.Clone(r.errs)
}

// TestEngineReceiveOnTheCaller: a lone message whose channel fetches
// directly is fetched and delivered before Receive returns, an
// InlineDelivery with the handoff Receive was given; the lease goes back
// and nothing stays held.
func TestEngineReceiveOnTheCaller(t *testing.T) {
	directFetches(t)
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	r := &recorder{}
	var gotW []*tensor.Tensor
	r.check = func(id int) {
		if w := gotW[id]; w.Host() == nil || w.Host()[999] != byte(id+1) {
			t.Errorf("message %d delivered before its fetch: %v", id, w)
		}
	}
	mayBlocks := 0
	var xs []*tensor.Tensor
	r.handler = func(id int) {
		// The lease is back while the handler runs: it may wait for the
		// peer, which may need that credit to answer.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := xs[id].WaitReleased(ctx); err != nil {
			t.Errorf("lease held while the inline handler runs: %v", err)
		}
	}
	for id, inline := range []bool{true, false} {
		x := newTensor(t, 1000, byte(id+1))
		xs = append(xs, x)
		_, got, in, err := carry(t, a, b, &grad{Step: id, W: x})
		if err != nil {
			t.Fatal(err)
		}
		gotW = append(gotW, got.W)
		d := r.delivery(id, inline)
		if err := b.Receive(a.cfg.Node, in, 100, d, func() { mayBlocks++ }); err != nil {
			t.Fatal(err)
		}
		if order, errs := r.got(); len(order) != id+1 || errs[id] != nil {
			t.Fatalf("message %d not delivered when Receive returned: %v %v", id, order, errs)
		}
		if inline && (!d.(*recordedInline).inline || mayBlocks != 1) {
			t.Fatalf("an InlineDelivery ran inline=%v with %d calls of the handoff given", d.(*recordedInline).inline, mayBlocks)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatalf("lease not released: %v", err)
		}
		cancel()
		_ = got.W.Free()
	}
	s := b.Stats()
	if s.Channels["memtest"].Transfers != 2 || s.BudgetInUse != 0 || s.ReaderDeliveries != 2 {
		t.Fatalf("stats after two direct fetches: %+v", s)
	}
	if p := b.peer(a.cfg.Node); p.Backlog() || p.inbox.inWindow != 0 {
		t.Fatalf("a direct fetch left the inbox counting: backlog %v, window %d", p.Backlog(), p.inbox.inWindow)
	}
}

// TestEngineReceiveKeepsOrder: a message behind one queued (its fetch
// held) is queued too, though its channel could fetch it directly, and
// they are delivered in order; with the budget taken, the channel
// declining, or a tensor above ReaderFetchMax, the message is queued and
// delivered by the loop.
func TestEngineReceiveKeepsOrder(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	r := &recorder{}
	open := holdFetches(t)
	send := func(id int) {
		t.Helper()
		_, got, in, err := carry(t, a, b, &grad{Step: id, W: newTensor(t, 1000, byte(id))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = got.W.Free() })
		if err := b.Receive(a.cfg.Node, in, 100, r.delivery(id, id%2 == 0), nil); err != nil {
			t.Fatal(err)
		}
	}
	send(0) // the channel declines: queued, its fetch held
	memtestDirect.Store(true)
	t.Cleanup(func() { memtestDirect.Store(false) })
	send(1) // behind it
	if order, _ := r.got(); len(order) != 0 {
		t.Fatalf("delivered %v while the first fetch is held", order)
	}
	open()
	waitFor(t, func() bool { order, _ := r.got(); return len(order) == 2 })
	if order, errs := r.got(); !slices.Equal(order, []int{0, 1}) || errs[0] != nil || errs[1] != nil {
		t.Fatalf("delivered %v (%v), want [0 1]", order, errs)
	}

	// The budget has no room now: queued, delivered once it has.
	p := b.peer(a.cfg.Node)
	waitFor(t, func() bool { return !p.Backlog() })
	if !p.budget.tryAcquire(b.cfg.Flow.ReceiveBudgetPerPeer) {
		t.Fatal("the peer's budget is in use")
	}
	send(2)
	if order, _ := r.got(); len(order) != 2 {
		t.Fatalf("delivered %v without the budget", order)
	}
	p.budget.release(b.cfg.Flow.ReceiveBudgetPerPeer)
	waitFor(t, func() bool { order, _ := r.got(); return len(order) == 3 })
	if order, errs := r.got(); order[2] != 2 || errs[2] != nil {
		t.Fatalf("delivered %v (%v)", order, errs)
	}

	// A tensor above ReaderFetchMax goes through the loop (its fetch held
	// there: one on the reader would not wait).
	waitFor(t, func() bool { return !p.Backlog() })
	open = holdFetches(t)
	_, got, in, err := carry(t, a, b, &grad{Step: 3, W: newTensor(t, ReaderFetchMax+1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = got.W.Free() })
	if err := b.Receive(a.cfg.Node, in, 100, r.delivery(3, false), nil); err != nil {
		t.Fatal(err)
	}
	if order, _ := r.got(); len(order) != 3 {
		t.Fatalf("a tensor of %d bytes was fetched on the reader", ReaderFetchMax+1)
	}
	open()
	waitFor(t, func() bool { order, _ := r.got(); return len(order) == 4 })
	if n := b.Stats().ReaderDeliveries; n != 0 {
		t.Fatalf("%d messages counted as delivered on the reader, want none", n)
	}
}

// TestEngineReceiveFetchFails: a direct fetch that fails is reported to
// the delivery before Receive returns, and leaves nothing held.
func TestEngineReceiveFetchFails(t *testing.T) {
	directFetches(t)
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	out, got, in, err := carry(t, a, b, &grad{W: newTensor(t, 1000, 1)})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range out.fetched { // the owner drops the export first
		if err := a.store.Release(x.ID, x.Lease); err != nil {
			t.Fatal(err)
		}
	}
	r := &recorder{}
	if err := b.Receive(a.cfg.Node, in, 100, r.delivery(0, true), nil); err != nil {
		t.Fatal(err)
	}
	order, errs := r.got()
	if len(order) != 1 || !errors.Is(errs[0], tensor.ErrUnknownExport) {
		t.Fatalf("delivered %v with %v, want the fetch's error", order, errs)
	}
	if _, still := tensor.Placeholder(got.W); !still {
		t.Fatal("a failed fetch filled the tensor")
	}
	p := b.peer(a.cfg.Node)
	if s := b.Stats(); p.Backlog() || p.inbox.inWindow != 0 || s.BudgetInUse != 0 {
		t.Fatalf("a failed direct fetch left backlog %v, window %d, budget %d", p.Backlog(), p.inbox.inWindow, s.BudgetInUse)
	}
}
