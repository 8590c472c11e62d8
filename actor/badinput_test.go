package actor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// recordingConn keeps what was written through it.
type recordingConn struct {
	net.Conn
	sent bytes.Buffer
}

func (c *recordingConn) Write(b []byte) (int, error) {
	c.sent.Write(b)
	return c.Conn.Write(b)
}

func header(length uint32, t wire.FrameType) []byte {
	h := make([]byte, wire.HeaderSize)
	binary.BigEndian.PutUint32(h[0:], length)
	h[4] = byte(t)
	return h
}

// TestBadInputAgainstRunningNode throws bad bytes at a running node's
// listeners: each bad connection is closed with a logged reason, nothing
// else is affected, memory stays bounded and good peers still connect.
func TestBadInputAgainstRunningNode(t *testing.T) {
	cfg, err := config.LocalConfig("bad", 3)
	if err != nil {
		t.Fatal(err)
	}
	// The third node never runs: the test borrows its identity. Its name
	// sorts before node0's so that node0, which keeps dialing it, never
	// refuses its inbound connections in favour of its own dial.
	cfg.Nodes[2].Name = "fake"
	core, logs := observer.New(zap.InfoLevel)
	a, err := actor.NewNode(cfg, "node0", actor.WithLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	b, err := actor.NewNode(cfg, "node1", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	if _, err := a.Root().SpawnNamed(echoProps("node0"), "echo"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitPeer(ctx, "node0"); err != nil {
		t.Fatal(err)
	}

	addr := cfg.Nodes[0].Address
	hs := func(secret []byte, node string) wire.HandshakeConfig {
		return wire.HandshakeConfig{Cluster: cfg.Cluster, Node: node, Incarnation: 1, Secret: secret, Purpose: wire.PurposeControl, Timeout: 2 * time.Second}
	}
	// A legitimate handshake as node2, recorded for the replay case.
	var recorded []byte
	{
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		rc := &recordingConn{Conn: nc}
		if _, err := wire.Handshake(ctx, rc, hs(cfg.Secret, "fake"), true); err != nil {
			t.Fatalf("good handshake: %v", err)
		}
		recorded = append([]byte(nil), rc.sent.Bytes()...)
		nc.Close()
	}
	authed := func(t *testing.T, after []byte) net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.Handshake(ctx, nc, hs(cfg.Secret, "fake"), true); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if _, err := nc.Write(after); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	raw := func(t *testing.T, b []byte) net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = nc.Write(b)
		return nc
	}
	rng := rand.New(rand.NewPCG(7, 8))
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	var memBefore runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&memBefore)

	cases := []struct {
		name string
		dial func(t *testing.T) net.Conn
		log  string // substring of the logged reason
	}{
		{"random bytes", func(t *testing.T) net.Conn { return raw(t, random) }, "handshake refused"},
		{"truncated frame", func(t *testing.T) net.Conn { return raw(t, append(header(100, wire.FrameHello), 1, 2, 3)) }, "handshake refused"},
		{"4 GiB length", func(t *testing.T) net.Conn { return raw(t, header(0xFFFFFFFF, wire.FrameHello)) }, "handshake refused"},
		{"unknown frame type", func(t *testing.T) net.Conn { return raw(t, header(0, 200)) }, "handshake refused"},
		{"wrong secret", func(t *testing.T) net.Conn {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := wire.Handshake(ctx, nc, hs(bytes.Repeat([]byte("x"), 32), "fake"), true); err == nil {
				t.Fatal("handshake with the wrong secret succeeded")
			}
			return nc
		}, "handshake refused"},
		{"replayed handshake", func(t *testing.T) net.Conn { return raw(t, recorded) }, "handshake refused"},
		{"after auth: 4 GiB length", func(t *testing.T) net.Conn { return authed(t, header(0xFFFFFFFF, wire.FrameMessage)) }, "closing connection"},
		{"after auth: truncated frame", func(t *testing.T) net.Conn {
			nc := authed(t, append(header(1000, wire.FrameMessage), 1, 2))
			nc.(*net.TCPConn).CloseWrite()
			return nc
		}, "closing connection"},
		{"after auth: unknown frame type", func(t *testing.T) net.Conn { return authed(t, header(0, 201)) }, "closing connection"},
		{"after auth: garbage msgpack", func(t *testing.T) net.Conn {
			return authed(t, append(header(5, wire.FrameMessage), 0xdf, 0xff, 0xff, 0xff, 0xff))
		}, "closing connection"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := logs.FilterMessageSnippet(tc.log).Len()
			nc := tc.dial(t)
			defer nc.Close()
			// The node closes the connection.
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, nc); err != nil && !isReset(err) {
				t.Fatalf("connection not closed by the node: %v", err)
			}
			// With a logged reason.
			deadline := time.Now().Add(5 * time.Second)
			for logs.FilterMessageSnippet(tc.log).Len() == before {
				if time.Now().After(deadline) {
					t.Fatalf("no %q logged; logs: %v", tc.log, messages(logs))
				}
				time.Sleep(10 * time.Millisecond)
			}
			// Nothing else is affected: the good peer still talks.
			res, err := b.Root().RequestFuture(b.PID("node0", "echo"), &Ping{N: 1}, 5*time.Second).Result()
			if err != nil || res.(*Pong).N != 1 {
				t.Fatalf("good peer after bad input: %v %v", res, err)
			}
		})
	}
	var memAfter runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&memAfter)
	if grew := int64(memAfter.HeapInuse) - int64(memBefore.HeapInuse); grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB", grew>>20)
	}
	// A good node can still connect: node1 restarts and comes back.
	_ = b.Stop()
	b2, err := actor.NewNode(cfg, "node1", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Start(); err != nil {
		t.Fatal(err)
	}
	defer b2.Stop()
	if err := b2.WaitPeer(ctx, "node0"); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Root().RequestFuture(b2.PID("node0", "echo"), &Ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
}

// isReset accepts a reset by the node, and our own close (wire.Handshake
// closes the connection when the node refuses it).
func isReset(err error) bool {
	return strings.Contains(err.Error(), "reset by peer") || errors.Is(err, net.ErrClosed)
}

func messages(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.All() {
		out = append(out, e.Message+" "+contextString(e.Context))
	}
	return out
}

func contextString(fs []zap.Field) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.Key + "=" + f.String + " ")
		if f.Interface != nil {
			if e, ok := f.Interface.(error); ok {
				b.WriteString(e.Error() + " ")
			}
		}
	}
	return b.String()
}
