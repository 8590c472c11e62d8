package cluster_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/etcdtest"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/wire"
)

// discoveryConfigs returns, for each of n nodes, a config that lists only
// that node and finds the others through etcd at url.
func discoveryConfigs(t *testing.T, n int, url string) []*config.Config {
	t.Helper()
	base, err := config.LocalConfig("disc", n)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*config.Config, n)
	for i := range out {
		c := *base
		c.Nodes = []config.NodeConfig{base.Nodes[i]}
		c.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{url}, LeaseTTL: 2 * time.Second}}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if c.MembershipMode() != config.MembershipGossip {
			t.Fatalf("membership %q with discovery", c.MembershipMode())
		}
		out[i] = &c
	}
	return out
}

// Nodes whose files list only themselves find each other through a real
// etcd, join and leave without any file edited, and a registration that
// disappears from etcd (what a lease's expiry does) is a NodeDown, until
// the node, still running, registers again.
func TestDiscoveryThroughEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	cfgs := discoveryConfigs(t, 3, etcd.ClientURL)
	a, oa := startGossip(t, cfgs[0], "node0", 1)
	defer a.Close()
	b, _ := startGossip(t, cfgs[1], "node1", 1)
	defer b.Close()
	waitMembers(t, a, b)
	// A third node joins: nobody's file names it.
	c, oc := startGossip(t, cfgs[2], "node2", 1)
	waitMembers(t, a, b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := a.Connect(ctx, "node2")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: 1}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "node2 got the frame", func() bool { return oc.count("node0") == 1 })
	// It leaves: node0 sees it down.
	c.Close()
	poll.Until(t, "node2 down at node0", func() bool { return oa.downsOf("node2") == 1 && !a.Known("node2") })
	// node1's registration disappears from etcd while the node runs: down.
	// node1 watches its own key and puts its registration back at once,
	// so node0 may know it again by the time it looks: the NodeDown is
	// what must have happened, then node1 is back.
	if _, err := a.Connect(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	etcd.Delete(cfgs[0].Discovery.Etcd.Prefix + "disc/nodes/node1")
	poll.Until(t, "node1 down at node0", func() bool { return oa.downsOf("node1") == 1 })
	poll.Until(t, "node1 registered again, known at node0", func() bool { return a.Known("node1") })
	if _, err := a.Connect(ctx, "node1"); err != nil {
		t.Fatalf("Connect to node1 registered again: %v", err)
	}
}

// meshDiscoveryConfigs is discoveryConfigs with the full mesh.
func meshDiscoveryConfigs(t *testing.T, n int, url string) []*config.Config {
	t.Helper()
	cfgs := discoveryConfigs(t, n, url)
	for _, c := range cfgs {
		c.Membership = config.MembershipMesh
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if c.MembershipMode() != config.MembershipMesh {
			t.Fatalf("membership %q", c.MembershipMode())
		}
	}
	return cfgs
}

func (o *orderLog) upsOf(peer string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ups[peer]
}

// revokeLease revokes the lease that holds key in etcd: etcd deletes the
// key as when the lease expires, without the leaving mark of a node that
// deregisters.
func revokeLease(t *testing.T, etcd *etcdtest.Server, key string) {
	t.Helper()
	var r struct {
		Kvs []struct {
			Lease string `json:"lease"`
		} `json:"kvs"`
	}
	etcd.Do("/v3/kv/range", map[string]any{"key": []byte(key)}, &r)
	if len(r.Kvs) != 1 || r.Kvs[0].Lease == "" {
		t.Fatalf("%s: %+v, want one key under a lease", key, r)
	}
	etcd.Do("/v3/lease/revoke", map[string]any{"ID": r.Kvs[0].Lease}, nil)
}

