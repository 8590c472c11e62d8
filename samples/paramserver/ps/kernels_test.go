package ps

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
)

func hostVec(t *testing.T, vals []float32) memory.Buffer {
	t.Helper()
	b, err := memory.NewHostBuffer(4 * len(vals))
	if err != nil {
		t.Fatal(err)
	}
	copy(floats(b.Host()), vals)
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
	if err := axpy(ctx, 2, x, y); err != nil {
		t.Fatal(err)
	}
	if want := []float32{12, 24, 36, 48}; !slices.Equal(floats(y.Host()), want) {
		t.Fatalf("axpy: y = %v, want %v", floats(y.Host()), want)
	}
	if err := sgd(ctx, y, x, 0.25); err != nil {
		t.Fatal(err)
	}
	if want := []float32{11.75, 23.5, 35.25, 47}; !slices.Equal(floats(y.Host()), want) {
		t.Fatalf("sgd: w = %v, want %v", floats(y.Host()), want)
	}
	short := hostVec(t, []float32{1, 2, 3})
	if err := axpy(ctx, 1, short, y); err == nil {
		t.Error("axpy with different lengths succeeded")
	}
	odd := memory.WrapHost(make([]byte, 6))
	if err := sgd(ctx, odd, odd, 1); err == nil {
		t.Error("sgd of 6 bytes succeeded")
	}
	mis, _ := x.Slice(1, 8)
	mis2, _ := y.Slice(1, 8)
	if err := sgd(ctx, mis2, mis, 1); err == nil {
		t.Error("sgd of a misaligned view succeeded")
	}
	dev, _ := memory.WrapCUDA(memory.CUDA(0), 0x1000, 16, nil)
	if err := axpy(ctx, 1, x, dev); err == nil || !strings.Contains(err.Error(), "buffers on") {
		t.Errorf("axpy across devices: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := sgd(cctx, y, x, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("sgd with a cancelled context: %v", err)
	}
}

func TestKernelsPTX(t *testing.T) {
	for _, name := range []string{kernelAxpy, kernelSGD, kernelResidual, kernelScatter} {
		if !strings.Contains(string(kernelsPTX), ".visible .entry "+name+"(") {
			t.Errorf("kernels.ptx has no entry %q", name)
		}
	}
}

func TestGPUKernelsMatchHost(t *testing.T) {
	ctx := context.Background()
	ca, err := memory.AllocatorFor(memory.CUDA(0))
	if errors.Is(err, memory.ErrNotSupported) {
		t.Skipf("no CUDA device: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	const n = 1<<20 + 3 // not a multiple of the block size
	toDev := func(v []float32) memory.Buffer {
		d, err := ca.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free() })
		if err := memory.Copy(ctx, d, hostVec(t, v)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	check := func(what string, dev, host memory.Buffer) {
		t.Helper()
		got := hostVec(t, make([]float32, n))
		if err := memory.Copy(ctx, got, dev); err != nil {
			t.Fatal(err)
		}
		for i, w := range floats(host.Host()) {
			g := floats(got.Host())[i]
			if math.Abs(float64(g-w)) > 1e-6*math.Max(1, math.Abs(float64(w))) {
				t.Fatalf("%s: element %d = %v on the GPU, %v on the CPU", what, i, g, w)
			}
		}
	}
	xs, ys := randomFloats(n, 1), randomFloats(n, 2)
	hx, hy := hostVec(t, xs), hostVec(t, ys)
	dx, dy := toDev(xs), toDev(ys)
	for _, st := range []struct {
		name string
		run  func(x, y memory.Buffer) error
	}{
		{"axpy", func(x, y memory.Buffer) error { return axpy(ctx, 1.5, x, y) }},
		{"sgd", func(x, y memory.Buffer) error { return sgd(ctx, y, x, 0.01) }},
		{"axpy again", func(x, y memory.Buffer) error { return axpy(ctx, -0.75, y, x) }},
	} {
		if err := st.run(dx, dy); err != nil {
			t.Fatalf("%s on the GPU: %v", st.name, err)
		}
		if err := st.run(hx, hy); err != nil {
			t.Fatalf("%s on the CPU: %v", st.name, err)
		}
		check(st.name+" (x)", dx, hx)
		check(st.name+" (y)", dy, hy)
	}
	// A GPU buffer with a host one is refused before any launch.
	if err := axpy(ctx, 1, hx, dy); err == nil {
		t.Error("axpy of a host and a GPU buffer succeeded")
	}
}

// The worker's gradient on the GPU (kernels residual and scatter) matches
// the host's, and its loss too.
func TestGPUGradientMatchesHost(t *testing.T) {
	ctx := context.Background()
	if _, err := memory.AllocatorFor(memory.CUDA(0)); errors.Is(err, memory.ErrNotSupported) {
		t.Skipf("no CUDA device: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	c := Config{Dim: 100003, Workers: 1, Shards: 1, NonZeros: 8, Noise: 0.1, Seed: 9, Steps: 1, LR: 0.5}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d := generate(&c, 0, Truth(&c))
	hw := hostVec(t, randomFloats(c.Dim, 4))
	hg := hostVec(t, make([]float32, c.Dim))
	host, err := newGradData(ctx, d, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	wantLoss, err := host.gradient(ctx, hw, hg)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := newGradData(ctx, d, memory.CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.free()
	ca, _ := memory.AllocatorFor(memory.CUDA(0))
	dw, err := ca.Alloc(4 * c.Dim)
	if err != nil {
		t.Fatal(err)
	}
	defer dw.Free()
	dg, err := ca.Alloc(4 * c.Dim)
	if err != nil {
		t.Fatal(err)
	}
	defer dg.Free()
	if err := memory.Copy(ctx, dw, hw); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run starts from the first's g and loss: both are reset
		loss, err := gpu.gradient(ctx, dw, dg)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(loss-wantLoss) > 1e-3*wantLoss {
			t.Fatalf("loss %v on the GPU, %v on the CPU", loss, wantLoss)
		}
	}
	got := hostVec(t, make([]float32, c.Dim))
	if err := memory.Copy(ctx, got, dg); err != nil {
		t.Fatal(err)
	}
	var num, den float64
	for i, w := range floats(hg.Host()) {
		e := float64(floats(got.Host())[i] - w)
		num, den = num+e*e, den+float64(w)*float64(w)
	}
	if math.Sqrt(num/den) > 1e-4 {
		t.Fatalf("gradient on the GPU differs from the CPU's by %v (relative norm)", math.Sqrt(num/den))
	}
}

// ptxas refuses a module with a byte outside ASCII anywhere, comments
// included: the hand-written kernels.ptx must stay ASCII.
func TestKernelsPTXIsASCII(t *testing.T) {
	for i, b := range kernelsPTX {
		if b > 0x7f {
			t.Fatalf("kernels.ptx: byte %d is %#x, outside ASCII (ptxas fails on it)", i, b)
		}
	}
}
