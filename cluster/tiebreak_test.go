package cluster_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
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
		cfg, err := cluster.LocalConfig("test", 2)
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
