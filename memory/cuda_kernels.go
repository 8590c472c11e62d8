package memory

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
	"github.com/tensorferry/tensorferry/memory/kernels"
)

// The float32 vector operations below run on the device the buffers live on:
// the PTX kernels of package kernels on a CUDA device, plain Go loops on host
// and pinned memory. Every buffer of one call must be on the same device,
// have the same length, a multiple of 4 bytes, and be 4-byte aligned. CUDA
// work is complete when the call returns.

// Axpy computes y += a*x element-wise over float32 vectors.
func Axpy(ctx context.Context, a float32, x, y Buffer) error {
	return vectorOp(ctx, kernels.Axpy, []Buffer{y, x}, a, func(v [][]float32) {
		yv, xv := v[0], v[1]
		for i := range yv {
			yv[i] = float32(math.FMA(float64(a), float64(xv[i]), float64(yv[i])))
		}
	})
}

// Scale computes x *= a element-wise.
func Scale(ctx context.Context, a float32, x Buffer) error {
	return vectorOp(ctx, kernels.Scale, []Buffer{x}, a, func(v [][]float32) {
		for i := range v[0] {
			v[0][i] *= a
		}
	})
}

// Add computes z = x + y element-wise (z may be x or y).
func Add(ctx context.Context, z, x, y Buffer) error {
	return vectorOp(ctx, kernels.Add, []Buffer{z, x, y}, 0, func(v [][]float32) {
		zv, xv, yv := v[0], v[1], v[2]
		for i := range zv {
			zv[i] = xv[i] + yv[i]
		}
	})
}

// SGD applies one plain stochastic gradient descent step: w -= lr*g.
func SGD(ctx context.Context, w, g Buffer, lr float32) error {
	return vectorOp(ctx, kernels.SGD, []Buffer{w, g}, lr, func(v [][]float32) {
		wv, gv := v[0], v[1]
		for i := range wv {
			wv[i] = float32(math.FMA(-float64(lr), float64(gv[i]), float64(wv[i])))
		}
	})
}

// vectorOp checks the buffers and runs the kernel named name (arguments: the
// buffers, then scalar unless the kernel is Add, then n) or the host loop.
func vectorOp(ctx context.Context, name string, bufs []Buffer, scalar float32, host func([][]float32)) error {
	dev, n := bufs[0].Device(), bufs[0].Len()
	for _, b := range bufs {
		switch {
		case b.Device() != dev && !(b.Device().IsHost() && dev.IsHost()):
			return fmt.Errorf("memory: %s: buffers on %s and %s", name, dev, b.Device())
		case b.Len() != n:
			return fmt.Errorf("memory: %s: buffer lengths %d and %d differ", name, n, b.Len())
		case n%4 != 0 || b.Ptr()%4 != 0:
			return fmt.Errorf("memory: %s: %d bytes at %#x is not a float32 vector", name, b.Len(), b.Ptr())
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if dev.IsHost() {
		vs := make([][]float32, len(bufs))
		for i, b := range bufs {
			h := b.Host()
			if h == nil {
				return ErrFreed
			}
			if n > 0 {
				vs[i] = unsafe.Slice((*float32)(unsafe.Pointer(&h[0])), n/4)
			}
		}
		host(vs)
		return nil
	}
	if n == 0 {
		return nil
	}
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return err
	}
	f, err := d.kernel(name)
	if err != nil {
		return err
	}
	args := make([]cuda.KernelArg, 0, 5)
	for _, b := range bufs {
		p, err := devicePtr(b)
		if err != nil {
			return err
		}
		args = append(args, cuda.ArgPtr(p))
	}
	if name != kernels.Add {
		args = append(args, cuda.ArgFloat32(scalar))
	}
	elems := uint64(n / 4)
	args = append(args, cuda.ArgUint64(elems))
	const block = 256
	grid := min((elems+block-1)/block, 1<<16)
	return d.run(ctx, 1, func(s *cuda.Stream, _, _ int) error {
		return d.ctx.LaunchKernel(f, cuda.Dim3{X: uint32(grid), Y: 1, Z: 1}, cuda.Dim3{X: block, Y: 1, Z: 1}, 0, s, args...)
	})
}

// kernelModules holds the loaded kernel module of each device.
var kernelModules struct {
	mu   sync.Mutex
	mods map[int]*cuda.Module
	fns  map[[2]any]*cuda.Function
}

// kernel returns a kernel of package kernels on d, loading the module on
// first use (it stays loaded for the life of the process).
func (d *cudaDevice) kernel(name string) (*cuda.Function, error) {
	km := &kernelModules
	km.mu.Lock()
	defer km.mu.Unlock()
	if km.mods == nil {
		km.mods, km.fns = map[int]*cuda.Module{}, map[[2]any]*cuda.Function{}
	}
	key := [2]any{d.dev.Index, name}
	if f, ok := km.fns[key]; ok {
		return f, nil
	}
	m, ok := km.mods[d.dev.Index]
	if !ok {
		var err error
		if m, err = d.ctx.ModuleLoadData(kernels.PTX); err != nil {
			return nil, fmt.Errorf("memory: %s: loading kernels: %w", d.dev, err)
		}
		km.mods[d.dev.Index] = m
	}
	f, err := m.Function(name)
	if err != nil {
		return nil, fmt.Errorf("memory: %s: %w", d.dev, err)
	}
	km.fns[key] = f
	return f, nil
}
