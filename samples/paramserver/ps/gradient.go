package ps

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/tensorferry/tensorferry/memory"
)

// Kernels of the worker's gradient (kernels.ptx; kernels.cu has their C).
const (
	// (res *f32, loss *f32, w *f32, cols *i32, vals *f32, y *f32, k u64,
	// rows u64): res[r] = X[r]·w − y[r]; *loss += Σ res[r]².
	kernelResidual = "residual"
	// (g *f32, res *f32, cols *i32, vals *f32, scale f32, k u64, n u64):
	// g[cols[e]] += scale·res[e/k]·vals[e].
	kernelScatter = "scatter"
)

// gradData is a worker's data where its gradient is computed: host memory
// (the dataset itself) or a CUDA device (a copy of it made once, and the
// scratch of the kernels), so that a GPU worker's step touches the host
// only for the 4 bytes of its loss.
type gradData struct {
	d   *dataset
	dev memory.Device
	// CUDA only: the CSR matrix, labels, residuals and the loss.
	cols, vals, y, res, loss memory.Buffer
	lossHost                 memory.Buffer
}

// newGradData puts d on dev.
func newGradData(ctx context.Context, d *dataset, dev memory.Device) (*gradData, error) {
	g := &gradData{d: d, dev: dev}
	if dev.IsHost() {
		return g, nil
	}
	up := func(b []byte) (memory.Buffer, error) {
		buf, err := memory.AllocUninit(dev, len(b))
		if err != nil {
			return nil, err
		}
		if err := memory.Copy(ctx, buf, memory.WrapHost(b)); err != nil {
			_ = buf.Free()
			return nil, err
		}
		return buf, nil
	}
	var err error
	if g.cols, err = up(int32Bytes(d.cols)); err == nil {
		if g.vals, err = up(float32Bytes(d.vals)); err == nil {
			if g.y, err = up(float32Bytes(d.y)); err == nil {
				if g.res, err = memory.AllocUninit(dev, 4*len(d.y)); err == nil {
					if g.loss, err = memory.AllocUninit(dev, 4); err == nil {
						g.lossHost, err = memory.NewHostBuffer(4)
					}
				}
			}
		}
	}
	if err != nil {
		g.free()
		return nil, fmt.Errorf("ps: worker data on %s: %w", dev, err)
	}
	return g, nil
}

// gradient writes g = Xᵀ(X·w − y)/rows for the weights w and returns the
// loss ‖X·w − y‖²/(2·rows); w and g are float32[Dim] on the data's device.
func (gd *gradData) gradient(ctx context.Context, w, g memory.Buffer) (float64, error) {
	d := gd.d
	if w.Device() != gd.dev || g.Device() != gd.dev || w.Len() != g.Len() || w.Len()%4 != 0 {
		return 0, fmt.Errorf("ps: gradient of %d bytes on %s into %d bytes on %s, data on %s", w.Len(), w.Device(), g.Len(), g.Device(), gd.dev)
	}
	if gd.dev.IsHost() {
		wh, gh := w.Host(), g.Host()
		if wh == nil || gh == nil {
			return 0, memory.ErrFreed
		}
		return d.gradient(floats(wh), floats(gh)), nil
	}
	rows, k := len(d.y), d.nnz
	if err := memory.Fill(ctx, g, 0); err != nil {
		return 0, err
	}
	if err := memory.Fill(ctx, gd.loss, 0); err != nil {
		return 0, err
	}
	res, err := kernel(gd.dev, kernelResidual)
	if err != nil {
		return 0, err
	}
	err = res.Run(ctx, memory.Linear(rows, 0, 0),
		memory.BufferArg(gd.res), memory.BufferArg(gd.loss), memory.BufferArg(w), memory.BufferArg(gd.cols),
		memory.BufferArg(gd.vals), memory.BufferArg(gd.y), memory.Uint64Arg(uint64(k)), memory.Uint64Arg(uint64(rows)))
	if err != nil {
		return 0, err
	}
	sc, err := kernel(gd.dev, kernelScatter)
	if err != nil {
		return 0, err
	}
	err = sc.Run(ctx, memory.Linear(rows*k, 0, 0),
		memory.BufferArg(g), memory.BufferArg(gd.res), memory.BufferArg(gd.cols), memory.BufferArg(gd.vals),
		memory.Float32Arg(float32(1/float64(rows))), memory.Uint64Arg(uint64(k)), memory.Uint64Arg(uint64(rows*k)))
	if err != nil {
		return 0, err
	}
	if err := memory.Copy(ctx, gd.lossHost, gd.loss); err != nil {
		return 0, err
	}
	return float64(floats(gd.lossHost.Host())[0]) / float64(2*rows), nil
}

func (gd *gradData) free() {
	for _, b := range []memory.Buffer{gd.cols, gd.vals, gd.y, gd.res, gd.loss, gd.lossHost} {
		if b != nil {
			_ = b.Free()
		}
	}
	gd.cols, gd.vals, gd.y, gd.res, gd.loss, gd.lossHost = nil, nil, nil, nil, nil, nil
}

// float32Bytes and int32Bytes view this process's own slices as bytes.
func float32Bytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

func int32Bytes(v []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
