package actor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"github.com/tensorferry/tensorferry/tensor"
)

// gatedChannel is the staging channel with fetches held until the gate
// opens.
type gatedChannel struct {
	rdma.Channel
	gate     chan struct{}
	fetching atomic.Int32
}

func (g *gatedChannel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	g.fetching.Add(1)
	defer g.fetching.Add(-1)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Channel.Fetch(ctx, d, dst)
}

// TestSendWaitsForCredits: a sender allowed two messages (or 600 KiB of
// 256 KiB tensors) unfetched at its peer sends two; the others wait in its
// outbox (Send returns at once) until the peer fetches, then everything
// arrives in order.
func TestSendWaitsForCredits(t *testing.T) {
	t.Run("messages", func(t *testing.T) { testSendWaits(t, actor.WithMaxInFlight(2, 0)) })
	t.Run("bytes", func(t *testing.T) { testSendWaits(t, actor.WithMaxInFlight(0, 600<<10)) })
}

func testSendWaits(t *testing.T, limit actor.Option) {
	a, b, gated, open := startGatedPair(t, limit)
	defer open()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 5
	sk := spawnSink(t, b, n)
	pid := a.PID(b.Name(), "sink")
	var xs []*tensor.Tensor
	for range n {
		x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{256 << 10})
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	// Send never blocks: the messages beyond the credits wait in the
	// node's outbox for the peer, so the loop ends with two sent.
	for i, x := range xs {
		a.Root().Send(pid, &Grad{Step: i, W: x})
	}
	if s := a.Stats().MessagesSent; s != 2 {
		t.Fatalf("%d messages sent with 2 credits and nothing fetched", s)
	}
	waitUntil(t, func() bool { return gated.fetching.Load() >= 1 })
	// The first message may be fetched alone (the peer fetches a lone
	// message on its deliver loop, and the second waits behind it).
	if f := gated.fetching.Load(); f < 1 || f > 2 {
		t.Errorf("%d fetches waiting at the peer, want 1 or 2", f)
	}
	open()
	select {
	case <-sk.done:
	case <-ctx.Done():
		t.Fatal("not every message arrived")
	}
	sk.inOrder(t)
	for _, x := range xs {
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// startGatedPair starts two nodes of one process; the second's staging
// fetches wait until open is called (idempotent).
func startGatedPair(t *testing.T, senderOpts ...actor.Option) (a, b *actor.Node, gated *gatedChannel, open func()) {
	t.Helper()
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	gated = &gatedChannel{gate: make(chan struct{})}
	var once sync.Once
	open = func() { once.Do(func() { close(gated.gate) }) }
	gatedStaging := actor.WithChannel(rdma.Staging, func(env *rdma.Env) (rdma.Channel, error) {
		ch, err := staging.New(env)
		if err != nil {
			return nil, err
		}
		gated.Channel = ch
		return gated, nil
	})
	a, err = actor.NewNode(cfg, cfg.Nodes[0].Name, append([]actor.Option{testLogger()}, senderOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	b, err = actor.NewNode(cfg, cfg.Nodes[1].Name, testLogger(), gatedStaging)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*actor.Node{a, b} {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
	}
	t.Cleanup(open) // before the nodes stop
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitPeer(ctx, b.Name()); err != nil {
		t.Fatal(err)
	}
	return a, b, gated, open
}

// TestReaderNeverBlocks: hundreds of messages queued behind a tensor that
// cannot be fetched yet do not stop the receiver from reading its
// connection (heartbeats, control replies): the sender is not declared
// down, and everything arrives once the fetch goes on.
func TestReaderNeverBlocks(t *testing.T) {
	a, b, gated, open := startGatedPair(t)
	defer open()
	downs := make(chan any, 4)
	sub := b.System().EventStream.Subscribe(func(ev any) {
		if _, ok := ev.(*cluster.NodeDown); ok {
			downs <- ev
		}
	})
	defer b.System().EventStream.Unsubscribe(sub)
	var got atomic.Int32
	const plain = 1000
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *Grad:
			_ = m.W.Free()
			got.Add(1)
		case *Ping:
			got.Add(1)
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}
	pid := a.PID(b.Name(), "sink")
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	a.Root().Send(pid, &Grad{W: x})
	for i := range plain {
		a.Root().Send(pid, &Ping{N: i})
	}
	deadline := time.Now().Add(5 * time.Second)
	for gated.fetching.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// Longer than the failure timeout (2 s in LocalConfig).
	select {
	case ev := <-downs:
		t.Fatalf("the sender was declared down while the receiver queued: %+v", ev)
	case <-time.After(3 * time.Second):
	}
	if n := got.Load(); n != 0 {
		t.Fatalf("%d messages delivered past a tensor not fetched yet", n)
	}
	open()
	for got.Load() < plain+1 && time.Now().Before(deadline.Add(10*time.Second)) {
		time.Sleep(time.Millisecond)
	}
	if n := got.Load(); n != plain+1 {
		t.Fatalf("%d of %d messages arrived", n, plain+1)
	}
}

// waitUntil polls cond, which another goroutine makes true, until the test
// times out.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-t.Context().Done():
			t.Fatal("condition never held")
		case <-tick.C:
		}
	}
}

