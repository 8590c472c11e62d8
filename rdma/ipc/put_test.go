package ipc

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestPutStream drives PutStream without a GPU (recorded copies): it
// copies from the local buffer into the owner's allocation at the
// export's offset, through begin and then under a direct offer, once
// Ready allowed it, telling Landed; the owner's checks refuse what they
// refuse for a fetch, and a Ready that fails copies nothing.
func TestPutStream(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	fakeHandles(p.owner)
	copies := recordCopies(p.fetcher)
	ctx := context.Background()
	const base, local = 0x7f0000000000, 0x7e0000000000
	whole := fakeCUDA(t, base, 1<<20)
	a, _ := whole.Slice(4096, 1000)
	src := fakeCUDA(t, local, 4096)
	var asked, landed []int64
	pr := rdma.Progress{
		Ready:  func(_ context.Context, n int64) (int64, error) { asked = append(asked, n); return n, nil },
		Landed: func(n int64) { landed = append(landed, n) },
	}
	first := p.exportTTL(t, a, fetcherNode, time.Minute)
	if err := p.fetcher.PutStream(ctx, first, src, pr); err != nil {
		t.Fatal(err)
	}
	// The holder maps the allocation now: the next offer is direct.
	second := p.exportTTL(t, a, fetcherNode, time.Minute)
	if !offerIn(t, second).direct() {
		t.Fatal("no direct offer after the first put")
	}
	begins := p.count(opBegin)
	if err := p.fetcher.PutStream(ctx, second, src, pr); err != nil {
		t.Fatal(err)
	}
	if p.count(opBegin) != begins {
		t.Fatal("a put under a direct offer began")
	}
	want := []copyRecord{{base + 4096, local, 1000}, {base + 4096, local, 1000}}
	if !slices.Equal(*copies, want) {
		t.Fatalf("copies %+v, want %+v (into the owner's allocation)", *copies, want)
	}
	if w := []int64{1000, 1000}; !slices.Equal(asked, w) || !slices.Equal(landed, w) {
		t.Fatalf("asked %v, landed %v, want %v", asked, landed, w)
	}

	boom := errors.New("the source failed")
	failing := rdma.Progress{Ready: func(context.Context, int64) (int64, error) { return 0, boom }}
	if err := p.fetcher.PutStream(ctx, first, src, failing); !errors.Is(err, boom) {
		t.Fatalf("put with a failing source: %v", err)
	}
	other := p.export(t, fakeCUDA(t, 0x7f1000000000, 4096), "mallory")
	host, _ := memory.NewHostBuffer(4096)
	for _, c := range []struct {
		name string
		d    *tensor.Descriptor
		src  memory.Buffer
		want error
	}{
		{"too-small", first, fakeCUDA(t, local, 999), rdma.ErrTooSmall},
		{"other-holder", other, src, tensor.ErrBadLease},
		{"wrong-lease", func() *tensor.Descriptor { d := *first; d.Lease ^= 0x5a; return &d }(), src, tensor.ErrBadLease},
		{"host-source", first, host, nil},
	} {
		err := p.fetcher.PutStream(ctx, c.d, c.src, rdma.Progress{})
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if len(*copies) != len(want) {
		t.Fatalf("refused puts copied: %+v", *copies)
	}
	for _, d := range []*tensor.Descriptor{first, second, other} {
		_ = p.ownerStore.Release(d.ExportID, d.Lease)
	}
	if st := waitIdle(t, p.owner); st.Acquisitions != 0 {
		t.Fatalf("owner holds %d acquisitions", st.Acquisitions)
	}
}
