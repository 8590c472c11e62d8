package ps

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/tensorferry/tensorferry/memory"
)

// The shards' float32 vector math runs on the device the buffers live on:
// the kernels of kernels.ptx on a CUDA device (loaded with memory.LoadModule
// and launched with memory.Function.Run), plain Go loops on host and pinned
// memory. Every buffer of one call must be on the same device, have the
// same length, a multiple of 4 bytes, and be 4-byte aligned. CUDA work is
// complete when the call returns.
//
// kernels.ptx was written by hand (no nvcc on the development machine): each
// kernel is the PTX nvcc emits for the grid-stride loop of kernels.cu, in the
// same shape (parameter loads, cvta.to.global of the pointers, the index from
// mad.wide.u32, a 64-bit counter compared with setp.ge.u64). PTX .version
// 7.0 / .target sm_70 is JIT-compiled by the driver for Volta and every later
// GPU (tested on an H100, sm_90). The host loops compute the same
// expressions (a fused multiply-add, math.FMA rounded to float32), so GPU
// and CPU results agree to within a rounding step; TestGPUKernelsMatchHost
// compares them with a relative tolerance of 1e-6.

//go:embed kernels.ptx
var kernelsPTX []byte

// Kernel entry names in kernels.ptx and their parameters, in order. n is
// the number of float32 elements; pointers are device pointers.
const (
	kernelAxpy = "axpy" // (y *f32, x *f32, a f32, n u64): y[i] += a*x[i]
	kernelSGD  = "sgd"  // (w *f32, g *f32, lr f32, n u64): w[i] -= lr*g[i]
)

// axpy computes y += a*x element-wise over float32 vectors.
func axpy(ctx context.Context, a float32, x, y memory.Buffer) error {
	return vectorOp(ctx, kernelAxpy, y, x, a, func(yv, xv []float32) {
		for i := range yv {
			yv[i] = float32(math.FMA(float64(a), float64(xv[i]), float64(yv[i])))
		}
	})
}

// sgd applies one plain stochastic gradient descent step: w -= lr*g.
func sgd(ctx context.Context, w, g memory.Buffer, lr float32) error {
	return vectorOp(ctx, kernelSGD, w, g, lr, func(wv, gv []float32) {
		for i := range wv {
			wv[i] = float32(math.FMA(-float64(lr), float64(gv[i]), float64(wv[i])))
		}
	})
}

// vectorOp checks the buffers and runs the kernel called name (arguments:
// dst, src, scalar, n) or the host loop.
func vectorOp(ctx context.Context, name string, dst, src memory.Buffer, scalar float32, host func(dst, src []float32)) error {
	dev, n := dst.Device(), dst.Len()
	for _, b := range []memory.Buffer{dst, src} {
		switch {
		case b.Device() != dev && !(b.Device().IsHost() && dev.IsHost()):
			return fmt.Errorf("ps: %s: buffers on %s and %s", name, dev, b.Device())
		case b.Len() != n:
			return fmt.Errorf("ps: %s: buffer lengths %d and %d differ", name, n, b.Len())
		case n%4 != 0 || b.Ptr()%4 != 0:
			return fmt.Errorf("ps: %s: %d bytes at %#x is not a float32 vector", name, b.Len(), b.Ptr())
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if dev.IsHost() {
		d, s := dst.Host(), src.Host()
		if d == nil || s == nil {
			return memory.ErrFreed
		}
		host(floats(d), floats(s))
		return nil
	}
	f, err := kernel(dev, name)
	if err != nil {
		return err
	}
	elems := n / 4
	return f.Run(ctx, memory.Linear(elems, 0, 0),
		memory.BufferArg(dst), memory.BufferArg(src), memory.Float32Arg(scalar), memory.Uint64Arg(uint64(elems)))
}

// floats views 4-byte aligned host bytes as float32s (host memory of this
// process, never bytes off the network).
func floats(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// modules holds kernels.ptx loaded on each device; a module stays loaded for
// the life of the process.
var modules struct {
	mu sync.Mutex
	m  map[memory.Device]*memory.Module
}

// kernel returns a kernel of kernels.ptx on dev, loading the module on first
// use.
func kernel(dev memory.Device, name string) (*memory.Function, error) {
	modules.mu.Lock()
	defer modules.mu.Unlock()
	m, ok := modules.m[dev]
	if !ok {
		var err error
		if m, err = memory.LoadModule(dev, kernelsPTX); err != nil {
			return nil, fmt.Errorf("ps: loading the kernels: %w", err)
		}
		if modules.m == nil {
			modules.m = map[memory.Device]*memory.Module{}
		}
		modules.m[dev] = m
	}
	return m.Function(name)
}
