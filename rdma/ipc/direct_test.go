package ipc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// exportTTL is fakePair.export with a lease deadline.
func (p *fakePair) exportTTL(t testing.TB, buf memory.Buffer, holder string, ttl time.Duration) *tensor.Descriptor {
	t.Helper()
	tt, err := tensor.FromBuffer(buf, tensor.Uint8, tensor.Shape{int64(buf.Len())})
	if err != nil {
		t.Fatal(err)
	}
	e, d, err := p.ownerStore.Export(tt, holder, ttl)
	if err != nil {
		t.Fatal(err)
	}
	o, err := p.owner.Offer(context.Background(), e, holder)
	if err != nil {
		t.Fatal(err)
	}
	d.Offers = map[string][]byte{rdma.IPC: o}
	return d
}

func offerIn(t *testing.T, d *tensor.Descriptor) offer {
	t.Helper()
	o, err := decodeOffer(d.Offers[rdma.IPC])
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestDirectFetch: once the holder maps an allocation, the owner's offers
// of it are direct and the holder copies without begin or end; offers to
// other nodes, forwarded descriptors and leases about to end still go
// through begin.
func TestDirectFetch(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	copies := recordCopies(p.fetcher)
	ctx := context.Background()
	const base = 0x7f0000000000
	whole := fakeCUDA(t, base, 1<<20)
	a, _ := whole.Slice(4096, 1000)
	dst := fakeCUDA(t, 0x7e0000000000, 4096)

	first := p.exportTTL(t, a, fetcherNode, time.Minute)
	if o := offerIn(t, first); o.direct() {
		t.Fatalf("direct offer before the holder got the handle: %+v", o)
	}
	if err := p.fetcher.Fetch(ctx, first, dst); err != nil {
		t.Fatal(err)
	}
	begins := p.count(opBegin)

	second := p.exportTTL(t, a, fetcherNode, time.Minute)
	o := offerIn(t, second)
	now, _ := monoNow()
	if !o.direct() || o.Deadline < now+uint64(50*time.Second) || o.Deadline > now+uint64(time.Minute) {
		t.Fatalf("offer after the grant: %+v (now %d), want direct with the lease's deadline", o, now)
	}
	if err := p.fetcher.Fetch(ctx, second, dst); err != nil {
		t.Fatal(err)
	}
	if got := p.count(opBegin); got != begins {
		t.Errorf("direct fetch sent %d begin requests", got-begins)
	}
	if n := len(*copies); n != 2 || (*copies)[1] != (copyRecord{0x7e0000000000, base + 4096, 1000}) {
		t.Errorf("copies %+v", *copies)
	}
	if st := p.fetcher.Stats(); st.Direct != 1 || st.Opens != 1 {
		t.Errorf("fetcher stats %+v, want 1 direct fetch, 1 open", st)
	}
	if st := p.owner.Stats(); st.DirectOffers != 1 {
		t.Errorf("owner stats %+v, want 1 direct offer", st)
	}

	// No deadline: direct too.
	if o := offerIn(t, p.exportTTL(t, a, fetcherNode, 0)); !o.direct() || o.Deadline != 0 {
		t.Errorf("offer without a deadline: %+v", o)
	}
	// Another holder never got the handle.
	if o := offerIn(t, p.exportTTL(t, a, "mallory", time.Minute)); o.direct() {
		t.Errorf("direct offer to a node without the handle: %+v", o)
	}
	// A forwarded descriptor (this node is not its holder) begins.
	fwd := *p.exportTTL(t, a, fetcherNode, time.Minute)
	fwd.Holder = "someone-else"
	if err := p.fetcher.Fetch(ctx, &fwd, dst); err != nil {
		t.Fatal(err)
	}
	if p.count(opBegin) != begins+1 {
		t.Errorf("forwarded descriptor: %d begins, want 1", p.count(opBegin)-begins)
	}
	// A lease within DirectMargin of its end begins (the begin keeps the
	// export past the lease's end until the copy is over).
	short := p.exportTTL(t, a, fetcherNode, 300*time.Millisecond)
	if o := offerIn(t, short); !o.direct() {
		t.Fatalf("short lease: offer %+v, want direct", o)
	}
	if err := p.fetcher.Fetch(ctx, short, dst); err != nil {
		t.Fatal(err)
	}
	if p.count(opBegin) != begins+2 {
		t.Errorf("lease about to end: %d begins, want 2", p.count(opBegin)-begins)
	}
	if st := p.fetcher.Stats(); st.Direct != 1 {
		t.Errorf("fetcher stats %+v, want still 1 direct fetch", st)
	}
	if st := waitIdle(t, p.owner); st.Acquisitions != 0 {
		t.Errorf("owner holds %d acquisitions", st.Acquisitions)
	}
}

// TestFetchDirectDeclines: FetchDirect copies only what Fetch would copy
// without a control round trip; otherwise it declines having sent nothing
// and copied nothing, and refuses a bad request as Fetch does.
func TestFetchDirectDeclines(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	copies := recordCopies(p.fetcher)
	ctx := context.Background()
	a := fakeCUDA(t, 0x7f0000000000, 4096)
	dst := fakeCUDA(t, 0x7e0000000000, 4096)
	declines := func(what string, d *tensor.Descriptor) {
		t.Helper()
		reqs, n := p.count(opBegin)+p.count(opProve), len(*copies)
		done, err := p.fetcher.FetchDirect(ctx, d, dst)
		if done || err != nil {
			t.Fatalf("%s: FetchDirect done=%v, %v; want declined", what, done, err)
		}
		if p.count(opBegin)+p.count(opProve) != reqs || len(*copies) != n {
			t.Fatalf("%s: a declined FetchDirect sent a request or copied", what)
		}
	}
	// Not mapped yet: the first fetch needs the handle.
	first := p.exportTTL(t, a, fetcherNode, time.Minute)
	declines("first fetch", first)
	if err := p.fetcher.Fetch(ctx, first, dst); err != nil {
		t.Fatal(err)
	}
	// Mapped, direct offer: copied, no request.
	reqs := p.count(opBegin)
	done, err := p.fetcher.FetchDirect(ctx, p.exportTTL(t, a, fetcherNode, time.Minute), dst)
	if !done || err != nil || p.count(opBegin) != reqs || len(*copies) != 2 {
		t.Fatalf("direct offer: done=%v, %v, %d begins, %d copies", done, err, p.count(opBegin)-reqs, len(*copies))
	}
	// Forwarded, lease about to end: declined.
	fwd := *p.exportTTL(t, a, fetcherNode, time.Minute)
	fwd.Holder = "someone-else"
	declines("forwarded descriptor", &fwd)
	declines("lease about to end", p.exportTTL(t, a, fetcherNode, 300*time.Millisecond))
	// Bad requests: done, with Fetch's error.
	if done, err := p.fetcher.FetchDirect(ctx, p.exportTTL(t, a, fetcherNode, time.Minute), fakeCUDA(t, 0x7d0000000000, 16)); !done || !errors.Is(err, rdma.ErrTooSmall) {
		t.Fatalf("small destination: done=%v, %v", done, err)
	}
	noOffer := *p.exportTTL(t, a, fetcherNode, time.Minute)
	noOffer.Offers = nil
	if done, err := p.fetcher.FetchDirect(ctx, &noOffer, dst); !done || !errors.Is(err, rdma.ErrNoOffer) {
		t.Fatalf("no offer: done=%v, %v", done, err)
	}
	if st := p.fetcher.Stats(); st.Direct != 1 {
		t.Errorf("fetcher stats %+v, want 1 direct fetch", st)
	}
}

// TestNoDirect: an owner configured without direct offers makes none.
func TestNoDirect(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir(), NoDirect: true})
	fakeHandles(p.owner)
	recordCopies(p.fetcher)
	a := fakeCUDA(t, 0x7f0000000000, 4096)
	dst := fakeCUDA(t, 0x7e0000000000, 4096)
	var begins int
	for i := range 3 {
		if i == 1 {
			begins = p.count(opBegin) // the first also proved this node
		}
		d := p.exportTTL(t, a, fetcherNode, time.Minute)
		if o := offerIn(t, d); o.direct() {
			t.Fatalf("direct offer with NoDirect: %+v", o)
		}
		if err := p.fetcher.Fetch(context.Background(), d, dst); err != nil {
			t.Fatal(err)
		}
	}
	if p.count(opBegin)-begins != 2 || p.fetcher.Stats().Direct != 0 {
		t.Errorf("%d begins after the first fetch, stats %+v: want 2, no direct fetch", p.count(opBegin)-begins, p.fetcher.Stats())
	}
}

