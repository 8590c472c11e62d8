package verbs

import (
	"context"
	"fmt"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
)

// BenchmarkFetch measures repeated fetches of one export between two
// channels of this process (host memory, registration cache warm). Under
// soft-RoCE in the VM the figure means little; on a NIC compare it with
// ib_read_bw.
func BenchmarkFetch(b *testing.B) {
	if err := Available(); err != nil {
		b.Skipf("verbs channel not viable here: %v", err)
	}
	for _, n := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := rdmatest.InProcessPair(b, newChannel, memory.CPU, memory.CPU)
			d := p.Export(b, 1, n)
			dst, err := memory.NewHostBuffer(n)
			if err != nil {
				b.Fatal(err)
			}
			defer dst.Free()
			ctx := context.Background()
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := p.Release(b, d); err != nil {
				b.Fatal(err)
			}
		})
	}
}
