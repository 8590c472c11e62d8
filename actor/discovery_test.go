package actor_test

import (
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/etcdtest"
)

// Nodes whose files list only themselves, found through etcd discovery,
// exchange requests both ways: a PID on a node announced by discovery
// resolves like one on a node of the config, with either membership.
func TestDiscoveredNodesRequest(t *testing.T) {
	for _, membership := range []string{config.MembershipMesh, config.MembershipGossip} {
		t.Run(membership, func(t *testing.T) {
			etcd := etcdtest.Start(t)
			base, err := config.LocalConfig("disc", 2)
			if err != nil {
				t.Fatal(err)
			}
			nodes := make([]*actor.Node, 2)
			for i := range nodes {
				c := *base
				c.Nodes = []config.NodeConfig{base.Nodes[i]}
				c.Membership = membership
				c.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{etcd.ClientURL}, LeaseTTL: 2 * time.Second}}
				if err := c.Validate(); err != nil {
					t.Fatal(err)
				}
				n, err := actor.NewNode(&c, c.Nodes[0].Name, testLogger())
				if err != nil {
					t.Fatal(err)
				}
				if err := n.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = n.Stop() })
				if _, err := n.Root().SpawnNamed(echoProps(n.Name()), "echo"); err != nil {
					t.Fatal(err)
				}
				nodes[i] = n
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i, a := range nodes {
				b := nodes[1-i]
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					t.Fatalf("%s waiting for %s: %v", a.Name(), b.Name(), err)
				}
				for k := range 3 {
					res, err := a.Request(ctx, a.PID(b.Name(), "echo"), &Ping{N: k})
					if p, ok := res.(*Pong); err != nil || !ok || p.N != k {
						t.Fatalf("%s Request to %s: %#v, %v", a.Name(), b.Name(), res, err)
					}
					res, err = a.Root().RequestFuture(a.PID(b.Name(), "echo"), &Ping{N: k}, 10*time.Second).Result()
					if p, ok := res.(*Pong); err != nil || !ok || p.N != k {
						t.Fatalf("%s RequestFuture to %s: %#v, %v", a.Name(), b.Name(), res, err)
					}
				}
			}
		})
	}
}
