package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newChannel(env *rdma.Env) (rdma.Channel, error) { return New(env) }

func requireRDMA(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("verbs channel not viable here: %v", err)
	}
}

func TestNotViableWithoutDevice(t *testing.T) {
	err := Available()
	if err == nil {
		t.Skip("an RDMA device is present")
	}
	if !errors.Is(err, rdma.ErrNotViable) {
		t.Fatalf("Available() = %v, want ErrNotViable", err)
	}
	env := &rdma.Env{Node: "n", Store: tensor.NewStore("n", 1),
		Control: func(context.Context, string, string, []byte) ([]byte, error) { return nil, errors.New("none") }}
	if _, err := New(env); !errors.Is(err, rdma.ErrNotViable) {
		t.Fatalf("New() = %v, want ErrNotViable", err)
	}
	if devs := LocalDevices(); len(devs) != 0 {
		t.Fatalf("LocalDevices() = %v without a device", devs)
	}
	t.Logf("not viable (expected here): %v", err)
}

func TestNewNeedsEnv(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := New(&rdma.Env{Store: tensor.NewStore("n", 1)}); err == nil {
		t.Fatal("New without Control succeeded")
	}
}

// TestConformance runs the rdmatest suite on the verbs channel, owner and
// fetcher in one process over the RDMA device (loopback).
func TestConformance(t *testing.T) {
	requireRDMA(t)
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.InProcessPair(t, newChannel, memory.CPU, memory.CPU)
	})
}

// cluster is a few nodes in one process whose channels reach each other's
// HandleControl directly.
type cluster struct {
	mu    sync.Mutex
	chans map[string]*Channel
	envs  map[string]*rdma.Env
}

func newCluster(t *testing.T, names ...string) *cluster {
	t.Helper()
	return newClusterCfg(t, Config{}, names...)
}

// newClusterCfg is newCluster with a channel configuration.
func newClusterCfg(t *testing.T, cfg Config, names ...string) *cluster {
	t.Helper()
	return newClusterCfgs(t, func(string) Config { return cfg }, names...)
}

// newClusterCfgs is newCluster with each node's channel configuration.
func newClusterCfgs(t *testing.T, cfgOf func(node string) Config, names ...string) *cluster {
	t.Helper()
	requireRDMA(t)
	cl := &cluster{chans: map[string]*Channel{}, envs: map[string]*rdma.Env{}}
	for _, name := range names {
		from := name
		env := &rdma.Env{Node: name, Incarnation: 1, Store: tensor.NewStore(name, 1), Verbs: config.VerbsConfig{ChunkSize: 256 << 10, Window: 4},
			Control: func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
				cl.mu.Lock()
				ch := cl.chans[node]
				cl.mu.Unlock()
				if ch == nil || channel != rdma.Verbs {
					return nil, fmt.Errorf("no node %q", node)
				}
				return ch.HandleControl(ctx, from, req)
			}}
		ch, err := NewWithConfig(env, cfgOf(name))
		if err != nil {
			t.Fatal(err)
		}
		cl.mu.Lock()
		cl.chans[name], cl.envs[name] = ch, env
		cl.mu.Unlock()
	}
	t.Cleanup(func() {
		for name, ch := range cl.chans {
			if err := ch.Close(); err != nil {
				t.Errorf("closing %s: %v", name, err)
			}
			cl.envs[name].Store.Close()
		}
	})
	return cl
}

// export makes owner export n bytes of seed's data to peer and returns the
// descriptor with the owner's offer, and the tensor.
func (cl *cluster) export(t *testing.T, owner, peer string, seed uint64, n int) (*tensor.Descriptor, *tensor.Tensor) {
	t.Helper()
	tt, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	return cl.exportTensor(t, owner, peer, seed, tt)
}

