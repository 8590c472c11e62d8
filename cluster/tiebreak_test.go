package cluster_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// counter counts the Message frames a membership's handler gets.
type counter struct {
	mu  sync.Mutex
	n   int
	got chan struct{}
}

func (c *counter) PeerUp(*cluster.Peer)          {}
func (c *counter) PeerDown(*cluster.Peer, error) {}
func (c *counter) HandleFrame(_ *cluster.Peer, f wire.Frame) {
	switch f.(type) {
	case *wire.MessageFrame, *wire.MessagesFrame: // one message may come in a batch frame
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
		select {
		case c.got <- struct{}{}:
		default:
		}
	}
}
func (c *counter) HandleDataConn(_, _ string, conn net.Conn) { conn.Close() }

// TestSimultaneousDialsLoseNoMessage: two nodes start at once and dial each
// other; whichever connection the tie-break keeps, a message each sends as
// soon as WaitUp returns arrives. Repeated, so that both orders of the two
// dials and of the two accepts happen.
func TestSimultaneousDialsLoseNoMessage(t *testing.T) {
	for i := range 60 {
		core, logs := observer.New(zap.DebugLevel)
		cfg, err := config.LocalConfig("test", 2)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ReconnectMin = time.Millisecond // redial at once after a refusal
		var ms [2]*cluster.Membership
		var cs [2]*counter
		for j := range 2 {
			cs[j] = &counter{got: make(chan struct{}, 1)}
			if ms[j], err = cluster.NewMembership(cfg, cfg.Nodes[j].Name, uint64(100+j), cs[j], cluster.Options{Caps: []byte{0x80}, Logger: zap.New(core)}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for j := range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); _ = ms[j].Start() }()
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for j := range 2 {
			p, err := ms[j].WaitUp(ctx, cfg.Nodes[1-j].Name)
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: uint64(j + 1)}); err != nil {
				t.Fatalf("round %d: send on a connection WaitUp returned: %v", i, err)
			}
		}
		for j := range 2 {
			select {
			case <-cs[j].got:
			case <-ctx.Done():
				for _, e := range logs.All() {
					t.Log(e.Time.Format("05.000000"), e.Message, e.ContextMap())
				}
				t.Fatalf("round %d: the message to %s was lost in the tie-break", i, cfg.Nodes[j].Name)
			}
		}
		cancel()
		for j := range 2 {
			_ = ms[j].Close()
		}
	}
}

// TestOlderIncarnationDoesNotDisplaceTheLiveNode: a peer holding the secret
// that claims a running node's name with a lower incarnation is refused
// (logged as an error naming both addresses); the live node stays up.
func TestOlderIncarnationDoesNotDisplaceTheLiveNode(t *testing.T) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ev0 := newEvents()
	m0, err := cluster.NewMembership(cfg, "node0", 100, ev0, cluster.Options{Caps: []byte{0x80}, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	live, err := cluster.NewMembership(cfg, "node1", 200, newEvents(), cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*cluster.Membership{m0, live} {
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
	}
	ev0.expect(t, "up node1")
	// The impostor: node1's name, incarnation 150, its own address.
	fake := *cfg
	fake.Nodes = append([]config.NodeConfig(nil), cfg.Nodes...)
	for i := range fake.Nodes {
		if fake.Nodes[i].Name == "node1" {
			fake.Nodes[i].Address, fake.Nodes[i].DataAddress = freeAddr(t), freeAddr(t)
		}
	}
	imp, err := cluster.NewMembership(&fake, "node1", 150, newEvents(), cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	if err := imp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = imp.Close() })
	// node0 refuses it, with an error naming both addresses.
	timeout := time.After(10 * time.Second)
	for logs.FilterMessageSnippet("older incarnation refused").Len() == 0 {
		select {
		case <-timeout:
			t.Fatal("the older incarnation was not refused")
		case e := <-ev0.ch:
			if e == "down node1" {
				t.Fatal("the live node1 was displaced by an older incarnation")
			}
		case <-time.After(time.Millisecond):
		}
	}
	f := logs.FilterMessageSnippet("older incarnation refused").All()[0].ContextMap()
	if f["address"] == "" || f["live_address"] == "" || f["incarnation"] != uint64(150) || f["live_incarnation"] != uint64(200) {
		t.Fatalf("log fields %v", f)
	}
	// The live node1 is node0's peer: at once, or once a duplicate of its
	// connection from the start-up (both ends dial) has been sorted out;
	// never the impostor.
	poll.Until(t, "the live node1 up at node0", func() bool {
		p, ok := m0.Peer("node1")
		if ok && p.Incarnation != 200 {
			t.Fatalf("node1 at node0 is incarnation %d, want the live 200", p.Incarnation)
		}
		return ok
	})
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
