package local_test

import (
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/local"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newChannel(env *rdma.Env) (rdma.Channel, error) { return local.New(env) }

func TestConformanceHost(t *testing.T) {
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.SameNodePair(t, newChannel, memory.CPU, memory.CPU)
	})
}

func TestConformanceGPU(t *testing.T) {
	for _, dev := range []memory.Device{memory.CUDA(0), memory.CUDA(1)} {
		if _, err := memory.AllocatorFor(dev); err != nil {
			t.Skipf("no %s here: %v", dev, err)
		}
	}
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.SameNodePair(t, newChannel, memory.CUDA(0), memory.CUDA(1))
	})
}
