package actor_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

// startGossipCluster starts n nodes on gossip membership whose control
// connections close after idle.
func startGossipCluster(t *testing.T, n int, idle time.Duration) []*actor.Node {
	t.Helper()
	cfg, err := config.LocalConfig("gossip", n)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipGossip
	cfg.Transport.IdleTimeout = idle
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return startNodes(t, cfg)
}

func controlConns(n *actor.Node) int {
	c := 0
	for k, v := range n.Stats().Conns {
		if k.Purpose == wire.PurposeControl {
			c += v
		}
	}
	return c
}

// With gossip membership, requests and tensor messages go through
// connections dialed on demand; an idle close neither fails anything nor
// reports a node down, and the next message dials again.
func TestGossipRequestsAcrossIdleCloses(t *testing.T) {
	nodes := startGossipCluster(t, 2, 30*time.Millisecond)
	a, b := nodes[0], nodes[1]
	var downs atomic.Int32
	sub := a.System().EventStream.Subscribe(func(ev any) {
		if _, ok := ev.(*cluster.NodeDown); ok {
			downs.Add(1)
		}
	})
	defer a.System().EventStream.Unsubscribe(sub)
	if _, err := b.Root().SpawnNamed(echoProps(b.Name()), "echo"); err != nil {
		t.Fatal(err)
	}
	pid := a.PID(b.Name(), "echo")
	for round := range 3 {
		poll.Until(t, "the idle connections closed", func() bool { return controlConns(a) == 0 && controlConns(b) == 0 })
		for i := range 20 {
			res, err := a.Root().RequestFuture(pid, &Ping{N: i}, 10*time.Second).Result()
			if err != nil {
				t.Fatalf("round %d, request %d: %v", round, i, err)
			}
			if p, ok := res.(*Pong); !ok || p.N != i {
				t.Fatalf("round %d, request %d: %#v", round, i, res)
			}
		}
	}
	// A tensor message fetched out of band, after an idle close.
	poll.Until(t, "the idle connections closed", func() bool { return controlConns(a) == 0 })
	got := make(chan uint64, 1)
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			got <- digest(g.W).Hash
			_ = g.W.Free()
		}
	}), "grads"); err != nil {
		t.Fatal(err)
	}
	x := randomTensor(t, rand.New(rand.NewPCG(1, 2)), tensor.Uint8, tensor.Shape{1 << 20})
	want := digest(x).Hash
	a.Root().Send(a.PID(b.Name(), "grads"), &Grad{Step: 1, W: x})
	select {
	case h := <-got:
		if h != want {
			t.Fatal("tensor bytes differ")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("tensor message not delivered")
	}
	if n := downs.Load(); n != 0 {
		t.Fatalf("%d NodeDown events on a healthy cluster", n)
	}
}

// A node that stops while its connection is idle: the watcher gets
// Terminated and NodeDown is published, from gossip.
func TestGossipNodeDownWhileIdle(t *testing.T) {
	nodes := startGossipCluster(t, 2, 30*time.Millisecond)
	a, b := nodes[0], nodes[1]
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(pa.Context) {}), "silent"); err != nil {
		t.Fatal(err)
	}
	remote := a.PID(b.Name(), "silent")
	rec := newRecorder()
	if _, err := a.Root().SpawnNamed(rec.props(remote), "watcher"); err != nil {
		t.Fatal(err)
	}
	<-rec.started
	downs := make(chan *cluster.NodeDown, 4)
	sub := a.System().EventStream.Subscribe(func(ev any) {
		if d, ok := ev.(*cluster.NodeDown); ok {
			downs <- d
		}
	})
	defer a.System().EventStream.Unsubscribe(sub)
	poll.Until(t, "the idle connections closed", func() bool { return controlConns(a) == 0 && controlConns(b) == 0 })
	_ = b.Stop()
	rec.wait(t, 1, 20*time.Second)
	rec.mu.Lock()
	why := rec.terms[0].Why
	rec.mu.Unlock()
	if why != pa.TerminatedReason_AddressTerminated {
		t.Fatalf("Why = %v, want AddressTerminated", why)
	}
	select {
	case d := <-downs:
		if d.Node != b.Name() || d.Incarnation != b.Incarnation() {
			t.Fatalf("NodeDown = %+v", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no NodeDown")
	}
	if _, err := a.Root().RequestFuture(remote, &Ping{}, 10*time.Second).Result(); !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("request to the node that left: %v", err)
	}
}

// A send to a mesh_only node that is down fails at once on a gossip node,
// as on the full mesh (the mesh's dial loop keeps trying), instead of
// waiting dial_timeout for a connection.
func TestGossipSendToMeshOnlyNodeDown(t *testing.T) {
	cfg, err := config.LocalConfig("gossip", 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipGossip
	cfg.Nodes[2].MeshOnly = true
	cfg.Nodes[2].GossipAddress = ""
	cfg.DialTimeout = 10 * time.Minute // longer than the test's deadline
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var nodes []*actor.Node
	for _, nc := range cfg.Nodes[:2] { // node2 never starts: the mesh dials it in vain
		n, err := actor.NewNode(cfg, nc.Name, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
		nodes = append(nodes, n)
	}
	a := nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.WaitPeer(ctx, nodes[1].Name()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Root().RequestFuture(a.PID(cfg.Nodes[2].Name, "echo"), &Ping{N: 1}, 5*time.Minute).Result()
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, pa.ErrDeadLetter) {
			t.Fatalf("request to a mesh_only node that is down: %v, want a dead letter", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a request to a mesh_only node that is down still waits after a minute")
	}
}
