package cluster_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// events records what a Membership reports.
type events struct {
	mu     sync.Mutex
	ups    []string
	downs  []string
	frames int
	ch     chan string
}

func newEvents() *events { return &events{ch: make(chan string, 64)} }

func (e *events) PeerUp(p *cluster.Peer) {
	e.mu.Lock()
	e.ups = append(e.ups, p.Name)
	e.mu.Unlock()
	e.ch <- "up " + p.Name
}

func (e *events) PeerDown(p *cluster.Peer, cause error) {
	e.mu.Lock()
	e.downs = append(e.downs, p.Name)
	e.mu.Unlock()
	e.ch <- "down " + p.Name
}

func (e *events) HandleFrame(p *cluster.Peer, f wire.Frame) {
	e.mu.Lock()
	e.frames++
	e.mu.Unlock()
	e.ch <- "frame " + f.Header().Type.String()
}

func (e *events) HandleDataConn(peer, channel string, conn net.Conn) {
	e.ch <- "data " + peer + " " + channel
	conn.Close()
}

func (e *events) expect(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-e.ch:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %q", want)
		}
	}
}

func start(t *testing.T, cfg *config.Config, name string, inc uint64) (*cluster.Membership, *events) {
	t.Helper()
	ev := newEvents()
	m, err := cluster.NewMembership(cfg, name, inc, ev, cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	return m, ev
}

func TestMembershipUpDownRestart(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	a, ea := start(t, cfg, "node0", 1)
	defer a.Close()
	b, eb := start(t, cfg, "node1", 1)
	ea.expect(t, "up node1")
	eb.expect(t, "up node0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := a.WaitUp(ctx, "node1")
	if err != nil || p.Incarnation != 1 || len(p.Caps) != 1 {
		t.Fatalf("WaitUp: %+v %v", p, err)
	}
	// A frame that is not membership's own reaches the handler.
	if err := p.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: 1}); err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "frame RELEASE")
	// A data connection reaches the handler with its channel name.
	dc, err := a.DialData(ctx, "node1", "staging")
	if err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "data node0 staging")
	dc.Close()

	// node1 stops: node0 sees it down, then up again with a new incarnation.
	b.Close()
	ea.expect(t, "down node1")
	if _, ok := a.Peer("node1"); ok {
		t.Fatal("node1 still up")
	}
	b2, _ := start(t, cfg, "node1", 2)
	defer b2.Close()
	ea.expect(t, "up node1")
	p, err = a.WaitUp(ctx, "node1")
	if err != nil || p.Incarnation != 2 {
		t.Fatalf("after restart: %+v %v", p, err)
	}
}

func TestMembershipSilentPeerDeclaredDown(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	a, ea := start(t, cfg, "node0", 1)
	defer a.Close()
	// node1 authenticates but never sends anything: no caps, no pongs.
	// node0 refuses it (Unavailable) while its own dial to node1 is in
	// progress (the tie-break of two ends dialing): node1 dials again, as a
	// node does.
	var nc net.Conn
	poll.Until(t, "node0 admits the silent node1", func() bool {
		c, err := net.Dial("tcp", cfg.Nodes[0].Address)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = wire.Handshake(ctx, c, wire.HandshakeConfig{Cluster: cfg.Cluster, Node: "node1", Incarnation: 9, Secret: cfg.Secret}, true)
		var ce *wire.ConnError
		switch {
		case err == nil:
			nc = c
			return true
		case errors.As(err, &ce) && ce.Code == wire.CodeUnavailable:
			c.Close()
			return false
		}
		t.Fatal(err)
		return false
	})
	defer nc.Close()
	// The connection is closed after the failure timeout; no NodeUp ever.
	_ = nc.SetReadDeadline(time.Now().Add(cfg.FailureTimeout + 3*time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := nc.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("silent peer not disconnected within the failure timeout")
			}
			break
		}
	}
	select {
	case ev := <-ea.ch:
		if strings.HasPrefix(ev, "up") {
			t.Fatalf("silent peer reported %s", ev)
		}
	default:
	}
}

func TestMembershipUnknownAndUnreachable(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.NewMembership(cfg, "nobody", 1, newEvents(), cluster.Options{}); !errors.Is(err, cluster.ErrUnknownNode) {
		t.Fatalf("unknown self: %v", err)
	}
	a, _ := start(t, cfg, "node0", 1)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := a.WaitUp(ctx, "node1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitUp on a dead node: %v", err)
	}
	if err := a.LastError("node1"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("LastError = %v", err)
	}
	if _, err := a.WaitUp(ctx, "ghost"); !errors.Is(err, cluster.ErrUnknownNode) {
		t.Fatalf("WaitUp on an unknown node: %v", err)
	}
}

// TestImpostorCannotTakeALiveNodesName: a holder of the secret that claims
// a live node's name with a higher incarnation is refused while the live
// node's connection answers (heartbeats); the live node keeps its place,
// and is not held to the impostor's incarnation afterwards.
func TestImpostorCannotTakeALiveNodesName(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	start := func(name string) (*cluster.Membership, *events) {
		ev := newEvents()
		m, err := cluster.NewMembership(cfg, name, 1, ev, cluster.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m, ev
	}
	a, ea := start("node0")
	_, _ = start("node1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.WaitUp(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	ea.expect(t, "up node1")
	hc := wire.HandshakeConfig{Cluster: cfg.Cluster, Node: "node1", Incarnation: 1 << 62, Secret: cfg.Secret,
		Purpose: wire.PurposeControl, Expect: "node0"}
	for i := 0; i < 3; {
		nc, err := net.Dial("tcp", cfg.Nodes[0].Address)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.Handshake(ctx, nc, hc, true); err != nil {
			nc.Close()
			if strings.Contains(err.Error(), "setting up another connection") {
				continue // the last refused one is still being let go
			}
			t.Fatal(err)
		}
		i++
		// Refused after the handshake: node0 closes the connection.
		nc.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound, not the wait
		_, err = io.Copy(io.Discard, nc)
		nc.Close()
		if err != nil {
			t.Fatalf("the impostor's connection was not closed: %v", err)
		}
	}
	p, err := a.WaitUp(ctx, "node1")
	if err != nil || p.Incarnation != 1 {
		t.Fatalf("node1 after the impostor: %+v, %v; want the live incarnation 1", p, err)
	}
	ea.mu.Lock()
	downs := len(ea.downs)
	ea.mu.Unlock()
	if downs != 0 {
		t.Fatalf("node1 went down %d times for the impostor", downs)
	}
}
