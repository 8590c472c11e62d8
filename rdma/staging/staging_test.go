package staging_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
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

// TestFetchStream: FetchStream fetches in pieces of four chunks, none
// before Ready says the owner holds it, tells Landed as each lands
// (growing, up to the whole), copies the right bytes, and ends with
// Ready's error.
func TestFetchStream(t *testing.T) {
	p := rdmatest.InProcessPair(t, newChannel, memory.CPU, memory.CPU)
	sf := p.Fetcher.(rdma.StreamFetcher)
	n := int64(2*4*staging.DefaultChunkSize + 3)
	d := p.Export(t, 4, int(n))
	dst, err := memory.NewHostBuffer(int(n))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	var asked, landed []int64
	pr := rdma.Progress{
		Ready: func(_ context.Context, k int64) (int64, error) {
			asked = append(asked, k)
			return k, nil // exactly what was asked: every piece asks again
		},
		Landed: func(k int64) {
			if len(asked) == 0 || k > asked[len(asked)-1] {
				t.Errorf("landed %d bytes, asked only for %v", k, asked)
			}
			landed = append(landed, k)
		},
	}
	ctx := context.Background()
	if err := sf.FetchStream(ctx, d, dst, pr); err != nil {
		t.Fatal(err)
	}
	// Pieces of one size (four chunks), the last taking the rest.
	if len(asked) < 3 || !slices.Equal(asked, landed) || asked[len(asked)-1] != n {
		t.Fatalf("asked %v, landed %v, want pieces up to %d", asked, landed, n)
	}
	for i, k := range asked[:len(asked)-1] {
		if k != int64(i+1)*asked[0] {
			t.Fatalf("asked %v: not pieces of %d", asked, asked[0])
		}
	}
	want := make([]byte, n)
	rdmatest.Fill(4, want)
	if !bytes.Equal(dst.Host(), want) {
		t.Fatal("wrong bytes")
	}
	boom := errors.New("the source failed")
	err = sf.FetchStream(ctx, d, dst, rdma.Progress{Ready: func(context.Context, int64) (int64, error) { return 0, boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("FetchStream after Ready failed: %v", err)
	}
	if err := p.Release(t, d); err != nil {
		t.Fatal(err)
	}
}
