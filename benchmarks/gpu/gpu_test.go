package main

import (
	"testing"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
)

// needGPUs skips the test without a GPU and returns the receiving GPU of
// the tests: cuda:1 when there is one, else cuda:0 itself.
func needGPUs(t *testing.T) (dst int) {
	t.Helper()
	n, why := gpuCount()
	if n == 0 {
		t.Skipf("no GPU: %s", why)
	}
	return min(1, n-1)
}

// TestGPUPeerMode runs the peer mode's copies between timing events on
// small sizes (on one GPU, within it) and checks every figure is there.
func TestGPUPeerMode(t *testing.T) {
	dst := needGPUs(t)
	o := options{sizes: []int{4 << 10, 1 << 20}, reps: 2, src: 0, dst: dst}
	rs, err := runPeer(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2*len(o.sizes) {
		t.Fatalf("%d results, want %d: %v", len(rs), 2*len(o.sizes), rs)
	}
	for _, r := range rs {
		if r.Value <= 0 || r.N != 2 || r.Channel == "" {
			t.Errorf("figure %+v", r)
		}
		if r.Metric == report.GBps {
			t.Logf("cuda:0 -> cuda:%d %d bytes: %.1f GB/s (%s)", dst, r.Size, r.Value, r.Channel)
		}
	}
}

// TestGPUNaive runs the naive sequence (device to host copy, TCP, host to
// device copy) once with the check of the destination's bytes.
func TestGPUNaive(t *testing.T) {
	dst := needGPUs(t)
	nv, err := newNaive(0, dst, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := nv.close(); err != nil {
			t.Error(err)
		}
	}()
	for _, n := range []int{4 << 10, 1 << 20} {
		s := &naiveStepper{n: nv, size: n}
		if _, err := s.step(true, false); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
}

// TestGPUHostRegistration runs the regcache mode's host part: one miss,
// then hits, and the copies from registered and pageable memory.
func TestGPUHostRegistration(t *testing.T) {
	needGPUs(t)
	rs, err := hostRegistration(options{src: 0, regSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 8 {
		t.Errorf("%d figures, want 8: %v", len(rs), rs)
	}
}