// With the full mesh (issue 33: a Python node cannot gossip), nodes whose
// files list only themselves find each other through a real etcd: each
// node announced is dialed and kept up with heartbeats. One that leaves
// and one whose lease ends are down at the others; the latter is up again
// once it registers again, and a node that restarts is up with its new
// incarnation.
func TestMeshDiscoveryThroughEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	cfgs := meshDiscoveryConfigs(t, 3, etcd.ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitUp := func(m *cluster.Membership, name string, inc uint64) *cluster.Peer {
		t.Helper()
		p, err := m.WaitUp(ctx, name)
		if err != nil || p.Incarnation != inc {
			t.Fatalf("%s WaitUp %s: %+v %v, want incarnation %d", m.Self().Name, name, p, err, inc)
		}
		return p
	}
	send := func(p *cluster.Peer, id uint64) {
		t.Helper()
		if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: id}); err != nil {
			t.Fatal(err)
		}
	}
	a, oa := startGossip(t, cfgs[0], "node0", 1) // startGossip starts any membership
	defer a.Close()
	b, ob := startGossip(t, cfgs[1], "node1", 1)
	send(waitUp(a, "node1", 1), 1)
	send(waitUp(b, "node0", 1), 2)
	poll.Until(t, "a frame each way", func() bool { return ob.count("node0") == 1 && oa.count("node1") == 1 })

	// A third node joins: nobody's file names it, every node dials it.
	c, oc := startGossip(t, cfgs[2], "node2", 1)
	send(waitUp(a, "node2", 1), 3)
	send(waitUp(c, "node1", 1), 4)
	waitUp(b, "node2", 1)
	waitUp(c, "node0", 1)
	poll.Until(t, "frames to and from node2", func() bool { return oc.count("node0") == 1 && ob.count("node2") == 1 })
	if a.OnDemand() || controlConns(a) != 2 {
		t.Errorf("node0: on demand %v, %d control connections, want the mesh's 2", a.OnDemand(), controlConns(a))
	}

	// It leaves: down at both, no longer a member nor dialed.
	c.Close()
	for _, m := range []struct {
		m *cluster.Membership
		o *orderLog
	}{{a, oa}, {b, ob}} {
		poll.Until(t, "node2 gone", func() bool {
			return m.o.downsOf("node2") == 1 && !m.m.Known("node2") && errors.Is(m.m.LastError("node2"), cluster.ErrUnknownNode)
		})
	}

	// node1's lease ends while it runs: down at node0, which refuses it
	// until it registers again under a new lease; then up again.
	revokeLease(t, etcd, cfgs[0].Discovery.Etcd.Prefix+"disc/nodes/node1")
	poll.Until(t, "node1 down at node0", func() bool { return oa.downsOf("node1") == 1 })
	poll.Until(t, "node1 up again at node0", func() bool { return oa.upsOf("node1") == 2 })
	send(waitUp(a, "node1", 1), 5)
	poll.Until(t, "a frame after the new lease", func() bool { return ob.count("node0") == 2 })

	// node1 restarts on other ports: down, then up with its new
	// incarnation, at its new addresses.
	b.Close()
	poll.Until(t, "node1 down at node0", func() bool { return oa.downsOf("node1") == 2 })
	moved := *cfgs[1]
	moved.Nodes = []config.NodeConfig{{Name: "node1", Address: etcdtest.FreeAddr(t), DataAddress: etcdtest.FreeAddr(t), GossipAddress: etcdtest.FreeAddr(t)}}
	if err := moved.Validate(); err != nil {
		t.Fatal(err)
	}
	b2, ob2 := startGossip(t, &moved, "node1", 2)
	defer b2.Close()
	send(waitUp(a, "node1", 2), 6)
	send(waitUp(b2, "node0", 1), 7)
	poll.Until(t, "frames with the new incarnation", func() bool { return ob2.count("node0") == 1 && oa.count("node1") == 2 })
	if ms := a.Members(); len(ms) != 1 || ms[0].Address != moved.Nodes[0].Address {
		t.Errorf("node0's members %+v, want node1 at %s", ms, moved.Nodes[0].Address)
	}
	dc, err := a.DialData(ctx, "node1", "staging") // to the new data address
	if err != nil {
		t.Fatalf("data connection to the moved node: %v", err)
	}
	dc.Close()
}

// With the full mesh and discovery, a holder of the secret connects only
// under a name the config or the discovery source names, and only while
// it does.
func TestMeshDiscoveryAdmitsOnlyAnnounced(t *testing.T) {
	etcd := etcdtest.Start(t)
	cfgs := meshDiscoveryConfigs(t, 1, etcd.ClientURL)
	a, _ := startGossip(t, cfgs[0], "node0", 1)
	defer a.Close()
	addr := cfgs[0].Nodes[0].Address
	// "mallory" sorts before node0: node0's own dials to it never win a
	// tie-break over its connection.
	var ce *wire.ConnError
	if _, err := rawDial(t, cfgs[0], addr, "mallory", 1, wire.PurposeControl); !errors.As(err, &ce) || ce.Code != wire.CodeNotFound {
		t.Fatalf("unannounced name: %v, want a NotFound refusal", err)
	}
	key := cfgs[0].Discovery.Etcd.Prefix + "disc/nodes/mallory"
	etcd.Put(key, []byte(`{"name":"mallory","address":"127.0.0.1:1","data_address":"127.0.0.1:2","devices":["cpu"]}`))
	poll.Until(t, "mallory announced", func() bool { return a.Known("mallory") })
	nc, err := rawDial(t, cfgs[0], addr, "mallory", 1, wire.PurposeControl)
	if err != nil {
		t.Fatalf("announced name refused: %v", err)
	}
	// Its registration goes: its connection is closed, and it is refused.
	etcd.Delete(key)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := nc.Read(make([]byte, 4096)); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("connection still open after its registration went")
			}
			break
		}
	}
	poll.Until(t, "mallory forgotten", func() bool { return !a.Known("mallory") && errors.Is(a.LastError("mallory"), cluster.ErrUnknownNode) })
	if _, err := rawDial(t, cfgs[0], addr, "mallory", 2, wire.PurposeControl); !errors.As(err, &ce) || ce.Code != wire.CodeNotFound {
		t.Fatalf("name gone from etcd: %v, want a NotFound refusal", err)
	}
}

