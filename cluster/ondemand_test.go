package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/wire"
)

// gossipConfig is a local cluster of n nodes on gossip membership, whose
// control connections close after idle.
func gossipConfig(t *testing.T, n int, idle time.Duration) *config.Config {
	t.Helper()
	cfg, err := config.LocalConfig("g", n)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipGossip
	cfg.Transport.IdleTimeout = idle
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// orderLog records, per sending peer, the export ids of the Release frames
// it delivered, and the peers that went up and down.
type orderLog struct {
	mu    sync.Mutex
	got   map[string][]uint64
	ups   map[string]int
	downs map[string]int
	ch    chan string
}

func newOrderLog() *orderLog {
	return &orderLog{got: map[string][]uint64{}, ups: map[string]int{}, downs: map[string]int{}, ch: make(chan string, 1024)}
}

func (o *orderLog) PeerUp(p *cluster.Peer) {
	o.mu.Lock()
	o.ups[p.Name]++
	o.mu.Unlock()
	o.note("up " + p.Name)
}

func (o *orderLog) PeerDown(p *cluster.Peer, cause error) {
	o.mu.Lock()
	o.downs[p.Name]++
	o.mu.Unlock()
	o.note("down " + p.Name)
}

func (o *orderLog) HandleFrame(p *cluster.Peer, f wire.Frame) {
	if r, ok := f.(*wire.ReleaseFrame); ok {
		o.mu.Lock()
		o.got[p.Name] = append(o.got[p.Name], r.Release.ExportID)
		o.mu.Unlock()
	}
}

func (o *orderLog) HandleDataConn(_, _ string, c net.Conn) { c.Close() }

func (o *orderLog) note(s string) {
	select {
	case o.ch <- s:
	default:
	}
}

func (o *orderLog) count(peer string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.got[peer])
}

func (o *orderLog) downsOf(peer string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.downs[peer]
}

func startGossip(t *testing.T, cfg *config.Config, name string, inc uint64) (*cluster.Membership, *orderLog) {
	t.Helper()
	o := newOrderLog()
	m, err := cluster.NewMembership(cfg, name, inc, o, cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	return m, o
}

func controlConns(m *cluster.Membership) int {
	n := 0
	for k, v := range m.Conns() {
		if k.Purpose == wire.PurposeControl {
			n += v
		}
	}
	return n
}

// waitMembers waits until every membership knows every other node.
func waitMembers(t *testing.T, ms ...*cluster.Membership) {
	t.Helper()
	poll.Until(t, "every node a member everywhere", func() bool {
		for _, m := range ms {
			if len(m.Members()) != len(ms)-1 {
				return false
			}
		}
		return true
	})
}

// Members find each other through gossip without a control connection;
// the first send dials, an idle connection closes without taking the peer
// down, and the next send dials again.
func TestGossipConnectsOnDemandAndClosesIdle(t *testing.T) {
	cfg := gossipConfig(t, 3, 50*time.Millisecond)
	a, oa := startGossip(t, cfg, "node0", 1)
	defer a.Close()
	b, ob := startGossip(t, cfg, "node1", 1)
	defer b.Close()
	c, _ := startGossip(t, cfg, "node2", 1)
	defer c.Close()
	waitMembers(t, a, b, c)
	for _, m := range []*cluster.Membership{a, b, c} {
		if n := controlConns(m); n != 0 {
			t.Fatalf("%v holds %d control connections before any message", m, n)
		}
		if !m.OnDemand() {
			t.Fatal("gossip membership without connections on demand")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := a.Connect(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: i}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "10 releases at node1", func() bool { return ob.count("node0") == 10 })
	// Idle: both ends close, nobody goes down.
	poll.Until(t, "the idle connection closed at both ends", func() bool {
		return controlConns(a) == 0 && controlConns(b) == 0
	})
	if oa.downsOf("node1") != 0 || ob.downsOf("node0") != 0 {
		t.Fatal("an idle close took a peer down")
	}
	if q, ok := a.Peer("node1"); !ok || q != p {
		t.Fatal("the peer did not outlive its idle connection")
	}
	// The same Peer dials again.
	for i := uint64(11); i <= 20; i++ {
		if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: i}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "20 releases at node1", func() bool { return ob.count("node0") == 20 })
	checkOrder(t, ob, "node0", 20)
	// node2 was never written to: still no connection to it.
	if n := controlConns(c); n != 0 {
		t.Fatalf("node2 holds %d control connections", n)
	}
}

func checkOrder(t *testing.T, o *orderLog, peer string, n int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.got[peer]
	if len(got) != n {
		t.Fatalf("%d frames from %s, want %d", len(got), peer, n)
	}
	for i, id := range got {
		if id != uint64(i+1) {
			t.Fatalf("frame %d from %s is %d: order broken or frame lost (%v)", i, peer, id, got)
		}
	}
}

// Frames sent both ways while links keep closing for idleness arrive,
// each way in order, none lost, and nobody goes down.
func TestGossipIdleClosesLoseNothing(t *testing.T) {
	cfg := gossipConfig(t, 2, 10*time.Millisecond)
	a, oa := startGossip(t, cfg, "node0", 1)
	defer a.Close()
	b, ob := startGossip(t, cfg, "node1", 1)
	defer b.Close()
	waitMembers(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const rounds, burst = 40, 25
	send := func(m *cluster.Membership, to string) error {
		p, err := m.Connect(ctx, to)
		if err != nil {
			return err
		}
		id := uint64(0)
		for r := 0; r < rounds; r++ {
			for i := 0; i < burst; i++ {
				id++
				if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: id}); err != nil {
					return fmt.Errorf("frame %d: %w", id, err)
				}
			}
			// Pauses around the idle timeout, so that closes race sends.
			time.Sleep(time.Duration(rand.N(20)) * time.Millisecond)
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- send(a, "node1") }()
	go func() { errs <- send(b, "node0") }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "every frame delivered", func() bool {
		return ob.count("node0") == rounds*burst && oa.count("node1") == rounds*burst
	})
	checkOrder(t, ob, "node0", rounds*burst)
	checkOrder(t, oa, "node1", rounds*burst)
	if oa.downsOf("node1") != 0 || ob.downsOf("node0") != 0 {
		t.Fatal("an idle close took a peer down")
	}
}

