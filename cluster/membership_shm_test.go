package cluster_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
)

// TestMembershipSharedMemory: two nodes of one host move their control
// connection to shared memory, frames cross it both ways, and a node that
// stops is seen down; nodes on other hosts (other host ids), or with the
// transport off on either end or in the config, stay on TCP.
func TestMembershipSharedMemory(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		c0, c1 shm.Config
		off    bool // the config's transport.shared_memory: false
		want   string
	}{
		{"one host", shm.Config{Dir: dir}, shm.Config{Dir: dir}, false, "shm"},
		{"two hosts", shm.Config{Dir: dir, HostID: "a"}, shm.Config{Dir: dir, HostID: "b"}, false, "tcp"},
		{"off on node0", shm.Config{Dir: dir, Disable: true}, shm.Config{Dir: dir}, false, "tcp"},
		{"off on node1", shm.Config{Dir: dir}, shm.Config{Dir: dir, Disable: true}, false, "tcp"},
		{"off in the config", shm.Config{Dir: dir}, shm.Config{Dir: dir}, true, "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.LocalConfig("m", 2)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Transport.SharedMemory = !tc.off
			startShm := func(name string, c shm.Config) (*cluster.Membership, *events) {
				ev := newEvents()
				m, err := cluster.NewMembership(cfg, name, 1, ev, cluster.Options{Caps: []byte{0x80}, SharedMemory: c})
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Start(); err != nil {
					t.Fatal(err)
				}
				return m, ev
			}
			a, ea := startShm("node0", tc.c0)
			defer a.Close()
			b, eb := startShm("node1", tc.c1)
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pa, err := a.WaitUp(ctx, "node1")
			if err != nil {
				t.Fatal(err)
			}
			pb, err := b.WaitUp(ctx, "node0")
			if err != nil {
				t.Fatal(err)
			}
			if pa.Transport() != tc.want || pb.Transport() != tc.want {
				t.Fatalf("transports %q and %q, want %q", pa.Transport(), pb.Transport(), tc.want)
			}
			for range 100 {
				if err := pa.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: 1}); err != nil {
					t.Fatal(err)
				}
				eb.expect(t, "frame RELEASE")
				if err := pb.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: 2}); err != nil {
					t.Fatal(err)
				}
				ea.expect(t, "frame RELEASE")
			}
			b.Close()
			ea.expect(t, "down node1")
		})
	}
}

// TestMembershipOneSetupPerPeer: a peer holding the secret that opens many
// control connections under one name at once gets one set up (each may
// hold a shared-memory region until its upgrade ends); the others are
// refused in the handshake while it is.
func TestMembershipOneSetupPerPeer(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Transport.SharedMemory = true
	cfg.DialTimeout = 10 * time.Second // the held set-up outlasts the test
	m, err := cluster.NewMembership(cfg, "node0", 1, newEvents(), cluster.Options{SharedMemory: shm.Config{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := wire.HandshakeConfig{Cluster: cfg.Cluster, Node: "node1", Incarnation: 7, Secret: cfg.Secret,
		Purpose: wire.PurposeControl, SharedMemory: true, Expect: "node0"}
	dial := func() (net.Conn, error) {
		nc, err := net.Dial("tcp", cfg.Nodes[0].Address)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.Handshake(ctx, nc, hc, true); err != nil {
			return nil, err
		}
		return nc, nil
	}
	// The first is admitted, and held in its upgrade: it never sends its
	// offer.
	held, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for i := range 20 {
		nc, err := dial()
		if err == nil {
			nc.Close()
			t.Fatalf("connection %d under the same name admitted while one is being set up", i+2)
		}
		if !strings.Contains(err.Error(), "setting up another connection") {
			t.Fatalf("connection %d: %v", i+2, err)
		}
	}
}
