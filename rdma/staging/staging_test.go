package staging_test

import (
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newChannel(env *rdma.Env) (rdma.Channel, error) { return staging.New(env) }

func TestConformanceHost(t *testing.T) {
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.InProcessPair(t, newChannel, memory.CPU, memory.CPU)
	})
}

func TestHelperOwner(t *testing.T) { rdmatest.RunChildOwner(t, newChannel) }

func TestConformanceCrossProcessHost(t *testing.T) {
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.ChildOwner(t, newChannel, memory.CPU, memory.CPU)
	})
}

// gpus skips the test unless every device in devs can be allocated here.
func gpus(t *testing.T, devs ...memory.Device) {
	t.Helper()
	for _, dev := range devs {
		a, err := memory.AllocatorFor(dev)
		if err == nil {
			var b memory.Buffer
			if b, err = a.Alloc(1); err == nil {
				_ = b.Free()
			}
		}
		if err != nil {
			t.Skipf("needs %s: %v", dev, err)
		}
	}
}

func TestConformanceGPU(t *testing.T) {
	for _, tc := range []struct{ owner, fetcher memory.Device }{
		{memory.CUDA(0), memory.CPU},
		{memory.CPU, memory.CUDA(0)},
		{memory.CUDA(0), memory.CUDA(0)},
		{memory.Pinned, memory.Pinned},
	} {
		t.Run(tc.owner.String()+"->"+tc.fetcher.String(), func(t *testing.T) {
			gpus(t, tc.owner, tc.fetcher)
			rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
				return rdmatest.InProcessPair(t, newChannel, tc.owner, tc.fetcher)
			})
		})
	}
}

// TestConformanceGPUCrossProcess runs the suite with the owner process on
// cuda:0 and this process fetching into cuda:1.
func TestConformanceGPUCrossProcess(t *testing.T) {
	gpus(t, memory.CUDA(0), memory.CUDA(1))
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.ChildOwner(t, newChannel, memory.CUDA(0), memory.CUDA(1))
	})
}

// TestConformanceGPUCrossProcessOneGPU runs the suite between two processes
// sharing cuda:0 (for one-GPU machines).
func TestConformanceGPUCrossProcessOneGPU(t *testing.T) {
	gpus(t, memory.CUDA(0))
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.ChildOwner(t, newChannel, memory.CUDA(0), memory.CUDA(0))
	})
}