// A member that leaves takes its Peer down; one that restarts comes back
// as a new incarnation, reached by the next Connect.
func TestGossipLeaveAndRestart(t *testing.T) {
	cfg := gossipConfig(t, 2, time.Minute)
	a, oa := startGossip(t, cfg, "node0", 1)
	defer a.Close()
	b, _ := startGossip(t, cfg, "node1", 1)
	waitMembers(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.Connect(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	b.Close()
	poll.Until(t, "node1 down at node0", func() bool { return oa.downsOf("node1") == 1 })
	poll.Until(t, "node1 no longer a member", func() bool { return !a.Known("node1") })
	if _, err := a.Connect(ctx, "node1"); err == nil {
		t.Fatal("Connect to a node that left succeeded")
	}
	b2, _ := startGossip(t, cfg, "node1", 2)
	defer b2.Close()
	p, err := a.WaitUp(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Incarnation != 2 {
		t.Fatalf("incarnation %d after the restart, want 2", p.Incarnation)
	}
}

// With a static node list, a holder of the secret that gossips under a
// name the config does not list is not made a member.
func TestGossipAdmitsOnlyConfigNames(t *testing.T) {
	cfg := gossipConfig(t, 3, time.Minute)
	// The intruder's config: the same cluster and secret, its own name
	// on the third node's addresses.
	other := *cfg
	other.Nodes = append([]config.NodeConfig(nil), cfg.Nodes...)
	other.Nodes[2].Name = "intruder"
	cfg.Nodes = cfg.Nodes[:2]
	a, _ := startGossip(t, cfg, "node0", 1)
	defer a.Close()
	b, _ := startGossip(t, cfg, "node1", 1)
	defer b.Close()
	in, _ := startGossip(t, &other, "intruder", 1)
	defer in.Close()
	waitMembers(t, a, b)
	poll.Until(t, "the intruder sees node0 and node1", func() bool { return len(in.Members()) == 2 })
	for _, m := range []*cluster.Membership{a, b} {
		if m.Known("intruder") {
			t.Errorf("a node not in the config was admitted through gossip")
		}
		if n := len(m.Members()); n != 1 {
			t.Errorf("%d members, want 1: %v", n, m.Members())
		}
	}
}
