package ipc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
)

// BenchmarkFetchTwoProcesses fetches one export repeatedly from an owner
// process on GPU0 into GPU1 (the mapping is opened by the first fetch; each
// iteration pays the begin and end round trips, which go through the
// harness's JSON pipes here, slower than a node's control connection).
func BenchmarkFetchTwoProcesses(b *testing.B) {
	n, err := memory.CUDADeviceCount()
	if err != nil || n == 0 {
		b.Skipf("no CUDA device here: %v", err)
	}
	od, fd := memory.CUDA(0), memory.CUDA(min(n-1, 1))
	for _, size := range []int{1 << 20, 64 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			p := rdmatest.ChildOwner(b, newChannel, od, fd)
			d := p.Export(b, 1, size)
			defer p.Release(b, d)
			a, err := memory.AllocatorFor(fd)
			if err != nil {
				b.Fatal(err)
			}
			dst, err := a.Alloc(size)
			if err != nil {
				b.Fatal(err)
			}
			defer dst.Free()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
