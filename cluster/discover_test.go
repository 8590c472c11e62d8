package cluster_test

import (
	"context"
	"testing"
	"time"

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
// disappears from etcd (what a lease's expiry does) is a NodeDown.
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
	if _, err := a.Connect(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	etcd.Delete(cfgs[0].Discovery.Etcd.Prefix + "disc/nodes/node1")
	poll.Until(t, "node1 down at node0", func() bool { return oa.downsOf("node1") == 1 && !a.Known("node1") })
	if _, err := a.Connect(ctx, "node1"); err == nil {
		t.Fatal("Connect to a node gone from etcd succeeded")
	}
}
