package ipc_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/ipc"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
)

func newChannel(env *rdma.Env) (rdma.Channel, error) { return ipc.New(env) }

// TestHelperOwner is the owner process of rdmatest.ChildOwner.
func TestHelperOwner(t *testing.T) { rdmatest.RunChildOwner(t, newChannel) }

// gpuDevices skips without a CUDA device, and returns the owner's and the
// fetcher's device: cuda:0 and cuda:1 when there are two GPUs, cuda:0 for
// both otherwise.
func gpuDevices(t *testing.T) (owner, fetcher memory.Device) {
	t.Helper()
	n, err := memory.CUDADeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver here: %v", err)
	}
	if n == 0 {
		t.Skip("no CUDA device here")
	}
	if n == 1 {
		return memory.CUDA(0), memory.CUDA(0)
	}
	return memory.CUDA(0), memory.CUDA(1)
}

// TestConformanceInProcess runs the suite with both nodes in this process
// (the fetcher addresses the owner's allocation directly: CUDA does not let
// a process open its own IPC handles).
func TestConformanceInProcess(t *testing.T) {
	od, fd := gpuDevices(t)
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.InProcessPair(t, newChannel, od, fd)
	})
}

// TestConformanceTwoProcesses runs the suite with the owner in a child
// process on GPU0 and the fetcher here on GPU1: real CUDA IPC.
func TestConformanceTwoProcesses(t *testing.T) {
	od, fd := gpuDevices(t)
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.ChildOwner(t, newChannel, od, fd)
	})
}

// TestRepeatedTransferReusesMapping: fetching the same allocation again
// opens no new IPC mapping.
func TestRepeatedTransferReusesMapping(t *testing.T) {
	od, fd := gpuDevices(t)
	p := rdmatest.ChildOwner(t, newChannel, od, fd)
	ch := p.Fetcher.(*ipc.Channel)
	const n = 8<<20 + 3
	d := p.Export(t, 5, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want := make([]byte, n)
	rdmatest.Fill(5, want)
	dst, err := memory.AllocatorFor(fd)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := dst.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	host, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	for i := range 5 {
		clear(host.Host())
		if err := memory.Copy(ctx, buf, host); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := ch.Fetch(ctx, d, buf); err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
		t.Logf("fetch %d of %d bytes: %v", i, n, time.Since(start))
		if err := memory.Copy(ctx, host, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(host.Host(), want) {
			t.Fatalf("fetch %d: wrong bytes", i)
		}
	}
	st := ch.Stats()
	if st.Opens != 1 || st.Reuses != 4 || st.Mappings != 1 {
		t.Errorf("stats after 5 fetches of one allocation: %+v, want 1 open, 4 reuses, 1 mapping", st)
	}
	if err := p.Release(t, d); err != nil {
		t.Fatal(err)
	}
}

// streamCase skips without a GPU, else starts an owner process that
// exports Fill(9)'s first 2 copy chunks + 3 bytes to this one, and returns
// it, this node's channel, the export, the chunk size and a buffer of the
// export's size on the fetcher's device (freed when the test ends).
func streamCase(t *testing.T) (*rdmatest.Pair, *ipc.Channel, *tensor.Descriptor, int64, memory.Buffer) {
	od, fd := gpuDevices(t)
	p := rdmatest.ChildOwner(t, newChannel, od, fd)
	chunk := int64(ipc.DefaultConfig().CopyChunk)
	d := p.Export(t, 9, int(2*chunk+3))
	alloc, err := memory.AllocatorFor(fd)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := alloc.Alloc(int(d.Bytes))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = buf.Free() })
	return p, p.Fetcher.(*ipc.Channel), d, chunk, buf
}

// TestFetchStream: FetchStream queues no chunk of the copy before Ready
// says the source holds it, tells Landed as each chunk lands (growing, up
// to the whole), copies the right bytes, and ends with Ready's error.
func TestFetchStream(t *testing.T) {
	p, ch, d, chunk, buf := streamCase(t)
	n := d.Bytes
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var asked, landed []int64
	pr := rdma.Progress{
		Ready: func(_ context.Context, k int64) (int64, error) {
			if len(landed) > 0 && landed[len(landed)-1] >= k {
				t.Errorf("asked for %d bytes, already landed %d", k, landed[len(landed)-1])
			}
			asked = append(asked, k)
			return k, nil // exactly what was asked: every chunk asks again
		},
		Landed: func(k int64) {
			if len(asked) == 0 || k > asked[len(asked)-1] {
				t.Errorf("landed %d bytes, asked only for %v", k, asked)
			}
			landed = append(landed, k)
		},
	}
	if err := ch.FetchStream(ctx, d, buf, pr); err != nil {
		t.Fatal(err)
	}
	if want := []int64{chunk, 2 * chunk, n}; !slices.Equal(asked, want) || !slices.Equal(landed, want) {
		t.Fatalf("asked %v, landed %v, want %v", asked, landed, want)
	}
	host, err := memory.NewHostBuffer(int(n))
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	if err := memory.Copy(ctx, host, buf); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	rdmatest.Fill(9, want)
	if !bytes.Equal(host.Host(), want) {
		t.Fatal("wrong bytes")
	}
	boom := errors.New("the source failed")
	calls := 0
	err = ch.FetchStream(ctx, d, buf, rdma.Progress{Ready: func(_ context.Context, k int64) (int64, error) {
		if calls++; calls > 1 {
			return 0, boom
		}
		return k, nil
	}})
	if !errors.Is(err, boom) {
		t.Fatalf("FetchStream after Ready failed: %v", err)
	}
	if err := p.Release(t, d); err != nil {
		t.Fatal(err)
	}
}

