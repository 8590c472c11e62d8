package verbs_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

// countingRegistrar records registrations of GPU allocations the way the
// verbs channel keeps them (keyed by allocation, per peer).
type countingRegistrar struct{ reg, unreg int }

type gpuReg struct{ a memory.Allocation }

func (r gpuReg) Allocation() memory.Allocation { return r.a }

func (c *countingRegistrar) Register(a memory.Allocation, peer string) (memory.Registration, error) {
	c.reg++
	return gpuReg{a}, nil
}

func (c *countingRegistrar) Unregister(memory.Registration) error {
	c.unreg++
	return nil
}

// TestGPURegistrationPath runs on a GPU machine without an RDMA NIC: the
// dmabuf export of a device allocation works, the registration cache keeps
// one registration per GPU allocation and drops it when the allocation is
// freed, and the channel reports itself not viable with the reason.
func TestGPURegistrationPath(t *testing.T) {
	if n, err := memory.CUDADeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device: %v", err)
	}
	a, err := memory.AllocatorFor(memory.CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	buf, err := a.Alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	view, err := buf.Slice(1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	fd, off, length, err := memory.DmaBuf(view)
	if err != nil {
		t.Fatalf("dmabuf export: %v", err)
	}
	if off != 1<<20 || length < 8<<20 {
		t.Fatalf("dmabuf offset %d length %d", off, length)
	}
	_ = syscall.Close(fd)

	r := &countingRegistrar{}
	cache := memory.NewRegCache("verbs-gpu-test", r, memory.RegBudget{Count: 8})
	defer cache.Close()
	for range 3 {
		_, release, err := cache.Get(buf.Allocation(), "peer")
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	if st := cache.Stats(); st.Misses != 1 || st.Hits != 2 || r.reg != 1 {
		t.Fatalf("stats %+v, registrations %d", st, r.reg)
	}
	// The caching allocator keeps freed blocks; trimming frees the driver
	// allocation, which must invalidate its registration.
	if err := buf.Free(); err != nil {
		t.Fatal(err)
	}
	ca, err := memory.CUDAAllocatorFor(memory.CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Trim(); err != nil {
		t.Fatal(err)
	}
	if r.unreg != 1 {
		t.Fatalf("%d unregistrations after the allocation was freed", r.unreg)
	}

	if err := verbs.Available(); err == nil {
		t.Log("this machine has an RDMA device")
	} else if !errors.Is(err, rdma.ErrNotViable) {
		t.Fatalf("Available() = %v, want ErrNotViable", err)
	} else {
		t.Logf("verbs not viable here, as expected: %v", err)
	}
}
