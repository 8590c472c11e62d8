package memory

import (
	"context"
	"testing"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// BenchmarkCopy measures Copy between host kinds and cuda:0 (pinned vs
// pageable, the figures DESIGN.md quotes) and device to device.
func BenchmarkCopy(b *testing.B) {
	if _, err := cudaDeviceFor(CUDA(0)); err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	const n = 256 << 20
	ctx := context.Background()
	mk := func(dev Device) Buffer {
		a, err := AllocatorFor(dev)
		if err != nil {
			b.Fatal(err)
		}
		buf, err := a.Alloc(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { buf.Free() })
		return buf
	}
	host, pinned, d0, d1 := mk(CPU), mk(Pinned), mk(CUDA(0)), mk(CUDA(0))
	cases := []struct {
		name     string
		dst, src Buffer
	}{
		{"H2D-pageable", d0, host},
		{"H2D-pinned", d0, pinned},
		{"D2H-pageable", host, d0},
		{"D2H-pinned", pinned, d0},
		{"D2D", d1, d0},
	}
	if n, _ := cuda.DeviceCount(); n > 1 {
		cases = append(cases, struct {
			name     string
			dst, src Buffer
		}{"D2D-peer", mk(CUDA(1)), d0})
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			// Warm up: peer access is enabled by the first peer copy.
			if err := Copy(ctx, c.dst, c.src); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n)
			for b.Loop() {
				if err := Copy(ctx, c.dst, c.src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRegCacheHit measures a cached Get and release.
func BenchmarkRegCacheHit(b *testing.B) {
	c := NewRegCache("bench", newFake(), RegBudget{})
	defer c.Close()
	a := alloc(1 << 20)
	for b.Loop() {
		_, rel, err := c.Get(a, "")
		if err != nil {
			b.Fatal(err)
		}
		rel()
	}
}
