package cluster_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
)

// writePKI writes a CA and a node certificate it signs into a directory
// of dir named for prefix, and returns the paths.
func writePKI(t *testing.T, dir, prefix string) (cert, key, ca string) {
	t.Helper()
	sub := filepath.Join(dir, prefix+"pki")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	tc, err := config.LocalTLS(sub, false)
	if err != nil {
		t.Fatal(err)
	}
	return tc.CertFile, tc.KeyFile, tc.CAFile
}

// tlsConfig is a two-node loopback config with TLS from dir's PKI.
func tlsConfig(t *testing.T, cert, key, ca string, data bool) *config.Config {
	t.Helper()
	cfg, err := config.LocalConfig("tls", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = &config.TLSConfig{CertFile: cert, KeyFile: key, CAFile: ca, Data: data}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMembershipOverTLS: nodes of a TLS cluster come up, exchange frames and
// open data connections over TLS; a plain-TCP peer and a peer whose
// certificate another CA signed never come up.
func TestMembershipOverTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, ca := writePKI(t, dir, "")
	cfg := tlsConfig(t, cert, key, ca, true)
	a, ea := start(t, cfg, "node0", 1)
	defer a.Close()
	b, eb := start(t, cfg, "node1", 1)
	defer b.Close()
	ea.expect(t, "up node1")
	eb.expect(t, "up node0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dc, err := a.DialData(ctx, "node1", "staging")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := dc.(*tls.Conn); !ok {
		t.Errorf("data connection %T, want TLS", dc)
	}
	eb.expect(t, "data node0 staging")
	dc.Close()

	// Plain TCP to a TLS node: the TLS handshake fails, nothing else.
	nc, err := net.Dial("tcp", cfg.Nodes[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write([]byte("\x00\x00\x00\x10hello, plain tcp"))
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(nc); err != nil && !strings.Contains(err.Error(), "reset") {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("a plain-TCP client was not disconnected")
		}
	}
	nc.Close()

	// A node whose certificate another CA signed is refused.
	ocert, okey, oca := writePKI(t, dir, "other-")
	other := tlsConfig(t, ocert, okey, oca, true)
	other.Nodes = cfg.Nodes // same addresses: it tries to join as node1
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	if _, err := a.DialData(ctx2, "node1", "staging"); err != nil {
		t.Fatalf("good dial after the plain client: %v", err)
	}
	om, err := cluster.NewMembership(other, "node1", 5, newEvents(), cluster.Options{Caps: []byte{0x80}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := om.DialData(ctx2, "node0", "staging"); err == nil || !strings.Contains(err.Error(), "tls") {
		t.Errorf("dial with a certificate from another CA: %v, want a TLS error", err)
	}
	om.Close()
	if p, ok := a.Peer("node1"); !ok || p.Incarnation != 1 {
		t.Errorf("the good peer was disturbed: %+v %v", p, ok)
	}
}