// TestDirectCopyOutlivesLease: a direct copy is bounded by the lease's
// deadline; one that ends after it is an error (the owner may have reused
// the memory), whether the copy noticed the deadline or not.
func TestDirectCopyOutlivesLease(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir(), DirectMargin: 10 * time.Millisecond})
	fakeHandles(p.owner)
	recordCopies(p.fetcher)
	ctx := context.Background()
	a := fakeCUDA(t, 0x7f0000000000, 4096)
	dst := fakeCUDA(t, 0x7e0000000000, 4096)
	if err := p.fetcher.Fetch(ctx, p.exportTTL(t, a, fetcherNode, time.Minute), dst); err != nil {
		t.Fatal(err)
	}
	t.Run("honours-deadline", func(t *testing.T) {
		var deadline time.Time
		p.fetcher.copyFunc = func(ctx context.Context, _, _ memory.Buffer) error {
			deadline, _ = ctx.Deadline()
			<-ctx.Done()
			return ctx.Err()
		}
		start := time.Now()
		err := p.fetcher.Fetch(ctx, p.exportTTL(t, a, fetcherNode, 200*time.Millisecond), dst)
		if !errors.Is(err, errLeaseOutlived) {
			t.Fatalf("fetch: %v, want errLeaseOutlived", err)
		}
		if d := deadline.Sub(start); d <= 0 || d > 200*time.Millisecond {
			t.Errorf("copy's deadline %v after the start, want within the lease", d)
		}
	})
	t.Run("ignores-deadline", func(t *testing.T) {
		p.fetcher.copyFunc = func(context.Context, memory.Buffer, memory.Buffer) error {
			// A delay on purpose, not a synchronization: the copy under
			// test ignores its deadline and outlives the 100ms lease.
			time.Sleep(150 * time.Millisecond)
			return nil
		}
		err := p.fetcher.Fetch(ctx, p.exportTTL(t, a, fetcherNode, 100*time.Millisecond), dst)
		if !errors.Is(err, errLeaseOutlived) {
			t.Fatalf("fetch: %v, want errLeaseOutlived", err)
		}
	})
	if st := p.fetcher.Stats(); st.Direct != 0 || st.Mappings != 1 {
		t.Errorf("stats %+v: want no successful direct fetch and the mapping kept", st)
	}
}

