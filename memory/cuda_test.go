package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// needGPU skips the test, with the reason, unless cuda:0 is usable.
func needGPU(t *testing.T) {
	t.Helper()
	if _, err := cudaDeviceFor(CUDA(0)); err != nil {
		if errors.Is(err, ErrNotSupported) {
			t.Skipf("no CUDA device: %v", err)
		}
		t.Fatal(err)
	}
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 11))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func TestCUDAClass(t *testing.T) {
	tests := []struct{ n, want int }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {4096, 4096}, {4097, 8192},
		{1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20}, {2 << 20, 2 << 20}, {2<<20 + 1, 4 << 20},
		{5 << 20, 6 << 20}, {100 << 20, 100 << 20},
	}
	for _, tt := range tests {
		if got := cudaClass(tt.n); got != tt.want {
			t.Errorf("cudaClass(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}

func TestCUDANotSupportedWithoutDevice(t *testing.T) {
	if err := cuda.Init(); err == nil {
		t.Skip("a CUDA device is present")
	}
	for _, dev := range []Device{CUDA(0), Pinned} {
		a, err := AllocatorFor(dev)
		if !errors.Is(err, ErrNotSupported) || !errors.Is(err, cuda.ErrNoDevice) || a != nil {
			t.Errorf("AllocatorFor(%s) = %v, %v; want ErrNotSupported wrapping the driver reason", dev, a, err)
		}
	}
	if _, err := NewStream(CUDA(0)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewStream: %v", err)
	}
	if _, err := NewEvent(CUDA(0)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewEvent: %v", err)
	}
	w, err := WrapCUDA(CUDA(0), 0x1000, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := NewHostBuffer(64)
	if err := Copy(context.Background(), w, h); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Copy to a CUDA buffer without a device: %v", err)
	}
	if err := Fill(context.Background(), w, 1); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Fill of a CUDA buffer without a device: %v", err)
	}
	if _, err := NewTimingEvent(CUDA(0)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewTimingEvent: %v", err)
	}
	if _, err := LoadModule(CUDA(0), []byte(fillPTX)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("LoadModule: %v", err)
	}
	if _, err := CanAccessPeer(CUDA(0), CUDA(1)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("CanAccessPeer: %v", err)
	}
	if err := EnablePeerAccess(CUDA(0), CUDA(1)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("EnablePeerAccess: %v", err)
	}
}

func TestWrapCUDA(t *testing.T) {
	if _, err := WrapCUDA(CPU, 0x1000, 10, nil); err == nil {
		t.Error("WrapCUDA on the CPU succeeded")
	}
	if _, err := WrapCUDA(CUDA(0), 0, 10, nil); err == nil {
		t.Error("WrapCUDA of a null pointer succeeded")
	}
	released := 0
	w, err := WrapCUDA(CUDA(1), 0x10000, 4096, func() error { released++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	v, err := w.Slice(100, 200)
	if err != nil || v.Ptr() != 0x10000+100 || v.Len() != 200 || v.Allocation() != w.Allocation() || v.Host() != nil {
		t.Fatalf("Slice = %v, %v", v, err)
	}
	if _, err := v.Slice(150, 51); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("view Slice out of range: %v", err)
	}
	var seen []Allocation
	cancel := OnFree(func(a Allocation) { seen = append(seen, a) })
	defer cancel()
	if err := v.Free(); err != nil || released != 0 {
		t.Errorf("view Free = %v, released %d", err, released)
	}
	if err := w.Free(); err != nil || released != 1 {
		t.Errorf("Free = %v, released %d", err, released)
	}
	if err := w.Free(); !errors.Is(err, ErrFreed) || released != 1 {
		t.Errorf("second Free = %v, released %d", err, released)
	}
	if len(seen) != 1 || seen[0] != w.Allocation() {
		t.Errorf("OnFree saw %v", seen)
	}
	if _, err := devicePtr(v); !errors.Is(err, ErrFreed) {
		t.Errorf("devicePtr of a view of a freed buffer: %v", err)
	}
}

func TestGPUCUDAAllocatorCaching(t *testing.T) {
	needGPU(t)
	a, err := CUDAAllocatorFor(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	var freed []Allocation
	var mu sync.Mutex
	cancel := OnFree(func(al Allocation) { mu.Lock(); freed = append(freed, al); mu.Unlock() })
	defer cancel()
	s0 := a.Stats()
	b1, err := a.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	al := b1.Allocation()
	if al.Size != 4<<20 || al.Base != b1.Ptr() || b1.Len() != 3<<20 || b1.Host() != nil || al.Device != CUDA(0) {
		t.Errorf("buffer %d bytes, allocation %+v", b1.Len(), al)
	}
	if err := b1.Free(); err != nil {
		t.Fatal(err)
	}
	b2, err := a.Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b2.Allocation() != al {
		t.Errorf("reuse got allocation %+v, want the cached %+v (stable ID)", b2.Allocation(), al)
	}
	s1 := a.Stats()
	if s1.Allocs-s0.Allocs != 2 || s1.Hits-s0.Hits != 1 || s1.DriverAllocs-s0.DriverAllocs != 1 {
		t.Errorf("stats %+v after %+v", s1, s0)
	}
	b2.Free()
	if got := a.Stats().BytesCached; got != 4<<20 {
		t.Errorf("BytesCached = %d", got)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	s2 := a.Stats()
	if s2.BytesCached != 0 || s2.DriverFrees-s1.DriverFrees != 1 || len(freed) != 1 || freed[0] != al {
		t.Errorf("after Trim: %+v, OnFree saw %v", s2, freed)
	}
	// The default budget: an eighth of the device, at least 1 GiB.
	total, err := cuda.TotalMem(0)
	if err != nil {
		t.Fatal(err)
	}
	budget := a.CacheBytes()
	if budget != max(DefaultCUDACacheBytes, total/8) {
		t.Errorf("default cache budget %d bytes on a device of %d", budget, total)
	}
	// Budget: with room for one 2 MiB block only, the older goes back.
	if err := a.SetCacheBytes(2 << 20); err != nil {
		t.Fatal(err)
	}
	defer a.SetCacheBytes(budget)
	x, _ := a.Alloc(2 << 20)
	y, _ := a.Alloc(2 << 20)
	xa := x.Allocation()
	x.Free()
	y.Free()
	st := a.Stats()
	if st.BytesCached != 2<<20 || st.BlocksCached != 1 || len(freed) != 2 || freed[1] != xa {
		t.Errorf("over budget: %+v, OnFree saw %v", st, freed)
	}
	if err := b2.Free(); !errors.Is(err, ErrFreed) {
		t.Errorf("double Free = %v", err)
	}
	a.Trim()
}

// poison fills a device buffer with a byte pattern.
func poison(t *testing.T, b Buffer, v byte) {
	t.Helper()
	if err := Fill(context.Background(), b, v); err != nil {
		t.Fatal(err)
	}
}

func TestGPUCopyAllPairs(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	devs := []Device{CUDA(0)}
	if n, _ := cuda.DeviceCount(); n > 1 {
		devs = append(devs, CUDA(1))
	}
	alloc := func(dev Device, n int) Buffer {
		a, err := AllocatorFor(dev)
		if err != nil {
			t.Fatal(err)
		}
		b, err := a.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		return b
	}
	for _, n := range []int{1, 4097, 3<<20 + 5, copyChunk + 12345} {
		src := randomBytes(n, uint64(n))
		kinds := append([]Device{CPU, Pinned}, devs...)
		for _, from := range kinds {
			for _, to := range kinds {
				if from.IsHost() && to.IsHost() {
					continue
				}
				// host source -> from -> to -> host check; the destination of
				// the pair under test is poisoned first.
				a, b := alloc(from, n), alloc(to, n+16)
				if from.IsHost() {
					copy(a.Host(), src)
				} else if err := Copy(ctx, a, WrapHost(src)); err != nil {
					t.Fatalf("%d bytes host -> %s: %v", n, from, err)
				}
				if to.IsHost() {
					h := b.Host()
					for i := range h {
						h[i] = 0xEE
					}
				} else {
					poison(t, b, 0xEE)
				}
				if err := Copy(ctx, b, a); err != nil {
					t.Fatalf("%d bytes %s -> %s: %v", n, from, to, err)
				}
				got := make([]byte, n+16)
				if to.IsHost() {
					copy(got, b.Host())
				} else if err := Copy(ctx, WrapHost(got), b); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[:n], src) || !bytes.Equal(got[n:], bytes.Repeat([]byte{0xEE}, 16)) {
					t.Fatalf("%d bytes %s -> %s: data differs", n, from, to)
				}
			}
		}
	}
	// Views at offsets.
	d, h := alloc(CUDA(0), 1<<20), randomBytes(1<<20, 5)
	if err := Copy(ctx, d, WrapHost(h)); err != nil {
		t.Fatal(err)
	}
	v, _ := d.Slice(1000, 5000)
	got := make([]byte, 5000)
	if err := Copy(ctx, WrapHost(got), v); err != nil || !bytes.Equal(got, h[1000:6000]) {
		t.Fatalf("copy from a view: %v", err)
	}
	// Cancelled context, freed buffer, short destination.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Copy(cctx, d, WrapHost(h)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled copy: %v", err)
	}
	f := alloc(CUDA(0), 64)
	f.Free()
	if err := Copy(ctx, f, WrapHost(make([]byte, 64))); !errors.Is(err, ErrFreed) {
		t.Errorf("copy to a freed buffer: %v", err)
	}
	if err := Copy(ctx, v, d); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("copy into a short buffer: %v", err)
	}
}

func TestGPUStreamPipeline(t *testing.T) {
	needGPU(t)
	dev := CUDA(0)
	s1, err := NewStream(dev)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := NewStream(dev)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := NewEvent(dev)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); err != nil || !done {
		t.Errorf("unrecorded event: %v, %v", done, err)
	}
	ca, _ := AllocatorFor(dev)
	pa, err := AllocatorFor(Pinned)
	if err != nil {
		t.Fatal(err)
	}
	const n = 32 << 20
	src := randomBytes(n, 77)
	pin1, _ := pa.Alloc(n)
	pin2, _ := pa.Alloc(n)
	d1, _ := ca.Alloc(n)
	d2, _ := ca.Alloc(n)
	defer func() {
		for _, b := range []Buffer{pin1, pin2, d1, d2} {
			b.Free()
		}
	}()
	copy(pin1.Host(), src)
	// s1: H2D then D2D; s2 waits for that, then D2H; pageable D2H at the end.
	if err := s1.CopyAsync(d1, pin1); err != nil {
		t.Fatal(err)
	}
	if err := s1.CopyAsync(d2, d1); err != nil {
		t.Fatal(err)
	}
	if err := s1.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := s2.Wait(ev); err != nil {
		t.Fatal(err)
	}
	if err := s2.CopyAsync(pin2, d2); err != nil {
		t.Fatal(err)
	}
	if err := s2.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); err != nil || !done {
		t.Errorf("event after the waiting stream finished: %v, %v", done, err)
	}
	if err := ev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pin2.Host(), src) {
		t.Fatal("pipelined copy differs")
	}
	page := make([]byte, n)
	if err := s2.CopyAsync(WrapHost(page), d2); err != nil || !bytes.Equal(page, src) {
		t.Fatalf("pageable CopyAsync: %v", err)
	}
	if err := s1.CopyAsync(d1, WrapHost(make([]byte, n+1))); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("CopyAsync into a short buffer: %v", err)
	}
	if count, _ := cuda.DeviceCount(); count > 1 {
		// A stream of cuda:0 pulls from cuda:1 (peer copy).
		ca1, _ := AllocatorFor(CUDA(1))
		r, _ := ca1.Alloc(n)
		defer r.Free()
		if err := s1.CopyAsync(r, d2); err != nil {
			t.Fatal(err)
		}
		poison(t, d1, 0)
		if err := s1.CopyAsync(d1, r); err != nil {
			t.Fatal(err)
		}
		clear(page)
		if err := s1.CopyAsync(WrapHost(page), d1); err != nil || !bytes.Equal(page, src) {
			t.Fatalf("peer copies on a stream: %v", err)
		}
		other, _ := NewStream(CUDA(1))
		defer other.Close()
		if err := other.CopyAsync(d1, d2); err == nil {
			t.Error("a cuda:1 stream copied between two cuda:0 buffers")
		}
	}
	for _, c := range []func() error{s1.Close, s2.Close, ev.Close} {
		if err := c(); err != nil {
			t.Error(err)
		}
	}
	if err := s1.CopyAsync(d1, pin1); !errors.Is(err, ErrClosed) {
		t.Errorf("CopyAsync after Close: %v", err)
	}
	if _, err := ev.Query(); !errors.Is(err, ErrClosed) {
		t.Errorf("Query after Close: %v", err)
	}
}
