package actor_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRemoteLifecycleRefused: the node's own ping actor refuses Stop and
// Poison from another node; with WithoutRemoteLifecycle user actors do
// too; without it, they stop as in protoactor.
func TestRemoteLifecycleRefused(t *testing.T) {
	cfg, err := config.LocalConfig("test", 3)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*actor.Node
	for i, opts := range [][]actor.Option{{testLogger()}, {testLogger(), actor.WithoutRemoteLifecycle()}, {testLogger()}} {
		n, err := actor.NewNode(cfg, cfg.Nodes[i].Name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
		nodes = append(nodes, n)
	}
	a, guarded, open := nodes[0], nodes[1], nodes[2]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []*actor.Node{guarded, open} {
		if err := a.WaitPeer(ctx, n.Name()); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Root().SpawnNamed(echoProps(n.Name()), "echo"); err != nil {
			t.Fatal(err)
		}
	}
	// The ping actor of any node survives both.
	a.Root().Poison(a.PID(open.Name(), "tensorferry.ping"))
	a.Root().Stop(a.PID(open.Name(), "tensorferry.ping"))
	if err := a.Ping(ctx, open.Name(), []byte("x")); err != nil {
		t.Fatalf("ping after remote Poison and Stop: %v", err)
	}
	// A user actor on the guarded node too.
	a.Root().Poison(a.PID(guarded.Name(), "echo"))
	a.Root().Stop(a.PID(guarded.Name(), "echo"))
	if _, err := a.Request(ctx, a.PID(guarded.Name(), "echo"), &Ping{N: 1}); err != nil {
		t.Fatalf("guarded echo after remote Poison and Stop: %v", err)
	}
	// Protoactor's default elsewhere: a remote Stop stops it.
	watcher := newRecorder()
	if _, err := a.Root().SpawnNamed(watcher.props(a.PID(open.Name(), "echo")), "watcher"); err != nil {
		t.Fatal(err)
	}
	<-watcher.started
	// The watch is in place on open's node once a request behind it
	// (same connection, in order) is answered.
	if _, err := a.Request(ctx, a.PID(open.Name(), "echo"), &Ping{N: 2}); err != nil {
		t.Fatal(err)
	}
	a.Root().Stop(a.PID(open.Name(), "echo"))
	watcher.wait(t, 1, 10*time.Second)
	watcher.mu.Lock()
	defer watcher.mu.Unlock()
	if len(watcher.terms) != 1 || watcher.terms[0].Who.Id != "echo" {
		t.Fatalf("the watcher got %v, want Terminated of echo", watcher.terms)
	}
}

// TestLogsNameTheNodeOnce: every log line of a node carries its name
// once, whichever layer (actor, engine, membership, gossip, connection)
// logs it, with mesh and with gossip membership, and a normal stop logs no
// warning.
func TestLogsNameTheNodeOnce(t *testing.T) {
	for _, membership := range []string{config.MembershipMesh, config.MembershipGossip} {
		t.Run(membership, func(t *testing.T) { testLogsNameTheNodeOnce(t, membership) })
	}
}

func testLogsNameTheNodeOnce(t *testing.T, membership string) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = membership
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	var nodes []*actor.Node
	for _, nc := range cfg.Nodes {
		n, err := actor.NewNode(cfg, nc.Name, actor.WithLogger(zap.New(core)))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[0].WaitPeer(ctx, nodes[1].Name()); err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].Ping(ctx, nodes[1].Name(), []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		_ = n.Stop()
	}
	for _, e := range logs.All() {
		c := 0
		for _, f := range e.Context {
			if f.Key == "node" {
				c++
			}
		}
		if c != 1 {
			t.Errorf("%q names the node %d times: %v", e.Message, c, e.Context)
		}
		if e.Level >= zap.WarnLevel {
			t.Errorf("warning on a normal run and stop: %q %v", e.Message, e.Context)
		}
	}
}

// TestRefusedPoisonGivesBackItsTensors: a remote PoisonPill that is
// refused and comes with a tensor table (only a bad peer sends one) gives
// back the leases its table lends, as every refused message does.
func TestRefusedPoisonGivesBackItsTensors(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	x := randomTensor(t, rand.New(rand.NewPCG(3, 4)), tensor.Float32, tensor.Shape{1 << 19}) // fetched, so lent
	defer x.Free()
	m := &wire.Message{Target: "tensorferry.ping"} // the ping actor refuses remote lifecycle messages
	if err := actor.EncodeFor(a, b.Name(), m, &pa.PoisonPill{}, &Grad{W: x}); err != nil {
		t.Fatal(err)
	}
	if len(m.Tensors) == 0 {
		t.Fatal("no tensor table")
	}
	actor.ReceiveAlone(b, a.Name(), m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("the refused PoisonPill's tensors were not given back: %v", err)
	}
}