// exportTensor fills tt with seed's data and exports it from owner to peer.
func (cl *cluster) exportTensor(t *testing.T, owner, peer string, seed uint64, tt *tensor.Tensor) (*tensor.Descriptor, *tensor.Tensor) {
	t.Helper()
	rdmatest.Fill(seed, tt.Host())
	e, d, err := cl.envs[owner].Store.Export(tt, peer, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, err := cl.chans[owner].Offer(context.Background(), e, peer)
	if err != nil {
		t.Fatal(err)
	}
	d.Offers = map[string][]byte{rdma.Verbs: o}
	return d, tt
}

func fetchCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// grantOf begins and ends a read of d by fetcher (connecting first) and
// returns the address and rkey the owner granted: the offer's rkey with
// per-export registration, the window's with windows (valid until the
// export ends).
func grantOf(t *testing.T, cl *cluster, fetcher string, d *tensor.Descriptor) (uint64, uint32) {
	t.Helper()
	c := cl.chans[fetcher]
	if _, err := c.fetchPeer(fetchCtx(t), d.Owner, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := c.begin(fetchCtx(t), d, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.endRead(fetchCtx(t), d.Owner, 0, rep.Token)
	return rep.Addr, rep.RKey
}

// rawRead reads through fetcher's existing connection to owner with an
// address and rkey of the test's choosing.
func rawRead(t *testing.T, cl *cluster, fetcher, owner string, raddr uint64, rkey uint32, dst memory.Buffer) error {
	t.Helper()
	fp, err := cl.chans[fetcher].fetchPeer(fetchCtx(t), owner, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fp.read(fetchCtx(t), dst, raddr, rkey)
}

func TestStaleRKeyAfterRelease(t *testing.T) {
	cl := newCluster(t, "owner", "fetcher")
	const n = 300 << 10
	d, tt := cl.export(t, "owner", "fetcher", 1, n)
	dst, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	addr, rkey := grantOf(t, cl, "fetcher", d)
	// The rkey still reads while the export lives...
	if err := rawRead(t, cl, "fetcher", "owner", addr, rkey, dst); err != nil {
		t.Fatalf("raw read of a live export: %v", err)
	}
	if err := cl.envs["owner"].Store.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
	// ...and not after the release.
	err = rawRead(t, cl, "fetcher", "owner", addr, rkey, dst)
	var wce *ibverbs.WCError
	if !errors.As(err, &wce) {
		t.Fatalf("read with a released export's rkey: %v, want a work completion error", err)
	}
	t.Logf("stale rkey: %v", err)
	s := cl.chans["owner"].Stats()
	if m, _ := cl.chans["owner"].Grants(); m == GrantWindows {
		if s.WindowInvalidations == 0 || s.OwnerDeregistrations != 0 {
			t.Errorf("after release with windows: %+v, want the window invalidated and the registration kept", s)
		}
	} else if s.OwnerDeregistrations == 0 {
		t.Errorf("no deregistration after release: %+v", s)
	}
	// The fetcher recovers: a new connection serves a new export.
	d2, tt2 := cl.export(t, "owner", "fetcher", 2, n)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d2, dst); err != nil {
		t.Fatalf("fetch after a failed read: %v", err)
	}
	checkData(t, dst.Host(), 2, n)
	_ = tt
	_ = tt2
}

func TestOtherPeersRKeyFails(t *testing.T) {
	cl := newCluster(t, "owner", "fetcher", "mallory")
	const n = 64 << 10
	d, _ := cl.export(t, "owner", "fetcher", 3, n)
	dm, _ := cl.export(t, "owner", "mallory", 4, n)
	dst, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	// Mallory connects legitimately (its own export)...
	if err := cl.chans["mallory"].Fetch(fetchCtx(t), dm, dst); err != nil {
		t.Fatal(err)
	}
	// ...then replays the fetcher's descriptor: the owner refuses the lease...
	if err := cl.chans["mallory"].Fetch(fetchCtx(t), d, dst); !errors.Is(err, tensor.ErrBadLease) {
		t.Fatalf("fetch of another peer's export: %v, want ErrBadLease", err)
	}
	// ...and the rkey itself reads nothing through mallory's queue pair.
	addr, rkey := grantOf(t, cl, "fetcher", d)
	err = rawRead(t, cl, "mallory", "owner", addr, rkey, dst)
	var wce *ibverbs.WCError
	if !errors.As(err, &wce) {
		t.Fatalf("read with another peer's rkey: %v, want a work completion error", err)
	}
	t.Logf("other peer's rkey: %v", err)
	// The rightful fetcher is unaffected.
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 3, n)
}

func TestRegistrationCacheHits(t *testing.T) {
	cl := newCluster(t, "owner", "fetcher")
	const n = 200 << 10
	d, _ := cl.export(t, "owner", "fetcher", 5, n)
	dst, err := memory.NewHostBuffer(n + 100)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
			t.Fatal(err)
		}
		checkData(t, dst.Host(), 5, n)
	}
	fs, os := cl.chans["fetcher"].Stats(), cl.chans["owner"].Stats()
	if fs.FetchRegistrations != 1 || fs.FetchHits != 2 || fs.Connections != 1 {
		t.Errorf("fetcher stats %+v: want 1 registration, 2 hits, 1 connection", fs)
	}
	if os.OwnerRegistrations != 1 {
		t.Errorf("owner stats %+v: want 1 registration", os)
	}
	// Freeing the destination drops its registration.
	if err := dst.Free(); err != nil {
		t.Fatal(err)
	}
	if fs := cl.chans["fetcher"].Stats(); fs.FetchEvictions != 1 {
		t.Errorf("after free: %+v, want 1 eviction", fs)
	}
	if err := cl.envs["owner"].Store.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
	os = cl.chans["owner"].Stats()
	if m, _ := cl.chans["owner"].Grants(); m == GrantWindows {
		if os.OwnerDeregistrations != 0 || os.WindowInvalidations != 1 {
			t.Errorf("after release: %+v, want the window invalidated and the registration kept", os)
		}
	} else if os.OwnerDeregistrations != 1 {
		t.Errorf("after release: %+v, want 1 deregistration", os)
	}
}

func TestPeerDownFailsAndRecovers(t *testing.T) {
	cl := newCluster(t, "owner", "fetcher")
	const n = 128 << 10
	d, _ := cl.export(t, "owner", "fetcher", 6, n)
	dst, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	cl.chans["owner"].PeerDown("fetcher")
	cl.chans["fetcher"].PeerDown("owner")
	if n := cl.chans["owner"].InFlight(); n != 0 {
		t.Fatalf("owner has %d reads in flight after PeerDown", n)
	}
	// A later transfer connects again.
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatalf("fetch after PeerDown: %v", err)
	}
	checkData(t, dst.Host(), 6, n)
	if s := cl.chans["fetcher"].Stats(); s.Connections != 2 {
		t.Errorf("stats %+v: want 2 connections", s)
	}
}

func checkData(t *testing.T, got []byte, seed uint64, n int) {
	t.Helper()
	want := make([]byte, n)
	rdmatest.Fill(seed, want)
	for i := range n {
		if got[i] != want[i] {
			t.Fatalf("byte %d: got %#x, want %#x", i, got[i], want[i])
		}
	}
}
