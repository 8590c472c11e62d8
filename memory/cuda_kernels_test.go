package memory

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/tensorferry/tensorferry/memory/kernels"
)

func floats(b Buffer) []float32 {
	h := b.Host()
	return unsafe.Slice((*float32)(unsafe.Pointer(&h[0])), len(h)/4)
}

func hostVec(t *testing.T, vals []float32) Buffer {
	t.Helper()
	b, err := NewHostBuffer(4 * len(vals))
	if err != nil {
		t.Fatal(err)
	}
	copy(floats(b), vals)
	return b
}

func randomFloats(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*200 - 100
	}
	return v
}

func TestHostVectorOps(t *testing.T) {
	ctx := context.Background()
	x := hostVec(t, []float32{1, 2, 3, 4})
	y := hostVec(t, []float32{10, 20, 30, 40})
	if err := Axpy(ctx, 2, x, y); err != nil {
		t.Fatal(err)
	}
	want := []float32{12, 24, 36, 48}
	for i, v := range floats(y) {
		if v != want[i] {
			t.Fatalf("Axpy: y = %v, want %v", floats(y), want)
		}
	}
	if err := Scale(ctx, 0.5, y); err != nil {
		t.Fatal(err)
	}
	if err := Add(ctx, y, y, x); err != nil {
		t.Fatal(err)
	}
	want = []float32{7, 14, 21, 28}
	for i, v := range floats(y) {
		if v != want[i] {
			t.Fatalf("Scale+Add: y = %v, want %v", floats(y), want)
		}
	}
	if err := SGD(ctx, y, x, 0.25); err != nil {
		t.Fatal(err)
	}
	want = []float32{6.75, 13.5, 20.25, 27}
	for i, v := range floats(y) {
		if v != want[i] {
			t.Fatalf("SGD: w = %v, want %v", floats(y), want)
		}
	}
	short := hostVec(t, []float32{1, 2, 3})
	if err := Axpy(ctx, 1, short, y); err == nil {
		t.Error("Axpy with different lengths succeeded")
	}
	odd := WrapHost(make([]byte, 6))
	if err := Scale(ctx, 1, odd); err == nil {
		t.Error("Scale of 6 bytes succeeded")
	}
	mis, _ := x.Slice(1, 8)
	if err := Scale(ctx, 1, mis); err == nil {
		t.Error("Scale of a misaligned view succeeded")
	}
	dev, _ := WrapCUDA(CUDA(0), 0x1000, 16, nil)
	if err := Axpy(ctx, 1, x, dev); err == nil {
		t.Error("Axpy across devices succeeded")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Scale(cctx, 1, x); err != context.Canceled {
		t.Errorf("Scale with a cancelled context: %v", err)
	}
	x.Free()
	if err := Scale(ctx, 1, x); err != ErrFreed {
		t.Errorf("Scale of a freed buffer: %v", err)
	}
}

func TestKernelsPTXEmbedded(t *testing.T) {
	for _, name := range kernels.Names {
		if !containsEntry(kernels.PTX, name) {
			t.Errorf("kernels.PTX has no entry %q", name)
		}
	}
}

func containsEntry(ptx, name string) bool {
	want := ".visible .entry " + name + "("
	for i := 0; i+len(want) <= len(ptx); i++ {
		if ptx[i:i+len(want)] == want {
			return true
		}
	}
	return false
}

func TestGPUKernelsMatchHost(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	ca, _ := AllocatorFor(CUDA(0))
	const n = 1<<20 + 3 // not a multiple of the block size
	toDev := func(v []float32) Buffer {
		h := hostVec(t, v)
		d, err := ca.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		if err := Copy(ctx, d, h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free() })
		return d
	}
	check := func(what string, dev, host Buffer) {
		t.Helper()
		got := hostVec(t, make([]float32, n))
		if err := Copy(ctx, got, dev); err != nil {
			t.Fatal(err)
		}
		for i, w := range floats(host) {
			g := floats(got)[i]
			if math.Abs(float64(g-w)) > 1e-6*math.Max(1, math.Abs(float64(w))) {
				t.Fatalf("%s: element %d = %v on the GPU, %v on the CPU", what, i, g, w)
			}
		}
	}
	xs, ys := randomFloats(n, 1), randomFloats(n, 2)
	hx, hy, hz := hostVec(t, xs), hostVec(t, ys), hostVec(t, make([]float32, n))
	dx, dy, dz := toDev(xs), toDev(ys), toDev(make([]float32, n))

	steps := []struct {
		name string
		run  func(x, y, z Buffer) error
		out  func(x, y, z Buffer) Buffer
	}{
		{"axpy", func(x, y, z Buffer) error { return Axpy(ctx, 1.5, x, y) }, func(x, y, z Buffer) Buffer { return y }},
		{"scale", func(x, y, z Buffer) error { return Scale(ctx, -0.75, x) }, func(x, y, z Buffer) Buffer { return x }},
		{"add", func(x, y, z Buffer) error { return Add(ctx, z, x, y) }, func(x, y, z Buffer) Buffer { return z }},
		{"sgd", func(x, y, z Buffer) error { return SGD(ctx, z, y, 0.01) }, func(x, y, z Buffer) Buffer { return z }},
	}
	for _, st := range steps {
		if err := st.run(dx, dy, dz); err != nil {
			t.Fatalf("%s on the GPU: %v", st.name, err)
		}
		if err := st.run(hx, hy, hz); err != nil {
			t.Fatalf("%s on the CPU: %v", st.name, err)
		}
		check(st.name, st.out(dx, dy, dz), st.out(hx, hy, hz))
	}
}