// A mesh node whose discovery cannot start (etcd does not answer) fails
// Start, and leaves nothing behind: a peer of its config that came up
// meanwhile sees it go (goleak checks its goroutines).
func TestMeshDiscoveryStartFails(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	b, eb := start(t, cfg, "node1", 1)
	defer b.Close()
	// "etcd" takes the first request and answers nothing until node1 has
	// seen node0 up, then hangs up and stops listening.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upAtB := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		<-upAtB
		c.Close()
	}()
	bad := *cfg
	bad.Membership = config.MembershipMesh
	bad.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{"http://" + ln.Addr().String()}, DialTimeout: 10 * time.Second}}
	if err := bad.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := cluster.NewMembership(&bad, "node0", 1, newEvents(), cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- a.Start() }()
	eb.expect(t, "up node0")
	close(upAtB)
	<-done
	if err := <-started; err == nil {
		a.Close()
		t.Fatal("Start succeeded without etcd")
	}
	eb.expect(t, "down node0")
	if len(a.Peers()) != 0 {
		t.Errorf("peers up after a failed Start: %v", a.Peers())
	}
	a.Close()
}

// With gossip and discovery, a mesh_only node (a PyTorch node, which
// cannot gossip) that only etcd names: the gossiping nodes keep a mesh
// connection to it (dialed, heartbeats), it runs the mesh to every node
// it finds, frames go both ways, and its lease's end is a NodeDown at the
// gossiping nodes until it registers again.
func TestGossipDiscoveryMeshOnly(t *testing.T) {
	etcd := etcdtest.Start(t)
	cfgs := discoveryConfigs(t, 3, etcd.ClientURL)
	py := cfgs[2]
	py.Nodes[0].MeshOnly, py.Nodes[0].GossipAddress = true, ""
	if err := py.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, oa := startGossip(t, cfgs[0], "node0", 1)
	defer a.Close()
	b, ob := startGossip(t, cfgs[1], "node1", 1)
	defer b.Close()
	waitMembers(t, a, b)
	c, oc := startGossip(t, py, "node2", 1)
	defer c.Close()
	for _, m := range []*cluster.Membership{a, b} {
		p, err := m.WaitUp(ctx, "node2")
		if err != nil {
			t.Fatalf("%s WaitUp node2: %v", m.Self().Name, err)
		}
		if !p.Mesh() {
			t.Errorf("%s: node2 not kept by the mesh's rules", m.Self().Name)
		}
		if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range []string{"node0", "node1"} {
		p, err := c.WaitUp(ctx, name)
		if err != nil {
			t.Fatalf("node2 WaitUp %s: %v", name, err)
		}
		if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: uint64(10 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "frames both ways", func() bool {
		return oc.count("node0") == 1 && oc.count("node1") == 1 && oa.count("node2") == 1 && ob.count("node2") == 1
	})
	if c.OnDemand() || !a.OnDemand() {
		t.Errorf("on demand: node2 %v, node0 %v; want the mesh at node2 only", c.OnDemand(), a.OnDemand())
	}
	// Its lease ends while it runs: down at both gossiping nodes, then up
	// again once it registered again.
	revokeLease(t, etcd, py.Discovery.Etcd.Prefix+"disc/nodes/node2")
	for _, o := range []*orderLog{oa, ob} {
		poll.Until(t, "node2 down", func() bool { return o.downsOf("node2") == 1 })
		poll.Until(t, "node2 up again", func() bool { return o.upsOf("node2") == 2 })
	}
	// It leaves: down, and no longer known.
	c.Close()
	poll.Until(t, "node2 gone at node0", func() bool { return oa.downsOf("node2") == 2 && !a.Known("node2") })
}
