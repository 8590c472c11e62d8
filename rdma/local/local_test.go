package local_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/local"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
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

func TestLocalRefusesOthersAndClosed(t *testing.T) {
	store := tensor.NewStore("node", 1)
	defer store.Close()
	ch, err := local.New(&rdma.Env{Node: "node", Incarnation: 1, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{8})
	_, d, _ := store.Export(x, "node", 0)
	dst, _ := memory.NewHostBuffer(8)
	other := *d
	other.Owner = "elsewhere"
	if err := ch.Fetch(context.Background(), &other, dst); !errors.Is(err, local.ErrNotLocal) {
		t.Errorf("another node's descriptor: %v", err)
	}
	bad := *d
	bad.Bytes = 9
	if err := ch.Fetch(context.Background(), &bad, dst); !errors.Is(err, tensor.ErrBadDescriptor) {
		t.Errorf("invalid descriptor: %v", err)
	}
	if _, err := local.New(&rdma.Env{Node: "node"}); err == nil {
		t.Error("New without a Store succeeded")
	}
	ch.PeerDown("elsewhere")
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Fetch(context.Background(), d, dst); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Fetch after Close: %v", err)
	}
	if ch.InFlight() != 0 {
		t.Errorf("%d in flight", ch.InFlight())
	}
}
