package cluster_test

import (
	"context"
	"net"
	"path/filepath"
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

// TestMembershipShmUpgradesLimited: a peer holding the secret that opens
// many control connections under one name and starts a shared-memory
// upgrade on each, never confirming, makes the node hold at most one
// region (its files and FIFOs) at a time, not one per connection: the
// others are declined and stay on their sockets.
func TestMembershipShmUpgradesLimited(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialTimeout = 10 * time.Second // the upgrades stay in flight for the test
	sc := shm.Config{Dir: dir, HostID: "h"}
	// node1 accepts; the test plays node0 (whose dials node1 never
	// refuses as a tie-break: node0 < node1).
	m, err := cluster.NewMembership(cfg, "node1", 1, newEvents(), cluster.Options{Caps: []byte{0x80}, SharedMemory: sc})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	offer := shmOffer(t, sc)
	const n = 400
	for i := range n {
		nc, err := net.Dial("tcp", cfg.Nodes[1].Address)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		peer, err := wire.Handshake(ctx, nc, wire.HandshakeConfig{Cluster: cfg.Cluster, Node: "node0", Incarnation: 1,
			Secret: cfg.Secret, Purpose: wire.PurposeControl, SharedMemory: true}, true)
		cancel()
		if err != nil {
			t.Fatalf("handshake %d: %v", i, err)
		}
		if !peer.SharedMemory {
			t.Fatal("the node did not agree to shared memory")
		}
		if _, err := nc.Write(offer); err != nil {
			t.Fatal(err)
		}
		// The answer (a region's name, or a refusal) comes once the node
		// decided about this connection.
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Read(make([]byte, 512)); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "tensorferry-shm-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) > 5 { // one region: its memory and four FIFOs
		t.Fatalf("%d upgrades in flight from one name hold %d region files, want at most one region's 5", n, len(files))
	}
}

// shmOffer returns the bytes of an initiator's offer under sc, as Upgrade
// writes them.
func shmOffer(t *testing.T, sc shm.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		shm.Upgrade(context.Background(), a, sc, true)
	}()
	buf := make([]byte, 4096)
	k, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	<-done
	return buf[:k]
}
