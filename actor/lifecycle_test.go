package actor_test

import (
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
)

// TestRemoteLifecycleRefused: the node's own ping actor refuses Stop and
// Poison from another node; with WithoutRemoteLifecycle user actors do
// too; without it, they stop as in protoactor.
func TestRemoteLifecycleRefused(t *testing.T) {
	cfg, err := cluster.LocalConfig("test", 3)
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
