package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
)

// TestHelperOwner is the owner process of rdmatest.ChildOwner.
func TestHelperOwner(t *testing.T) { rdmatest.RunChildOwner(t, newChannel) }

// TestConformanceTwoProcesses runs the suite with the owner in a child
// process: RDMA between two processes, and a real process death for kill.
func TestConformanceTwoProcesses(t *testing.T) {
	requireRDMA(t)
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.ChildOwner(t, newChannel, memory.CPU, memory.CPU)
	})
}

// TestOwnerKilledMidTransfer kills the owner process while reads are in
// flight: the fetch fails with ErrPeerDown within seconds.
func TestOwnerKilledMidTransfer(t *testing.T) {
	requireRDMA(t)
	p := rdmatest.ChildOwner(t, newChannel, memory.CPU, memory.CPU)
	const n = 64 << 20
	d := p.Export(t, 21, n)
	dst, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	h := dst.Host()
	for i := range h {
		h[i] = rdmatest.Poison
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- p.Fetcher.Fetch(ctx, d, dst) }()
	// Wait until the first chunk has landed: reads are in flight.
	deadline := time.Now().Add(time.Minute)
	for h[0] == rdmatest.Poison && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	p.Kill()
	killed := time.Now()
	select {
	case err := <-res:
		took := time.Since(killed)
		if err == nil {
			t.Skip("transfer finished before the kill")
		}
		if !errors.Is(err, rdma.ErrPeerDown) {
			t.Errorf("fetch from a killed owner: %v, want ErrPeerDown", err)
		}
		t.Logf("failed %v after the kill: %v", took, err)
	case <-time.After(30 * time.Second):
		c := p.Fetcher.(*Channel)
		c.mu.Lock()
		for name, fp := range c.fetches {
			st, err := fp.qp.State()
			fp.mu.Lock()
			t.Logf("connection to %v: QP %v %v, %d waiters, broken %v", name, st, err, len(fp.waiters), fp.broken)
			fp.mu.Unlock()
		}
		c.mu.Unlock()
		t.Fatalf("fetch from a killed owner hangs (%d fetching)", c.fetching.Load())
	}
}