// TestSendFromReceiveNeverBlocks: an actor that sends tensor messages from
// its Receive to a peer whose credits are out (nothing fetched) finishes
// its Receive at once and goes on handling messages; the messages arrive,
// in order, once the peer fetches.
func TestSendFromReceiveNeverBlocks(t *testing.T) {
	a, b, _, open := startGatedPair(t, actor.WithMaxInFlight(1, 0))
	const n = 6
	sk := spawnSink(t, b, n)
	sink := a.PID(b.Name(), "sink")
	sentAll, handledNext := make(chan struct{}), make(chan struct{})
	sender, err := a.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		switch c.Message().(type) {
		case string:
			for i := range n {
				x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{256 << 10})
				if err != nil {
					t.Error(err)
					return
				}
				c.Send(sink, &Grad{Step: i, W: x})
			}
			close(sentAll)
		case *Ping:
			close(handledNext)
		}
	}), "sender")
	if err != nil {
		t.Fatal(err)
	}
	a.Root().Send(sender, "go")
	a.Root().Send(sender, &Ping{})
	<-sentAll     // Receive returned with 5 messages waiting for credit
	<-handledNext // and the actor handles its next message
	if s := a.Stats().MessagesSent; s != 1 {
		t.Fatalf("%d messages sent with 1 credit and nothing fetched", s)
	}
	open()
	<-sk.done
	sk.inOrder(t)
}

// TestLendCheckReportsAWritingOwner: with WithLendCheck, an owner that
// writes a tensor (through the raw read path) while the peer has not
// fetched it yet is reported; Write itself refuses while lent.
func TestLendCheckReportsAWritingOwner(t *testing.T) {
	a, b, gated, open := startGatedPair(t, actor.WithLendCheck())
	arrived := make(chan struct{})
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_ = g.W.Free()
			close(arrived)
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	a.Root().Send(a.PID(b.Name(), "sink"), &Grad{W: x})
	waitUntil(t, func() bool { return gated.fetching.Load() >= 1 })
	if err := x.Write(func(memory.Buffer) error { return nil }); !errors.Is(err, tensor.ErrLeased) {
		t.Fatalf("Write while lent: %v", err)
	}
	x.Host()[0] = 1 // a write the API cannot stop
	open()
	<-arrived
	if err := x.WaitReleased(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v := a.Stats().LendViolations; v != 1 {
		t.Fatalf("%d lend violations reported, want 1", v)
	}
}

// TestLocalSendPassesThePointer: a send to an actor of the same node is
// protoactor's local send: the receiver gets the sender's *Tensor itself,
// not lent (no lease) and not copied (see the Node documentation).
func TestLocalSendPassesThePointer(t *testing.T) {
	a, _, _, _ := startGatedPair(t)
	got := make(chan *tensor.Tensor, 1)
	pid, err := a.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			got <- g.W
		}
	}), "local-sink")
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	a.Root().Send(pid, &Grad{W: x})
	if w := <-got; w != x || x.Leases() != 0 {
		t.Fatalf("local delivery gave %p (sent %p), %d leases", w, x, x.Leases())
	}
}

// TestCreditsComeBack: a stream of tensor messages under few credits all
// arrive: each credit comes back when the peer releases the message's
// tensors, even when it does so before the sender's Send has returned.
func TestCreditsComeBack(t *testing.T) {
	a, b, _, open := startGatedPair(t, actor.WithMaxInFlight(2, 0))
	open()
	const n = 300
	got := make(chan int, n)
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_ = g.W.Free()
			got <- g.Step
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	pid := a.PID(b.Name(), "sink")
	for i := range n {
		// Each send lends x again: the next waits in the outbox for a
		// credit, which comes back with the peer's release of x.
		a.Root().Send(pid, &Grad{Step: i, W: x})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		select {
		case s := <-got:
			if s != i {
				t.Fatalf("message %d arrived as %d", s, i)
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d messages arrived: credits lost", i, n)
		}
	}
}

// sink records the steps of the Grads it gets (freeing their tensors);
// done is closed at the n-th.
type sink struct {
	mu   sync.Mutex
	got  []int
	done chan struct{}
}

// spawnSink spawns a sink as "sink" on node.
func spawnSink(t *testing.T, node *actor.Node, n int) *sink {
	t.Helper()
	sk := &sink{done: make(chan struct{})}
	if _, err := node.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_ = g.W.Free()
			sk.mu.Lock()
			sk.got = append(sk.got, g.Step)
			if len(sk.got) == n {
				close(sk.done)
			}
			sk.mu.Unlock()
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}
	return sk
}

// inOrder fails unless the steps arrived as 0, 1, 2...
func (sk *sink) inOrder(t *testing.T) {
	t.Helper()
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for i, v := range sk.got {
		if v != i {
			t.Fatalf("arrival order %v", sk.got)
		}
	}
}
