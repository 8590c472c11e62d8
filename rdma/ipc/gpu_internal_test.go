package ipc

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestGPUSharedAllocation fetches two tensors carved out of one CUDA
// allocation (one process, so the allocation is addressed directly): one
// handle is made, one mapping opened, the bytes land at the right offsets,
// and freeing the allocation drops the owner's handle and, on the next
// reply, the fetcher's mapping.
func TestGPUSharedAllocation(t *testing.T) {
	n, err := memory.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA device here: %v", err)
	}
	od, fd := memory.CUDA(0), memory.CUDA(min(n-1, 1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newFakePair(t, Config{ShmDir: t.TempDir(), CopyChunk: 1 << 20})
	oa, err := memory.CUDAAllocatorFor(od)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	whole, err := oa.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, size)
	rdmatest.Fill(77, src)
	host, err := memory.NewHostBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	copy(host.Host(), src)
	if err := memory.Copy(ctx, whole, host); err != nil {
		t.Fatal(err)
	}
	parts := [][2]int{{0, 1000}, {1 << 20, 3<<20 + 5}, {size - 4096, 4096}}
	var ds []*tensor.Descriptor
	for _, r := range parts {
		v, err := whole.Slice(r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, p.export(t, v, fetcherNode))
	}
	fa, err := memory.AllocatorFor(fd)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := fa.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	for i, d := range ds {
		clear(host.Host())
		if err := memory.Copy(ctx, dst, host); err != nil {
			t.Fatal(err)
		}
		if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
		if err := memory.Copy(ctx, host, dst); err != nil {
			t.Fatal(err)
		}
		r := parts[i]
		if !bytes.Equal(host.Host()[:r[1]], src[r[0]:r[0]+r[1]]) {
			t.Fatalf("fetch %d: wrong bytes", i)
		}
		if bytes.ContainsFunc(host.Host()[r[1]:], func(c rune) bool { return c != 0 }) {
			t.Fatalf("fetch %d wrote past its end", i)
		}
	}
	if st := p.fetcher.Stats(); st.Opens != 1 || st.Reuses != 2 {
		t.Errorf("fetcher %+v, want 1 open and 2 reuses", st)
	}
	// The fetcher maps the allocation now: a new export of it is offered
	// direct and copied without begin or end, on the real device.
	r := parts[len(parts)-1]
	v, err := whole.Slice(r[0], r[1])
	if err != nil {
		t.Fatal(err)
	}
	dd := p.exportTTL(t, v, fetcherNode, time.Minute)
	if o := offerIn(t, dd); !o.direct() {
		t.Fatalf("offer %+v, want direct", o)
	}
	clear(host.Host())
	if err := memory.Copy(ctx, dst, host); err != nil {
		t.Fatal(err)
	}
	begins := p.count(opBegin)
	if err := p.fetcher.Fetch(ctx, dd, dst); err != nil {
		t.Fatalf("direct fetch: %v", err)
	}
	if err := memory.Copy(ctx, host, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host.Host()[:r[1]], src[r[0]:r[0]+r[1]]) {
		t.Fatal("direct fetch: wrong bytes")
	}
	if st := p.fetcher.Stats(); st.Direct != 1 || p.count(opBegin) != begins {
		t.Errorf("fetcher %+v after %d begins, want 1 direct fetch and no begin", st, p.count(opBegin)-begins)
	}
	ds = append(ds, dd)
	if st := waitIdle(t, p.owner); st.HandleExports != 1 || st.Acquisitions != 0 {
		t.Errorf("owner %+v, want 1 handle made and no acquisition", st)
	}
	for _, d := range ds {
		if err := p.ownerStore.Release(d.ExportID, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := whole.Free(); err != nil {
		t.Fatal(err)
	}
	if err := oa.Trim(); err != nil { // cuMemFree: the allocation ends
		t.Fatal(err)
	}
	if st := p.owner.Stats(); st.Handles != 0 {
		t.Errorf("owner caches %d handles after the free", st.Handles)
	}
	waitStats(t, p.fetcher, func(st Stats) bool { return st.Closes == 1 && st.Mappings == 0 })
	next, err := oa.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Free()
	if err := p.fetcher.Fetch(ctx, p.export(t, next, fetcherNode), dst); err != nil {
		t.Fatal(err)
	}
	if st := p.fetcher.Stats(); st.Closes != 1 || st.Mappings != 1 {
		t.Errorf("fetcher %+v, want the freed allocation's mapping closed", st)
	}
}
