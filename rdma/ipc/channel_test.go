package ipc

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

func TestNewNotViableWithoutDriver(t *testing.T) {
	if n, err := memory.CUDADeviceCount(); err == nil && n > 0 {
		t.Skipf("%d CUDA devices here: the not-viable path needs a machine without", n)
	}
	env := &rdma.Env{Node: "n", Store: tensor.NewStore("n", 1),
		Control: func(context.Context, string, string, []byte) ([]byte, error) { return nil, nil }}
	_, err := New(env)
	if !errors.Is(err, rdma.ErrNotViable) {
		t.Fatalf("New without a driver: %v, want ErrNotViable", err)
	}
	if !strings.Contains(err.Error(), "ipc: no CUDA") {
		t.Errorf("reason not given: %v", err)
	}
	t.Logf("not viable: %v", err)
}

func TestNewNeedsControl(t *testing.T) {
	if _, err := newChannel(&rdma.Env{Node: "n", Store: tensor.NewStore("n", 1)}, Config{}); err == nil {
		t.Fatal("channel without Env.Control")
	}
}

func TestOffer(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	host, err := memory.NewHostBuffer(100)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.export(t, host, fetcherNode); d.Offers != nil {
		t.Errorf("offer for host memory: %v", d.Offers)
	}
	whole := fakeCUDA(t, 0x7f0000000000, 1<<20)
	part, err := whole.Slice(4096, 1000)
	if err != nil {
		t.Fatal(err)
	}
	d := p.export(t, part, fetcherNode)
	o, err := decodeOffer(d.Offers[rdma.IPC])
	if err != nil {
		t.Fatal(err)
	}
	want := offer{Alloc: whole.Allocation().ID, Offset: 4096, Bytes: 1000, AllocSize: 1 << 20}
	if o != want {
		t.Fatalf("offer %+v, want %+v", o, want)
	}
}

// fakeHandles makes the owner's handle export work without a driver: the
// "driver allocation" is the buffer's Allocation.
func fakeHandles(c *Channel) {
	c.exportIPC = func(b memory.Buffer) (memory.IPCHandle, int, error) {
		a := b.Allocation()
		var h memory.IPCHandle
		h.Size = a.Size
		h.Handle[0] = byte(a.ID)
		return h, int(b.Ptr() - a.Base), nil
	}
}

type copyRecord struct {
	dst, src uintptr
	n        int
}

// recordCopies makes the fetcher record its copies instead of running them.
func recordCopies(c *Channel) *[]copyRecord {
	var mu sync.Mutex
	var out []copyRecord
	c.copyFunc = func(_ context.Context, dst, src memory.Buffer) error {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, copyRecord{dst.Ptr(), src.Ptr(), src.Len()})
		return nil
	}
	return &out
}

