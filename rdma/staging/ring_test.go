package staging

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestRingOnGPUNode (needs CUDA): a ring serving a GPU has its pages on
// the GPU's NUMA node, its slots are views of one allocation, and it is
// kept for the same device and a smaller request.
func TestRingOnGPUNode(t *testing.T) {
	if _, err := memory.PinnedAllocatorFor(); errors.Is(err, memory.ErrNotSupported) {
		t.Skipf("no CUDA: %v", err)
	}
	dev := memory.CUDA(0)
	node := memory.DeviceNUMANode(dev)
	var r *pinnedRing
	pr, err := ring(&r, dev, 1<<20, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer r.free()
	if pr.node != node || len(pr.slots) != 4 || pr.mem.Len() != 4<<20 {
		t.Fatalf("ring node %d (GPU's %d), %d slots, %d bytes", pr.node, node, len(pr.slots), pr.mem.Len())
	}
	for i, s := range pr.slots {
		if s.Len() != 1<<20 || s.Ptr() != pr.mem.Ptr()+uintptr(i<<20) {
			t.Errorf("slot %d: %d bytes at %#x", i, s.Len(), s.Ptr())
		}
	}
	if node < 0 {
		t.Logf("the GPU's NUMA node is unknown here: the ring is not bound")
	} else {
		nodes, err := memory.PageNodes(pr.mem.Host())
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range nodes {
			if n != node {
				t.Fatalf("page %d of the ring on node %d, want the GPU's %d", i, n, node)
			}
		}
	}
	again, err := ring(&r, dev, 1<<19, 2)
	if err != nil || again != pr {
		t.Errorf("a smaller request on the same device replaced the ring (%v)", err)
	}
}

// TestDialCutByDeadline: a dial that the fetch's deadline cuts short,
// which net reports as an i/o timeout, fails with an error that is
// context.DeadlineExceeded too.
func TestDialCutByDeadline(t *testing.T) {
	c, err := New(&rdma.Env{Node: "fetcher", Incarnation: 1, Store: tensor.NewStore("fetcher", 1),
		Dial: func(ctx context.Context, node, channel string) (net.Conn, error) {
			<-ctx.Done()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.pool("owner")
	if err != nil {
		t.Fatal(err)
	}
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, _, err := c.conn(ctx, "owner", p); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded and the dial's own error", err)
	}
}
