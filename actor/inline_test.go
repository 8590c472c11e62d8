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
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestInlineDeliveryOrder: an actor with inline delivery gets messages from
// other nodes (alone and in bursts) and from local senders, each sender's
// in order, one at a time.
func TestInlineDeliveryOrder(t *testing.T) {
	_, nodes := startCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	var mu sync.Mutex
	got := map[int][]int{} // sender → numbers
	running := 0
	all := make(chan struct{})
	const perSender = 2000
	props := pa.PropsFromFunc(func(ctx pa.Context) {
		p, ok := ctx.Message().(*Ping)
		if !ok {
			return
		}
		mu.Lock()
		running++
		if running != 1 {
			mu.Unlock()
			panic("two messages handled at once")
		}
		got[p.N/perSender] = append(got[p.N/perSender], p.N%perSender)
		total := 0
		for _, v := range got {
			total += len(v)
		}
		running--
		mu.Unlock()
		if total == 3*perSender {
			close(all)
		}
	}, c.WithInlineDelivery())
	base := actor.InlineActors(c) // the built-in ping actor has inline delivery
	if _, err := c.Root().SpawnNamed(props, "sink"); err != nil {
		t.Fatal(err)
	}
	if n := actor.InlineActors(c); n != base+1 {
		t.Fatalf("InlineActors = %d, want %d", n, base+1)
	}
	var wg sync.WaitGroup
	for s, n := range []*actor.Node{a, b, c} {
		wg.Go(func() {
			pid := n.PID(c.Name(), "sink")
			for i := range perSender {
				n.Root().Send(pid, &Ping{N: s*perSender + i})
				if i%50 == 0 {
					time.Sleep(200 * time.Microsecond) // some messages alone in their frame
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatal("not every message arrived")
	}
	mu.Lock()
	defer mu.Unlock()
	for s, v := range got {
		for i, x := range v {
			if x != i {
				t.Fatalf("sender %d: message %d is %d", s, i, x)
			}
		}
	}
}

// TestInlineHandlerMayWaitForTheSameNode: an inline handler that waits for
// a reply from the node whose message it handles would stall that node's
// connection for ever; the connection's reading is taken over instead, at
// once when the handler waits through Node.Request or through a protoactor
// future (a take-over delay of a minute is never reached), over TCP and
// over shared memory.
func TestInlineHandlerMayWaitForTheSameNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		shm  shm.Config
	}{{"tcp", shm.Config{Disable: true}}, {"shm", shm.Config{}}} {
		for _, future := range []bool{false, true} {
			name := tc.name + "/Request"
			if future {
				name = tc.name + "/RequestFuture"
			}
			t.Run(name, func(t *testing.T) { testInlineHandlerMayWait(t, tc.shm, future) })
		}
	}
}

func testInlineHandlerMayWait(t *testing.T, sc shm.Config, future bool) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Transport.HandlerTakeover = time.Minute
	nodes := startNodes(t, cfg, actor.WithSharedMemory(sc))
	a, b := nodes[0], nodes[1]
	if _, err := a.Root().SpawnNamed(echoProps(a.Name()), "echo"); err != nil {
		t.Fatal(err)
	}
	relay := pa.PropsFromFunc(func(ctx pa.Context) {
		p, ok := ctx.Message().(*Ping)
		if !ok {
			return
		}
		var res any
		var err error
		if future {
			res, err = ctx.RequestFuture(b.PID(a.Name(), "echo"), &Ping{N: p.N + 1}, 5*time.Second).Result()
		} else {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err = b.Request(rctx, b.PID(a.Name(), "echo"), &Ping{N: p.N + 1})
			cancel()
		}
		if err != nil {
			ctx.Respond(&Pong{N: -1, From: err.Error()})
			return
		}
		ctx.Respond(res)
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(relay, "relay"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		start := time.Now()
		res, err := a.Request(ctx, a.PID(b.Name(), "relay"), &Ping{N: 10 * i})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := res.(*Pong); !ok || p.N != 10*i+1 {
			t.Fatalf("reply %#v", res)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("relayed request took %v", d)
		}
	}
}

// TestInlineHandlerPanicAndStop: a panic in an inline handler goes to the
// supervisor (which restarts the actor) without hurting the connection;
// a stopped actor leaves the node's inline table.
func TestInlineHandlerPanicAndStop(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	props := pa.PropsFromFunc(func(ctx pa.Context) {
		if p, ok := ctx.Message().(*Ping); ok {
			if p.N < 0 {
				panic("asked to panic")
			}
			ctx.Respond(&Pong{N: p.N})
		}
	}, b.WithInlineDelivery())
	base := actor.InlineActors(b)
	pid, err := b.Root().SpawnNamed(props, "fragile")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	remote := a.PID(b.Name(), "fragile")
	a.Root().Send(remote, &Ping{N: -1})
	for i := range 10 {
		res, err := a.Request(ctx, remote, &Ping{N: i})
		if p, ok := res.(*Pong); err != nil || !ok || p.N != i {
			t.Fatalf("after a panic: %v %#v", err, res)
		}
	}
	if err := b.Root().StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if n := actor.InlineActors(b); n != base {
		t.Fatalf("InlineActors = %d after Stop, want %d", n, base)
	}
	if _, err := a.Request(ctx, remote, &Ping{}); err == nil {
		t.Fatal("request to a stopped actor succeeded")
	}
}

// TestInlineActorWatchAndPoison: watching, poisoning and re-spawning an
// actor with inline delivery across nodes works as with protoactor's own
// mailbox, and the node's inline table follows.
func TestInlineActorWatchAndPoison(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	props := echoProps(b.Name()).Configure(b.WithInlineDelivery())
	base := actor.InlineActors(b)
	if _, err := b.Root().SpawnNamed(props, "watched"); err != nil {
		t.Fatal(err)
	}
	remote := a.PID(b.Name(), "watched")
	rec := newRecorder()
	if _, err := a.Root().SpawnNamed(rec.props(remote), "watcher"); err != nil {
		t.Fatal(err)
	}
	<-rec.started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Request(ctx, remote, &Ping{N: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.Root().PoisonFuture(remote).Wait(); err != nil {
		t.Fatalf("PoisonFuture: %v", err)
	}
	rec.wait(t, 1, 5*time.Second)
	rec.mu.Lock()
	why := rec.terms[0].Why
	rec.mu.Unlock()
	if why != pa.TerminatedReason_Stopped {
		t.Fatalf("Terminated.Why = %v, want Stopped", why)
	}
	if n := actor.InlineActors(b); n != base {
		t.Fatalf("InlineActors = %d after poison, want %d", n, base)
	}
	// The same name again: requests reach the new actor, inline.
	if _, err := b.Root().SpawnNamed(props, "watched"); err != nil {
		t.Fatal(err)
	}
	if n := actor.InlineActors(b); n != base+1 {
		t.Fatalf("InlineActors = %d after re-spawn, want %d", n, base+1)
	}
	// A request runs inline when it finds the actor idle. One that finds
	// it still busy (handling Started, or the previous request on the
	// dispatcher's goroutine, which has replied but not yet gone idle) is
	// queued instead, and the next may find the same: so each request is
	// checked, and requests go on until one has run inline (none ever
	// would if the new actor's mailbox were not the node's).
	before := b.Stats().MessagesInline
	for i := 0; b.Stats().MessagesInline == before; i++ {
		if i == 100 {
			t.Fatal("no request of 100 ran inline after re-spawn")
		}
		res, err := a.Request(ctx, remote, &Ping{N: i})
		if p, ok := res.(*Pong); err != nil || !ok || p.N != i {
			t.Fatalf("after re-spawn: %v %#v", err, res)
		}
	}
}

// TestInlineTensorMessages: messages whose tensors the engine fetches run
// inline on the engine's goroutine when they arrive alone and find the
// actor idle; mixed with plain messages and bursts, each sender's messages
// still arrive in order, and every lease goes back to the sender.
func TestInlineTensorMessages(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	var mu sync.Mutex
	var got []int
	props := pa.PropsFromFunc(func(ctx pa.Context) {
		n := -1
		switch m := ctx.Message().(type) {
		case *Grad:
			n = m.Step
			if m.W.ByteSize() != 1<<18 || m.W.Host()[7] != byte(m.Step) {
				n = -2 // wrong bytes: fails the order check below
			}
			_ = m.W.Free()
		case *Ping:
			n = m.N
		default:
			return
		}
		mu.Lock()
		got = append(got, n)
		mu.Unlock()
		if ctx.Sender() != nil {
			ctx.Respond(&Pong{N: n})
		}
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(props, "sink"); err != nil {
		t.Fatal(err)
	}
	pid := a.PID(b.Name(), "sink")
	grad := func(step int) *Grad {
		x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 18})
		if err != nil {
			t.Fatal(err)
		}
		x.Host()[7] = byte(step)
		return &Grad{Step: step, W: x}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Lone messages, one request at a time: they run inline, unless one
	// arrives before the actor's previous handler, which answered before
	// returning, has returned (or finds the actor still starting).
	var sent []*tensor.Tensor
	var inline int64
	for i := range 20 {
		if i == 1 {
			inline = b.Stats().MessagesInline
		}
		g := grad(i)
		sent = append(sent, g.W)
		if _, err := a.Request(ctx, pid, g); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Stats().MessagesInline - inline; n < 5 {
		t.Fatalf("%d of 19 lone tensor messages ran inline", n)
	}
	// Then a burst of tensor and plain messages mixed.
	for i := 20; i < 200; i++ {
		if i%3 == 0 {
			a.Root().Send(pid, &Ping{N: i})
			continue
		}
		g := grad(i)
		sent = append(sent, g.W)
		a.Root().Send(pid, g)
	}
	if _, err := a.Request(ctx, pid, &Ping{N: 200}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for i, n := range got {
		if n != i {
			mu.Unlock()
			t.Fatalf("message %d is %d (of %d)", i, n, len(got))
		}
	}
	if len(got) != 201 {
		t.Fatalf("%d of 201 messages", len(got))
	}
	mu.Unlock()
	for _, x := range sent {
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatalf("%v: lease not released: %v", x, err)
		}
		_ = x.Free()
	}
}

// TestInlineTensorHandlerMayWaitForTheSamePeer: a tensor message's handler
// run inline on the engine's goroutine waits for a reply of the same peer
// that carries a tensor (fetched by that peer's delivery loop, which moved
// to another goroutine), and the sender gets its lease back while the
// handler still runs.
func TestInlineTensorHandlerMayWaitForTheSamePeer(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	spawnTestActors(a)
	proceed := make(chan struct{})
	relay := pa.PropsFromFunc(func(ctx pa.Context) {
		g, ok := ctx.Message().(*Grad)
		if !ok {
			return
		}
		_ = g.W.Free()
		<-proceed
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The tensors actor of a answers a RefMsg with a Digest; ask it
		// for one of a tensor of b's, which a fetches, then a Grad back.
		x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 18})
		if err != nil {
			ctx.Respond(&Pong{N: -1, From: err.Error()})
			return
		}
		defer x.Free()
		res, err := b.Request(rctx, b.PID(a.Name(), "tensors"), &Grad{W: x})
		if err != nil {
			ctx.Respond(&Pong{N: -1, From: err.Error()})
			return
		}
		if d, ok := res.(*Digest); !ok || d.Err != "" {
			ctx.Respond(&Pong{N: -1, From: "bad digest"})
			return
		}
		ctx.Respond(&Pong{N: g.Step})
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(relay, "relay"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 18})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	done := make(chan error, 1)
	go func() {
		res, err := a.Request(ctx, a.PID(b.Name(), "relay"), &Grad{Step: 7, W: x})
		if err == nil {
			if p, ok := res.(*Pong); !ok || p.N != 7 {
				err = errors.New("reply " + p.From)
			}
		}
		done <- err
	}()
	// The handler waits for proceed: the lease must come back meanwhile.
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released while the handler runs: %v", err)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestInlineMailboxBounded: a peer that floods an inline actor faster than
// it runs fills its mailbox to a bound, then its connection's reader waits
// (Stats().InlineBackpressure); the node's other peers are not held up.
func TestInlineMailboxBounded(t *testing.T) {
	_, nodes := startCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	props := pa.PropsFromFunc(func(ctx pa.Context) {
		if _, ok := ctx.Message().(*Ping); ok {
			<-release
		}
	}, c.WithInlineDelivery())
	if _, err := c.Root().SpawnNamed(props, "slow"); err != nil {
		t.Fatal(err)
	}
	pid := a.PID(c.Name(), "slow")
	const n = 1<<16 + 20000 // more than the bound
	go func() {
		for i := range n {
			a.Root().Send(pid, &Ping{N: i})
		}
	}()
	poll.Until(t, "the reader from a waits for the inline mailbox", func() bool {
		return c.Stats().InlineBackpressure > 0
	})
	// b's connection to c has its own reader.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Ping(ctx, c.Name(), []byte("x")); err != nil {
		t.Fatalf("b's ping while a's connection waits: %v", err)
	}
	once.Do(func() { close(release) })
}

// TestInlineDeliverySwitchedOff: with transport.inline_delivery off, an
// actor spawned with WithInlineDelivery gets protoactor's mailbox (no
// inline mailbox is registered, the built-in ping actor's neither) and
// still answers requests from another node.
func TestInlineDeliverySwitchedOff(t *testing.T) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Transport.InlineDelivery = config.SwitchOff
	nodes := startNodes(t, cfg)
	a, b := nodes[0], nodes[1]
	props := pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Ping); ok {
			c.Respond(&Pong{N: p.N, From: b.Name()})
		}
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(props, "echo"); err != nil {
		t.Fatal(err)
	}
	if n := actor.InlineActors(b); n != 0 {
		t.Fatalf("InlineActors = %d with inline_delivery off, want 0", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 10 {
		res, err := a.Request(ctx, a.PID(b.Name(), "echo"), &Ping{N: i})
		if pong, ok := res.(*Pong); err != nil || !ok || pong.N != i {
			t.Fatalf("request %d: %#v, %v", i, res, err)
		}
	}
}

// TestInlineMailboxBoundedTwoReaders: when the readers of two peers'
// connections both wait for room in one inline mailbox, both go on once
// the actor has run the backlog down: every message of both arrives.
func TestInlineMailboxBoundedTwoReaders(t *testing.T) {
	_, nodes := startCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	const n = 1 << 16 // from each sender: together past the bound
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	var got atomic.Int64
	all := make(chan struct{})
	props := pa.PropsFromFunc(func(ctx pa.Context) {
		if _, ok := ctx.Message().(*Ping); ok {
			<-release
			if got.Add(1) == 2*n {
				close(all)
			}
		}
	}, c.WithInlineDelivery())
	if _, err := c.Root().SpawnNamed(props, "slow"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*actor.Node{a, b} {
		pid := s.PID(c.Name(), "slow")
		go func() {
			for i := range n {
				s.Root().Send(pid, &Ping{N: i})
			}
		}()
	}
	poll.Until(t, "both readers wait for the inline mailbox", func() bool {
		return c.Stats().InlineBackpressure >= 2
	})
	once.Do(func() { close(release) })
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d messages arrived: a reader waits for room for ever", got.Load(), 2*n)
	}
}