// TestPutStream: a node writes its own buffer into an export another
// process lent it (real CUDA IPC, the mapping opened on the source's
// device), chunk by chunk as Ready allows; fetching the export back gives
// the bytes written, and a Ready that fails stops the put with its error.
func TestPutStream(t *testing.T) {
	p, ch, d, chunk, src := streamCase(t)
	n := d.Bytes
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := memory.NewHostBuffer(int(n))
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	want := make([]byte, n)
	rdmatest.Fill(23, want)
	copy(host.Host(), want)
	if err := memory.Copy(ctx, src, host); err != nil {
		t.Fatal(err)
	}
	var asked, landed []int64
	pr := rdma.Progress{
		Ready: func(_ context.Context, k int64) (int64, error) {
			asked = append(asked, k)
			return k, nil
		},
		Landed: func(k int64) { landed = append(landed, k) },
	}
	if err := ch.PutStream(ctx, d, src, pr); err != nil {
		t.Fatal(err)
	}
	if w := []int64{chunk, 2 * chunk, n}; !slices.Equal(asked, w) || !slices.Equal(landed, w) {
		t.Fatalf("asked %v, landed %v, want %v", asked, landed, w)
	}
	alloc, err := memory.AllocatorFor(src.Device())
	if err != nil {
		t.Fatal(err)
	}
	back, err := alloc.Alloc(int(n))
	if err != nil {
		t.Fatal(err)
	}
	defer back.Free()
	if err := ch.Fetch(ctx, d, back); err != nil {
		t.Fatal(err)
	}
	clear(host.Host())
	if err := memory.Copy(ctx, host, back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host.Host(), want) {
		t.Fatal("the export does not hold the bytes put")
	}
	boom := errors.New("the source failed")
	err = ch.PutStream(ctx, d, src, rdma.Progress{Ready: func(context.Context, int64) (int64, error) { return 0, boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("PutStream after Ready failed: %v", err)
	}
	if err := p.Release(t, d); err != nil {
		t.Fatal(err)
	}
}

// TestOwnerKilledMidTransfer kills the owner process while a copy from its
// memory runs: the fetch ends promptly, later fetches fail, and after
// PeerDown the survivor holds no mapping and no stuck stream.
func TestOwnerKilledMidTransfer(t *testing.T) {
	od, fd := gpuDevices(t)
	p := rdmatest.ChildOwner(t, newChannel, od, fd)
	ch := p.Fetcher.(*ipc.Channel)
	const n = 512 << 20
	d := p.Export(t, 21, n)
	a, err := memory.AllocatorFor(fd)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := a.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	// A first fetch opens the mapping, so that the kill lands in a copy.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ch.Fetch(ctx, d, dst); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		for {
			if err := ch.Fetch(ctx, d, dst); err != nil {
				res <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	p.Kill()
	killed := time.Now()
	select {
	case err := <-res:
		if ctx.Err() != nil {
			t.Fatalf("fetch ran into its deadline: %v", err)
		}
		if !errors.Is(err, rdma.ErrPeerDown) {
			t.Errorf("fetch from a killed owner: %v, want ErrPeerDown", err)
		}
		t.Logf("failed %v after the kill: %v", time.Since(killed), err)
	case <-time.After(30 * time.Second):
		t.Fatal("fetch from a killed owner hangs")
	}
	ch.PeerDown(rdmatest.OwnerNode)
	st := ch.Stats()
	if st.Mappings != 0 {
		t.Errorf("%d IPC mappings left open after the owner died", st.Mappings)
	}
	if st.AbandonedLanes != 0 {
		t.Errorf("%d streams abandoned", st.AbandonedLanes)
	}
	t.Logf("survivor: %+v", st)
}
