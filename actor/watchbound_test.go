package actor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/wire"
)

// joinRaw joins the cluster of cfg as node name with a peer that speaks
// the protocol itself (it holds the secret), and returns its connection to
// node to; the membership closes at the test's end.
func joinRaw(t *testing.T, cfg *config.Config, name, to string, inc uint64) (*cluster.Membership, *cluster.Peer) {
	t.Helper()
	caps := rdma.Caps{Node: name, Incarnation: inc, HostID: "elsewhere", Channels: []string{rdma.Staging}}
	advert, err := wire.EncodeMsgpack(&struct {
		C rdma.Caps `msgpack:"c"`
	}{caps})
	if err != nil {
		t.Fatal(err)
	}
	owner := &stallingOwner{}
	m, err := cluster.NewMembership(cfg, name, inc, owner, cluster.Options{Caps: advert})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.close(); _ = m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := m.WaitUp(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	return m, p
}

// TestWatchesBoundedAndDroppedWithThePeer: a peer with the secret sends
// 70,000 Watch frames with distinct watchers; the node keeps at most
// MaxWatchesPerPeer of them, refuses watches claimed for another node, and
// drops every watch of the peer when it leaves.
func TestWatchesBoundedAndDroppedWithThePeer(t *testing.T) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	recv, err := actor.NewNode(cfg, "node0", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Stop() })
	if _, err := recv.Root().SpawnNamed(echoProps("node0"), "echo"); err != nil {
		t.Fatal(err)
	}
	m, p := joinRaw(t, cfg, "node1", "node0", 91)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := recv.WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	const n = 70000
	for i := range n {
		if err := p.Send(ctx, wire.FrameSystem, 0, 0, &wire.System{Kind: wire.SystemWatch, Target: "echo", AboutNode: "node1", AboutID: fmt.Sprint("w", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// A watcher claimed for another node is refused.
	if err := p.Send(ctx, wire.FrameSystem, 0, 0, &wire.System{Kind: wire.SystemWatch, Target: "echo", AboutNode: "node9", AboutID: "x"}); err != nil {
		t.Fatal(err)
	}
	// Frames of one connection are handled in order: once a ping behind
	// them is answered, every watch was handled.
	if err := p.SendMessage(ctx, &wire.Message{Target: "tensorferry.ping", Type: "tensorferry.Ping", Ser: wire.SerMsgpack, Body: []byte{0x80},
		SenderNode: "node1", SenderID: "probe"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return recv.Stats().MessagesReceived >= 1 })
	waitUntil(t, func() bool { return actor.RemoteWatches(recv, "node1") == actor.MaxWatchesPerPeer })
	_ = m.Close()
	waitUntil(t, func() bool { _, up := recv.Topology().Peers["node1"]; return !up })
	if w := actor.RemoteWatches(recv, "node1"); w != 0 {
		t.Fatalf("%d watches of a node that went down are kept", w)
	}
}
