package memory

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

func TestHostRegistrarWithoutDevice(t *testing.T) {
	if _, err := cudaDeviceFor(CUDA(0)); err == nil {
		t.Skip("a CUDA device is present")
	}
	if _, err := NewHostRegistrar(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewHostRegistrar = %v, want ErrNotSupported", err)
	}
}

func TestGPUHostRegistrar(t *testing.T) {
	needGPU(t)
	hr, err := NewHostRegistrar()
	if err != nil {
		t.Fatal(err)
	}
	c := NewRegCache("t-gpu-host", hr, RegBudget{Bytes: 1 << 30})
	defer c.Close()
	const n = 256 << 20
	buf, err := NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, rel, err := c.Get(buf.Allocation(), "")
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(t0)
	rel()
	t1 := time.Now()
	_, rel, err = c.Get(buf.Allocation(), "")
	if err != nil {
		t.Fatal(err)
	}
	second := time.Since(t1)
	st := c.Stats()
	t.Logf("register 256 MiB: %v; cached Get: %v; stats %+v", first, second, st)
	if st.Hits != 1 || st.Misses != 1 {
		t.Errorf("stats %+v, want 1 hit and 1 miss", st)
	}
	if second*10 > first {
		t.Errorf("cached Get took %v, registration %v: paid twice?", second, first)
	}
	// Registered memory copies correctly (and fast) while held.
	ca, _ := AllocatorFor(CUDA(0))
	d, _ := ca.Alloc(n)
	defer d.Free()
	src := randomBytes(n, 42)
	copy(buf.Host(), src)
	ctx := context.Background()
	t2 := time.Now()
	if err := Copy(ctx, d, buf); err != nil {
		t.Fatal(err)
	}
	h2d := time.Since(t2)
	clear(buf.Host())
	if err := Copy(ctx, buf, d); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Host(), src) {
		t.Fatal("round trip through registered memory differs")
	}
	t.Logf("H2D 256 MiB from registered memory: %v (%.1f GB/s)", h2d, n/h2d.Seconds()/1e9)
	rel()
	// Freeing the buffer unregisters it.
	if err := buf.Free(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Registered != 0 || st.Invalidations != 1 || st.UnregisterErrors != 0 {
		t.Errorf("after Free: %+v", st)
	}
	// Pinned memory needs no registration.
	pa, _ := AllocatorFor(Pinned)
	p, _ := pa.Alloc(4096)
	defer p.Free()
	if _, rel, err := c.Get(p.Allocation(), ""); err != nil {
		t.Error(err)
	} else {
		rel()
	}
	// Device memory is refused.
	if _, _, err := c.Get(d.Allocation(), ""); err == nil {
		t.Error("registering device memory as host memory succeeded")
	}
}