func TestFetchErrors(t *testing.T) {
	dir := t.TempDir()
	p := newFakePair(t, Config{ShmDir: dir})
	ctx := context.Background()
	d := p.export(t, fakeCUDA(t, 0x7f0000000000, 4096), fetcherNode)
	other := p.export(t, fakeCUDA(t, 0x7f1000000000, 4096), "mallory")
	released := p.export(t, fakeCUDA(t, 0x7f2000000000, 4096), fetcherNode)
	if err := p.ownerStore.Release(released.ExportID, released.Lease); err != nil {
		t.Fatal(err)
	}
	dst := fakeCUDA(t, 0x7e0000000000, 8192)
	host, _ := memory.NewHostBuffer(8192)
	mutate := func(f func(d *tensor.Descriptor)) *tensor.Descriptor {
		c := *d
		c.Offers = map[string][]byte{rdma.IPC: d.Offers[rdma.IPC]}
		f(&c)
		return &c
	}
	shifted := offer{Alloc: 0, Offset: 8, Bytes: 4096, AllocSize: 8192}
	cases := []struct {
		name string
		d    *tensor.Descriptor
		dst  memory.Buffer
		want error
	}{
		{"too-small", d, fakeCUDA(t, 0x7e0000000000, 4095), rdma.ErrTooSmall},
		{"no-offer", mutate(func(d *tensor.Descriptor) { d.Offers = nil }), dst, rdma.ErrNoOffer},
		{"bad-offer", mutate(func(d *tensor.Descriptor) { d.Offers[rdma.IPC] = []byte{1, 2} }), dst, errBadMessage},
		{"offer-size-mismatch", mutate(func(d *tensor.Descriptor) { d.Bytes = 100 }), dst, errBadMessage},
		{"unknown-export", mutate(func(d *tensor.Descriptor) { d.ExportID += 1 << 40 }), dst, tensor.ErrUnknownExport},
		{"released", released, dst, tensor.ErrUnknownExport},
		{"wrong-lease", mutate(func(d *tensor.Descriptor) { d.Lease ^= 0x5a5a }), dst, tensor.ErrBadLease},
		{"stale", mutate(func(d *tensor.Descriptor) { d.Incarnation++ }), dst, tensor.ErrStale},
		{"other-holder", other, dst, tensor.ErrBadLease},
		{"offer-not-the-export", mutate(func(d *tensor.Descriptor) {
			o := shifted
			o.Alloc, _ = decodeOfferAlloc(d)
			d.Offers[rdma.IPC] = o.encode()
		}), dst, errBadMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := p.fetcher.Fetch(ctx, tc.d, tc.dst); !errors.Is(err, tc.want) {
				t.Fatalf("fetch: %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("host-destination", func(t *testing.T) {
		if err := p.fetcher.Fetch(ctx, d, host); err == nil {
			t.Fatal("fetch into host memory")
		}
	})
	t.Run("no-driver", func(t *testing.T) {
		// Past every check, the owner proves the fetcher, then fails to
		// make the handle: no driver here.
		err := p.fetcher.Fetch(ctx, d, dst)
		if err == nil {
			t.Fatal("fetch without a driver succeeded")
		}
		t.Logf("fetch without a driver: %v", err)
		if st := p.owner.Stats(); st.ProvenPeers != 1 {
			t.Errorf("proven peers %d, want 1", st.ProvenPeers)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := p.fetcher.Fetch(cctx, d, dst); !errors.Is(err, context.Canceled) {
			t.Fatalf("fetch: %v, want context.Canceled", err)
		}
	})
	if n := p.owner.InFlight(); n != 0 {
		t.Errorf("owner holds %d acquisitions", n)
	}
	if st := p.fetcher.Stats(); st.Mappings != 0 || len(p.fetcher.mappings) != 0 {
		t.Errorf("fetcher holds mappings: %+v", st)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("challenge files left: %v", left)
	}
}

func decodeOfferAlloc(d *tensor.Descriptor) (uint64, error) {
	o, err := decodeOffer(d.Offers[rdma.IPC])
	return o.Alloc, err
}

// TestLostBeginReply: when the reply to begin is lost, the fetcher ends the
// acquisition anyway, so the owner does not keep the export lent.
func TestLostBeginReply(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	d := p.export(t, fakeCUDA(t, 0x7f0000000000, 0), fetcherNode)
	p.lose = func(op uint8) bool { return op == opBegin }
	err := p.fetcher.Fetch(context.Background(), d, fakeCUDA(t, 0x7e0000000000, 10))
	if !errors.Is(err, rdma.ErrPeerDown) {
		t.Fatalf("fetch with a lost reply: %v, want ErrPeerDown", err)
	}
	if p.count(opEnd) != 1 {
		t.Errorf("%d end requests, want 1", p.count(opEnd))
	}
	if n := p.owner.InFlight(); n != 0 {
		t.Errorf("owner holds %d acquisitions", n)
	}
	p.lose = nil
	if err := p.fetcher.Fetch(context.Background(), d, fakeCUDA(t, 0x7e0000000000, 10)); err != nil {
		t.Fatalf("empty fetch: %v", err)
	}
}

// TestMappingCache drives the fetcher's mapping cache in one process
// (where the owner's allocation is addressed directly) with fake handles
// and recorded copies: one open per allocation, offsets inside it right,
// mappings closed when the owner frees the allocation, on PeerDown and on
// Close.
func TestMappingCache(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	copies := recordCopies(p.fetcher)
	ctx := context.Background()
	const base = 0x7f0000000000
	whole := fakeCUDA(t, base, 1<<20)
	a, _ := whole.Slice(0, 1000)
	b, _ := whole.Slice(65536, 4096)
	da := p.export(t, a, fetcherNode)
	db := p.export(t, b, fetcherNode)
	dst := fakeCUDA(t, 0x7e0000000000, 8192)
	for _, d := range []*tensor.Descriptor{da, db, da, db} {
		if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
			t.Fatalf("fetch: %v", err)
		}
	}
	want := []copyRecord{{0x7e0000000000, base, 1000}, {0x7e0000000000, base + 65536, 4096}, {0x7e0000000000, base, 1000}, {0x7e0000000000, base + 65536, 4096}}
	if len(*copies) != len(want) {
		t.Fatalf("copies %v, want %v", *copies, want)
	}
	for i, c := range *copies {
		if c != want[i] {
			t.Errorf("copy %d: %+v, want %+v", i, c, want[i])
		}
	}
	st := p.fetcher.Stats()
	if st.Opens != 1 || st.Reuses != 3 || st.Mappings != 1 {
		t.Errorf("fetcher stats %+v, want 1 open, 3 reuses, 1 mapping", st)
	}
	ost := waitIdle(t, p.owner)
	if ost.HandleExports != 1 || ost.Handles != 1 || ost.Acquisitions != 0 {
		t.Errorf("owner stats %+v, want 1 handle made, 1 cached, 0 acquisitions", ost)
	}
	if p.count(opChallenge) != 1 || p.count(opProve) != 1 {
		t.Errorf("%d challenges, %d proofs, want 1 each", p.count(opChallenge), p.count(opProve))
	}

	// The owner frees the allocation: its handle is dropped, and the
	// fetcher is told to close its mapping.
	for _, d := range []*tensor.Descriptor{da, db} {
		if err := p.ownerStore.Release(d.ExportID, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := whole.Free(); err != nil {
		t.Fatal(err)
	}
	if ost := p.owner.Stats(); ost.Handles != 0 {
		t.Errorf("owner still caches %d handles after the free", ost.Handles)
	}
	// The owner pushes the revocation in the background.
	waitStats(t, p.fetcher, func(st Stats) bool { return st.Closes == 1 && st.Mappings == 0 })
	other := fakeCUDA(t, 0x7f1000000000, 4096)
	dc := p.export(t, other, fetcherNode)
	if err := p.fetcher.Fetch(ctx, dc, dst); err != nil {
		t.Fatal(err)
	}
	if st := p.fetcher.Stats(); st.Mappings != 1 || st.Closes != 1 || st.Opens != 2 {
		t.Errorf("after the owner freed the first allocation: %+v, want 1 mapping, 1 close, 2 opens", st)
	}
	p.fetcher.PeerDown(ownerNode)
	if st := p.fetcher.Stats(); st.Mappings != 0 || st.Closes != 2 {
		t.Errorf("after PeerDown: %+v, want no mapping", st)
	}
	if err := p.fetcher.Fetch(ctx, dc, dst); err != nil {
		t.Fatal(err)
	}
	if err := p.fetcher.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.fetcher.Stats(); st.Mappings != 0 {
		t.Errorf("after Close: %+v", st)
	}
	if err := p.fetcher.Fetch(ctx, dc, dst); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("fetch after Close: %v, want ErrClosed", err)
	}
}

// TestMappingCacheConcurrent: concurrent first fetches of one allocation
// open it once; a mapping dropped by PeerDown during a copy fails that copy
// with ErrPeerDown and is closed by its last user.
func TestMappingCacheConcurrent(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	ctx := context.Background()
	whole := fakeCUDA(t, 0x7f0000000000, 1<<20)
	d := p.export(t, whole, fetcherNode)
	dst := fakeCUDA(t, 0x7e0000000000, 1<<20)
	p.fetcher.copyFunc = func(context.Context, memory.Buffer, memory.Buffer) error { return nil }
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.fetcher.Fetch(ctx, d, dst)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if st := p.fetcher.Stats(); st.Opens != 1 || st.Reuses != 15 {
		t.Errorf("stats %+v, want 1 open and 15 reuses", st)
	}

	inCopy, release := make(chan struct{}), make(chan struct{})
	p.fetcher.copyFunc = func(context.Context, memory.Buffer, memory.Buffer) error {
		close(inCopy)
		<-release
		return nil
	}
	res := make(chan error, 1)
	go func() { res <- p.fetcher.Fetch(ctx, d, dst) }()
	<-inCopy
	p.fetcher.PeerDown(ownerNode)
	if st := p.fetcher.Stats(); st.Mappings != 1 {
		t.Errorf("mapping in use closed early: %+v", st)
	}
	close(release)
	if err := <-res; !errors.Is(err, rdma.ErrPeerDown) {
		t.Errorf("copy across PeerDown: %v, want ErrPeerDown", err)
	}
	if st := p.fetcher.Stats(); st.Mappings != 0 {
		t.Errorf("mapping left after its last user: %+v", st)
	}
	// Successful fetches end their holds in the background.
	if st := waitIdle(t, p.owner); st.Acquisitions != 0 {
		t.Errorf("owner holds %d acquisitions", st.Acquisitions)
	}
}

// TestMappingEviction: beyond MaxMappings, idle mappings are closed least
// recently used first.
func TestMappingEviction(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir(), MaxMappings: 2})
	fakeHandles(p.owner)
	recordCopies(p.fetcher)
	ctx := context.Background()
	dst := fakeCUDA(t, 0x7e0000000000, 4096)
	var ds []*tensor.Descriptor
	for i := range 4 {
		ds = append(ds, p.export(t, fakeCUDA(t, uintptr(0x7f0000000000+i<<30), 4096), fetcherNode))
	}
	for _, d := range ds {
		if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.fetcher.Stats(); st.Mappings != 2 || st.Closes != 2 || st.Opens != 4 {
		t.Fatalf("stats %+v, want 2 mappings after 4 opens", st)
	}
	// The two most recent are kept.
	for _, d := range ds[2:] {
		if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.fetcher.Stats(); st.Opens != 4 {
		t.Fatalf("recent mappings were evicted: %+v", st)
	}
}

// waitIdle waits until the owner holds no acquisitions (a successful fetch
// ends its hold in the background) and returns its stats.
func waitIdle(t *testing.T, owner *Channel) Stats {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		st := owner.Stats()
		if st.Acquisitions == 0 {
			return st
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return owner.Stats()
		}
	}
}

// waitStats waits up to 5 s until c's stats satisfy ok and returns them.
func waitStats(t *testing.T, c *Channel, ok func(Stats) bool) Stats {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		st := c.Stats()
		if ok(st) {
			return st
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("stats %+v: condition not reached in 5 s", st)
		}
	}
}