// TestRevokePush: the owner tells the fetcher at once when it frees an
// allocation the fetcher maps; an undelivered revocation waits for the
// fetcher's next begin reply.
func TestRevokePush(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	recordCopies(p.fetcher)
	ctx := context.Background()
	dst := fakeCUDA(t, 0x7e0000000000, 4096)
	fetchAndFree := func(base uintptr) {
		t.Helper()
		a := fakeCUDA(t, base, 4096)
		d := p.exportTTL(t, a, fetcherNode, time.Minute)
		if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
			t.Fatal(err)
		}
		if err := p.ownerStore.Release(d.ExportID, d.Lease); err != nil {
			t.Fatal(err)
		}
		if err := a.Free(); err != nil {
			t.Fatal(err)
		}
	}
	fetchAndFree(0x7f0000000000)
	waitStats(t, p.fetcher, func(st Stats) bool { return st.Revokes == 1 && st.Mappings == 0 && st.Closes == 1 })
	if st := p.owner.Stats(); st.RevokesSent != 1 || st.Handles != 0 {
		t.Errorf("owner stats %+v, want 1 revoke sent, no handle", st)
	}

	// The revoke's reply is lost: the owner keeps the id for the next
	// begin reply, which closes the mapping.
	p.mu.Lock()
	p.lose = func(op uint8) bool { return op == opRevoke }
	p.mu.Unlock()
	fetchAndFree(0x7f1000000000)
	waitStats(t, p.owner, func(st Stats) bool { return st.RevokesSent == 2 })
	// Nothing reports the requeue but the owner's state: polled.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		p.owner.mu.Lock()
		queued, pushing := len(p.owner.revoked[fetcherNode]), p.owner.pushing
		p.owner.mu.Unlock()
		if queued == 1 && !pushing {
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("undelivered revocation not queued again (%d queued, pushing %v)", queued, pushing)
		}
	}
	p.mu.Lock()
	p.lose = nil
	p.mu.Unlock()
	closes := p.fetcher.Stats().Closes
	if err := p.fetcher.Fetch(ctx, p.exportTTL(t, fakeCUDA(t, 0x7f2000000000, 4096), fetcherNode, time.Minute), dst); err != nil {
		t.Fatal(err)
	}
	if st := p.fetcher.Stats(); st.Closes != closes+1 {
		// The lost reply's request was delivered: the mapping may be
		// closed already; then the begin reply's repeat is harmless.
		if st.Closes != closes || st.Mappings != 1 {
			t.Errorf("stats %+v: the revoked mapping should be closed", st)
		}
	}
	if st := p.fetcher.Stats(); st.Mappings != 1 {
		t.Errorf("stats %+v, want only the last allocation mapped", st)
	}
}
