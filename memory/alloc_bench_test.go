package memory

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkReceiveAlloc measures what a receiver pays per message for the
// destination of a tensor it frees after use: allocate, fill (the fetch's
// copy, which also faults host pages in), free. "fresh" asks the OS or the
// driver every time (NewHostBuffer; the CUDA allocator with a cache budget
// of 0: cuMemAlloc and cuMemFree, which synchronizes the device); "cached"
// is the receive path's (AllocUninit: the host cache, the CUDA allocator's
// size-class cache); "reused" fills one destination the receiver keeps
// (tensor.Ref.FetchInto, transfer.Destinations): the floor. The CUDA cases
// skip without a GPU.
func BenchmarkReceiveAlloc(b *testing.B) {
	for _, n := range []int{16 << 20, 256 << 20} {
		src, err := NewHostBuffer(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("host/%dMiB/fresh", n>>20), func(b *testing.B) {
			benchReceive(b, n, src, func() (Buffer, error) { return NewHostBuffer(n) })
		})
		b.Run(fmt.Sprintf("host/%dMiB/cached", n>>20), func(b *testing.B) {
			benchReceive(b, n, src, func() (Buffer, error) { return AllocUninit(CPU, n) })
		})
		b.Run(fmt.Sprintf("host/%dMiB/reused", n>>20), func(b *testing.B) {
			benchReused(b, n, src, CPU)
		})
		b.Run(fmt.Sprintf("cuda/%dMiB/fresh", n>>20), func(b *testing.B) {
			a := cudaOrSkip(b)
			budget := a.CacheBytes()
			if err := a.SetCacheBytes(0); err != nil {
				b.Fatal(err)
			}
			defer a.SetCacheBytes(budget)
			dsrc := deviceSource(b, n)
			benchReceive(b, n, dsrc, func() (Buffer, error) { return a.Alloc(n) })
		})
		b.Run(fmt.Sprintf("cuda/%dMiB/cached", n>>20), func(b *testing.B) {
			cudaOrSkip(b)
			benchReceive(b, n, deviceSource(b, n), func() (Buffer, error) { return AllocUninit(CUDA(0), n) })
		})
		b.Run(fmt.Sprintf("cuda/%dMiB/reused", n>>20), func(b *testing.B) {
			cudaOrSkip(b)
			benchReused(b, n, deviceSource(b, n), CUDA(0))
		})
		_ = src.Free()
	}
}

func cudaOrSkip(b *testing.B) *CUDAAllocator {
	a, err := CUDAAllocatorFor(CUDA(0))
	if err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	return a
}

// deviceSource is n bytes on cuda:0, the source of the fills: a fetch
// over ipc copies device to device.
func deviceSource(b *testing.B, n int) Buffer {
	buf, err := AllocUninit(CUDA(0), n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = buf.Free() })
	return buf
}

// benchReceive allocates, fills from src and frees a destination per
// iteration.
func benchReceive(b *testing.B, n int, src Buffer, alloc func() (Buffer, error)) {
	ctx := context.Background()
	b.SetBytes(int64(n))
	for b.Loop() {
		dst, err := alloc()
		if err != nil {
			b.Fatal(err)
		}
		if err := Copy(ctx, dst, src); err != nil {
			b.Fatal(err)
		}
		if err := dst.Free(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReused fills one destination on dev from src per iteration.
func benchReused(b *testing.B, n int, src Buffer, dev Device) {
	ctx := context.Background()
	dst, err := AllocUninit(dev, n)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Free()
	b.SetBytes(int64(n))
	for b.Loop() {
		if err := Copy(ctx, dst, src); err != nil {
			b.Fatal(err)
		}
	}
}
