package cluster_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// holder is a Handler that keeps the data connections it is handed.
type holder struct {
	*events
	conns chan net.Conn
}

func (h *holder) HandleDataConn(peer, channel string, conn net.Conn) {
	h.conns <- conn
	h.ch <- "data " + peer + " " + channel
}

// startWith starts node name of cfg with opts and a handler that holds
// data connections; it is closed at the end of the test.
func startWith(t *testing.T, cfg *config.Config, name string, opts cluster.Options) (*cluster.Membership, *holder) {
	t.Helper()
	h := &holder{events: newEvents(), conns: make(chan net.Conn, 256)}
	opts.Caps = []byte{0x80}
	m, err := cluster.NewMembership(cfg, name, 1, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		for {
			select {
			case c := <-h.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return m, h
}

// rawDial opens a connection to addr and runs the initiator's handshake as
// the named node and incarnation; the connection is closed with the test.
func rawDial(t *testing.T, cfg *config.Config, addr, node string, inc uint64, purpose string) (net.Conn, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = wire.Handshake(ctx, nc, wire.HandshakeConfig{Cluster: cfg.Cluster, Node: node, Incarnation: inc, Secret: cfg.Secret, Purpose: purpose}, true)
	return nc, err
}

// A node missing from the acceptor's config is told so in the handshake,
// instead of reading EOF after it.
func TestMembershipUnknownNodeToldWhy(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	m, _ := startWith(t, cfg, "node0", cluster.Options{Logger: zap.New(core)})
	for _, purpose := range []string{wire.PurposeControl, wire.PurposeData} {
		addr := cfg.Nodes[0].Address
		if purpose == wire.PurposeData {
			addr = cfg.Nodes[0].DataAddress
		}
		_, err := rawDial(t, cfg, addr, "stranger", 1, purpose)
		var ce *wire.ConnError
		if !errors.As(err, &ce) || ce.Code != wire.CodeNotFound || !strings.Contains(err.Error(), `node \"stranger\" is not in the config of cluster \"m\"`) {
			t.Errorf("%s: dialer's error %v, want a NotFound refusal naming the node", purpose, err)
		}
	}
	m.Close() // the acceptor logs after the dialer has its answer: wait for it
	if n := logs.FilterMessage("connection refused").FilterField(zap.String("reason", `wire: connection error NotFound: node "stranger" is not in the config of cluster "m" at node "node0"`)).Len(); n != 2 {
		t.Errorf("%d refusals logged with the reason, want 2: %v", n, logs.All())
	}
}

// A node that holds the secret but has no control connection (it never
// joined, or it left) is refused data connections, with the reason.
func TestMembershipDataConnNeedsControlConn(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	m, _ := startWith(t, cfg, "node0", cluster.Options{Logger: zap.New(core)})
	_, err = rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 1, wire.PurposeData)
	const why = "data connection refused: node1 (incarnation 1) has no control connection to node0"
	if err == nil || !strings.Contains(err.Error(), why) {
		t.Fatalf("dialer's error %v, want %q", err, why)
	}
	m.Close() // the acceptor logs after the dialer has its answer: wait for it
	if logs.FilterMessage("connection refused").FilterFieldKey("reason").Len() != 1 ||
		!strings.Contains(logs.FilterMessage("connection refused").All()[0].ContextMap()["reason"].(string), why) {
		t.Errorf("refusal not logged with its reason: %v", logs.All())
	}
}

// Another incarnation of a member (a restarted process whose control
// connection is not up yet) is not that member.
func TestMembershipDataConnOtherIncarnation(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	_, ea := startWith(t, cfg, "node0", cluster.Options{})
	startWith(t, cfg, "node1", cluster.Options{})
	ea.expect(t, "up node1")
	if _, err := rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 1, wire.PurposeData); err != nil {
		t.Fatalf("the member's incarnation: %v", err)
	}
	if _, err := rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 2, wire.PurposeData); err == nil || !strings.Contains(err.Error(), "no control connection") {
		t.Fatalf("another incarnation: %v", err)
	}
}

func TestMembershipDataConnLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport config.TransportConfig
		want      string
	}{
		{"per peer", config.TransportConfig{MaxDataConnsPerPeer: 2}, "data connection refused: node0 holds 2 data connections to node1, the most per peer"},
		{"per node", config.TransportConfig{MaxDataConnsPerPeer: 100, MaxDataConns: 2}, "data connection refused: node1 holds 2 data connections, the most per node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.LocalConfig("m", 2)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Transport.MaxDataConnsPerPeer = tc.transport.MaxDataConnsPerPeer
			if tc.transport.MaxDataConns > 0 {
				cfg.Transport.MaxDataConns = tc.transport.MaxDataConns
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			a, ea := startWith(t, cfg, "node0", cluster.Options{})
			_, eb := startWith(t, cfg, "node1", cluster.Options{})
			ea.expect(t, "up node1")
			eb.expect(t, "up node0")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for range 2 {
				dc, err := a.DialData(ctx, "node1", "staging")
				if err != nil {
					t.Fatal(err)
				}
				defer dc.Close()
				eb.expect(t, "data node0 staging")
			}
			_, err = a.DialData(ctx, "node1", "staging")
			var ce *wire.ConnError
			if !errors.As(err, &ce) || ce.Code != wire.CodeUnavailable || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("third data connection: %v, want %q", err, tc.want)
			}
			// Closing one (here, by its owner on node1) makes room again.
			(<-eb.conns).Close()
			dc, err := a.DialData(ctx, "node1", "staging")
			if err != nil {
				t.Fatalf("after a close: %v", err)
			}
			defer dc.Close()
			eb.expect(t, "data node0 staging")
		})
	}
}

// A data connection that never names its channel is closed after
// transport.data_idle_timeout, never reaches the handler, and frees its place.
func TestMembershipDataConnIdleClosed(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialTimeout = time.Minute // only data_idle_timeout may close it
	cfg.Transport.MaxDataConnsPerPeer, cfg.Transport.DataIdleTimeout = 1, 50*time.Millisecond
	_, ea := startWith(t, cfg, "node0", cluster.Options{})
	b, _ := startWith(t, cfg, "node1", cluster.Options{})
	ea.expect(t, "up node1")
	nc, err := rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 1, wire.PurposeData)
	if err != nil {
		t.Fatal(err)
	}
	// Sends nothing: node0 closes it (the read ends) well within a minute.
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data from an idle data connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("idle data connection not closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dc, err := b.DialData(ctx, "node0", "staging")
	if err != nil {
		t.Fatalf("the idle connection still holds its place: %v", err)
	}
	defer dc.Close()
	ea.expect(t, "data node1 staging")
}

// Channel names have the form of those in disable_channels, at both ends.
func TestMembershipDataConnChannelName(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	a, ea := startWith(t, cfg, "node0", cluster.Options{})
	startWith(t, cfg, "node1", cluster.Options{})
	ea.expect(t, "up node1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.DialData(ctx, "node1", "Staging"); err == nil || !strings.Contains(err.Error(), `bad channel name "Staging"`) {
		t.Errorf("DialData with a bad name: %v", err)
	}
	// A dialer that sends a bad name anyway is closed, unheard.
	nc, err := rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 1, wire.PurposeData)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(append([]byte{5}, "a/../"...)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a data connection with a bad channel name was kept")
	}
	// The next good one reaches the handler: the bad one never did.
	dc, err := rawDial(t, cfg, cfg.Nodes[0].DataAddress, "node1", 1, wire.PurposeData)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Write(append([]byte{7}, "staging"...)); err != nil {
		t.Fatal(err)
	}
	if got := <-ea.ch; got != "data node1 staging" {
		t.Fatalf("handler got %q first", got)
	}
}
