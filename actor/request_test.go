package actor_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// echoPair starts two nodes, each with an "echo" actor.
func echoPair(t *testing.T) (a, b *actor.Node) {
	t.Helper()
	_, nodes := startCluster(t, 2)
	a, b = nodes[0], nodes[1]
	for _, n := range nodes {
		if _, err := n.Root().SpawnNamed(echoProps(n.Name()), "echo"); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func TestNodeRequest(t *testing.T) {
	a, b := echoPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Concurrent callers: every reply reaches its own request.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				n := g*1000 + i
				res, err := a.Request(ctx, a.PID(b.Name(), "echo"), &Ping{N: n})
				if err != nil {
					errs <- err
					return
				}
				if p, ok := res.(*Pong); !ok || p.N != n || p.From != b.Name() {
					errs <- errors.New("wrong reply")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// A local target goes through protoactor's future.
	res, err := a.Request(ctx, a.PID(a.Name(), "echo"), &Ping{N: 7})
	if p, ok := res.(*Pong); err != nil || !ok || p.From != a.Name() {
		t.Fatalf("local request: %v %#v", err, res)
	}
	if n := actor.WaitingRequests(a); n != 0 {
		t.Fatalf("%d requests still waiting", n)
	}
}

func TestNodeRequestFailures(t *testing.T) {
	cfg, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	ctx := context.Background()

	// An absent actor: a dead letter at once.
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.Request(tctx, a.PID(b.Name(), "nobody"), &Ping{}); !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("absent actor: err = %v, want ErrDeadLetter", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("absent actor: failed after %v", d)
	}
	// An unregistered message type: not encodable, fails at once.
	if _, err := a.Request(tctx, a.PID(b.Name(), "nobody"), &struct{ X int }{}); !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("unregistered type: err = %v, want ErrDeadLetter", err)
	}

	// No reply before the deadline; the late reply is dropped.
	release := make(chan struct{})
	slow := pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Ping); ok {
			<-release
			c.Respond(&Pong{N: p.N})
		}
	})
	if _, err := b.Root().SpawnNamed(slow, "slow"); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer scancel()
	if _, err := a.Request(sctx, a.PID(b.Name(), "slow"), &Ping{N: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow actor: err = %v, want DeadlineExceeded", err)
	}
	close(release)
	if n := actor.WaitingRequests(a); n != 0 {
		t.Fatalf("%d requests still waiting after the deadline", n)
	}
	// The late reply does not reach the next request.
	res, err := a.Request(tctx, a.PID(b.Name(), "slow"), &Ping{N: 2})
	if p, ok := res.(*Pong); err != nil || !ok || p.N != 2 {
		t.Fatalf("after a late reply: %v %#v", err, res)
	}

	// The target's node goes down while the request waits.
	silent := pa.PropsFromFunc(func(pa.Context) {})
	if _, err := b.Root().SpawnNamed(silent, "silent"); err != nil {
		t.Fatal(err)
	}
	received := b.Stats().MessagesReceived
	done := make(chan error, 1)
	go func() {
		_, err := a.Request(tctx, a.PID(b.Name(), "silent"), &Ping{})
		done <- err
	}()
	for b.Stats().MessagesReceived == received { // b has the request
		time.Sleep(time.Millisecond)
	}
	_ = b.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, actor.ErrNoReply) || !errors.Is(err, actor.ErrNodeDown) {
			t.Fatalf("node down: err = %v, want ErrNoReply and ErrNodeDown", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node down: the request still waits")
	}
	// A node that is down: fails at once.
	if _, err := a.Request(tctx, a.PID(cfg.Nodes[1].Name, "silent"), &Ping{}); !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("down node: err = %v, want ErrDeadLetter", err)
	}
	if _, err := a.Request(tctx, nil, &Ping{}); !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("nil target: err = %v", err)
	}
	if n := actor.WaitingRequests(a); n != 0 {
		t.Fatalf("%d requests still waiting", n)
	}
}

// TestNodeRequestTimeout: RequestTimeout answers as Request does, remote and
// local, and gives DeadlineExceeded when no reply comes in time: while the
// caller reads the connection itself (leading), and while it waits behind
// another caller that reads it (following, where the wait arms a timer).
func TestNodeRequestTimeout(t *testing.T) {
	a, b := echoPair(t)
	for i, pid := range []*pa.PID{a.PID(b.Name(), "echo"), a.PID(a.Name(), "echo")} {
		res, err := a.RequestTimeout(pid, &Ping{N: i}, 10*time.Second)
		if p, ok := res.(*Pong); err != nil || !ok || p.N != i || p.From != pid.Address {
			t.Fatalf("request to %v: %v %#v", pid, err, res)
		}
	}
	if _, err := a.RequestTimeout(a.PID(b.Name(), "echo"), &Ping{}, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timeout 0: err = %v, want DeadlineExceeded", err)
	}

	// Two callers wait on an actor that never replies: one of them reads
	// the connection, the other follows; both time out, and nothing stays
	// registered.
	silent := pa.PropsFromFunc(func(pa.Context) {})
	if _, err := b.Root().SpawnNamed(silent, "silent"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := a.RequestTimeout(a.PID(b.Name(), "silent"), &Ping{}, 100*time.Millisecond)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("silent actor: err = %v, want DeadlineExceeded", err)
		}
	}
	if n := actor.WaitingRequests(a); n != 0 {
		t.Fatalf("%d requests still waiting after their timeout", n)
	}
	// The connection still serves requests.
	if res, err := a.RequestTimeout(a.PID(b.Name(), "echo"), &Ping{N: 9}, 10*time.Second); err != nil || res.(*Pong).N != 9 {
		t.Fatalf("after the timeouts: %v %#v", err, res)
	}
}

// TestNodeRequestReplyWithTensor: a reply that carries a tensor too large to
// travel inline is fetched before Request returns it.
func TestNodeRequestReplyWithTensor(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	rng := rand.New(rand.NewPCG(7, 9))
	w := randomTensor(t, rng, tensor.Float32, tensor.Shape{256, 1024}) // 1 MiB
	defer w.Free()
	want := digest(w)
	server := pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Ping); ok {
			c.Respond(&Grad{Step: p.N, W: w})
		}
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(server, "weights"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		res, err := a.Request(ctx, a.PID(b.Name(), "weights"), &Ping{N: i})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		g, ok := res.(*Grad)
		if !ok || g.Step != i || g.W == nil {
			t.Fatalf("request %d: reply %#v", i, res)
		}
		if got := digest(g.W); got.Hash != want.Hash || !got.Shape.Equal(want.Shape) {
			t.Fatalf("request %d: tensor %+v, want %+v", i, got, want)
		}
		g.W.Free()
	}
	if n := actor.WaitingRequests(a); n != 0 {
		t.Fatalf("%d requests still waiting", n)
	}
}
