package actor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
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
// connection for ever; the connection's reading is taken over instead.
func TestInlineHandlerMayWaitForTheSameNode(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	if _, err := a.Root().SpawnNamed(echoProps(a.Name()), "echo"); err != nil {
		t.Fatal(err)
	}
	relay := pa.PropsFromFunc(func(ctx pa.Context) {
		p, ok := ctx.Message().(*Ping)
		if !ok {
			return
		}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := b.Request(rctx, b.PID(a.Name(), "echo"), &Ping{N: p.N + 1})
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
	// A first request may find the new actor still handling Started (then
	// it is queued, not run inline); the next ones find it idle.
	if _, err := a.Request(ctx, remote, &Ping{N: -1}); err != nil {
		t.Fatal(err)
	}
	before := b.Stats().MessagesInline
	for i := range 5 {
		res, err := a.Request(ctx, remote, &Ping{N: i})
		if p, ok := res.(*Pong); err != nil || !ok || p.N != i {
			t.Fatalf("after re-spawn: %v %#v", err, res)
		}
	}
	if got := b.Stats().MessagesInline - before; got != 5 {
		t.Fatalf("%d of 5 requests ran inline after re-spawn", got)
	}
}
