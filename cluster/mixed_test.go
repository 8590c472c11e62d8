package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/memnet"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
)

// mixedConfig is a gossip cluster of three gossiping nodes, node0..node2,
// and node3 marked mesh_only (as a Python node is): control connections
// on memnet (hosts named as the nodes), gossip on loopback UDP. The
// heartbeat interval is many idle timeouts long, so that a mesh link the
// idle logic looked at would be closed between two heartbeats.
func mixedConfig(t *testing.T) *config.Config {
	t.Helper()
	local, err := config.LocalConfig("mixed", 3) // free loopback ports for the gossip
	if err != nil {
		t.Fatal(err)
	}
	c := config.DefaultConfig()
	c.Cluster = "mixed"
	c.Secret = []byte("a secret of the mixed cluster, 32")
	c.Membership = config.MembershipGossip
	c.HeartbeatInterval = 300 * time.Millisecond
	c.FailureTimeout = 1500 * time.Millisecond
	c.DialTimeout = 250 * time.Millisecond
	c.ReconnectMin = time.Millisecond
	c.ReconnectMax = 20 * time.Millisecond
	c.Transport.IdleTimeout = 10 * time.Millisecond
	for i := range 4 {
		n := config.NodeConfig{Name: fmt.Sprintf("node%d", i), Address: fmt.Sprintf("node%d:7000", i)}
		if i < 3 {
			n.GossipAddress = local.Nodes[i].GossipAddress
		} else {
			n.MeshOnly = true
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// startMember starts one node of cfg on nw with the given incarnation.
func startMember(t *testing.T, nw *memnet.Network, cfg *config.Config, name string, inc uint64) memNode {
	t.Helper()
	r := newRecorder()
	m, err := cluster.NewMembership(cfg, name, inc, r, cluster.Options{Caps: []byte{0x80}, Network: nw.Host(name),
		SharedMemory: shm.Config{HostID: "memnet host " + name}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	return memNode{m, r}
}

// A mesh_only node in a gossip cluster: the gossiping nodes keep a control
// connection to it by the mesh's rules (up, messages both ways, never
// closed for idleness, down when silent for failure_timeout or stopped,
// up again when back), and it runs the mesh to every node; the gossiping
// nodes among themselves still connect on demand and close idle links.
func TestGossipMeshOnlyMember(t *testing.T) {
	nw := memnet.New(3)
	cfg := mixedConfig(t)
	nodes := startNodes(t, nw, cfg)
	gossipers, mo := nodes[:3], nodes[3]
	awaitUpEverywhere(t, nodes)
	for _, n := range nodes { // the ups, reported before WaitUp returned
		for len(n.r.events) > 0 {
			if e := <-n.r.events; !e.up {
				t.Fatalf("%s: %+v while coming up", n.m.Self().Name, e)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()

	if mo.m.OnDemand() {
		t.Fatal("the mesh_only node runs connections on demand")
	}
	for i, g := range gossipers {
		if !g.m.OnDemand() {
			t.Fatalf("%s: gossip membership without connections on demand", g.m.Self().Name)
		}
		p, ok := g.m.Peer("node3")
		if !ok || !p.Mesh() {
			t.Fatalf("%s: node3 up %v, kept by the mesh's rules %v", g.m.Self().Name, ok, ok && p.Mesh())
		}
		q, ok := mo.m.Peer(g.m.Self().Name)
		if !ok || !q.Mesh() {
			t.Fatalf("node3: %s up %v, kept by the mesh's rules %v", g.m.Self().Name, ok, ok && q.Mesh())
		}
		if o, ok := g.m.Peer(fmt.Sprintf("node%d", (i+1)%3)); !ok || o.Mesh() {
			t.Fatalf("%s: a gossiping peer up %v, not on demand", g.m.Self().Name, ok)
		}
		// Messages both ways.
		id := uint64(i + 1)
		if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: id}); err != nil {
			t.Fatal(err)
		}
		mo.r.awaitMessage(t, id)
		if err := q.SendMessage(ctx, &wire.Message{Target: "x", Request: 100 + id}); err != nil {
			t.Fatal(err)
		}
		g.r.awaitMessage(t, 100+id)
	}

	// The gossiping nodes' links among themselves close for idleness,
	// twice; node3's stay, between heartbeats many idle timeouts apart.
	idleClosed := func() bool {
		for _, g := range gossipers {
			if controlConns(g.m) != 1 {
				return false
			}
		}
		return true
	}
	poll.Until(t, "the gossiping nodes' links among themselves closed for idleness", idleClosed)
	p01, err := gossipers[0].m.Connect(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := p01.SendMessage(ctx, &wire.Message{Target: "x", Request: 50}); err != nil {
		t.Fatal(err)
	}
	gossipers[1].r.awaitMessage(t, 50)
	poll.Until(t, "node0's link to node1 closed for idleness again", idleClosed)
	if n := controlConns(mo.m); n != 3 {
		t.Fatalf("node3 holds %d control connections, want 3", n)
	}
	for _, g := range gossipers {
		select {
		case e := <-g.r.events:
			t.Fatalf("%s: %+v while only idle links closed", g.m.Self().Name, e)
		default:
		}
		if !g.m.Known("node3") {
			t.Fatalf("%s: node3 not known", g.m.Self().Name)
		}
	}

	// node3 goes silent (its links stall; the gossip does not see it and
	// has nothing to say): down everywhere by the heartbeats, within the
	// failure timeout; up again once its links carry bytes.
	stalled := time.Now()
	nw.Partition([]string{"node3"})
	detected := 0
	for _, g := range gossipers {
		e := g.r.await(t, false, "node3")
		if errors.Is(e.cause, cluster.ErrNodeDown) {
			detected++
		}
		if late := time.Since(stalled); late > cfg.FailureTimeout+cfg.HeartbeatInterval+time.Second {
			t.Errorf("%s: node3 declared down %v after the stall (failure timeout %v)", g.m.Self().Name, late, cfg.FailureTimeout)
		}
	}
	if detected == 0 {
		t.Fatal("no gossiping node's failure detector declared the silent node3 down")
	}
	nw.Heal()
	for _, g := range gossipers {
		g.r.await(t, true, "node3")
	}

	// node3 stops: down at once; it restarts: up with its new
	// incarnation, and it sees every node up.
	_ = mo.m.Close()
	for _, g := range gossipers {
		g.r.await(t, false, "node3")
	}
	back := startMember(t, nw, cfg, "node3", 10)
	defer back.m.Close()
	for _, g := range gossipers {
		if e := g.r.await(t, true, "node3"); e.inc != 10 {
			t.Fatalf("%s: node3 up as incarnation %d, want 10", g.m.Self().Name, e.inc)
		}
		if _, err := back.m.WaitUp(ctx, g.m.Self().Name); err != nil {
			t.Fatal(err)
		}
		p, err := g.m.Connect(ctx, "node3")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: 200}); err != nil {
			t.Fatal(err)
		}
		back.r.awaitMessage(t, 200)
	}
}
