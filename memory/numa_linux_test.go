package memory

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// onlineNodes lists this host's NUMA nodes that have memory.
func onlineNodes(t *testing.T) []int {
	t.Helper()
	b, err := os.ReadFile("/sys/devices/system/node/has_memory")
	if err != nil {
		return []int{0} // a kernel without NUMA: everything is node 0
	}
	var out []int
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatalf("has_memory %q", b)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil {
				t.Fatalf("has_memory %q", b)
			}
		}
		for n := a; n <= z; n++ {
			out = append(out, n)
		}
	}
	return out
}

// checkPlaced checks that mem's policy prefers node and that its pages are
// on node.
func checkPlaced(t *testing.T, mem []byte, node int) {
	t.Helper()
	mode, nodes, err := policyOf(&mem[0])
	if err != nil {
		t.Fatal(err)
	}
	if mode != mpolPreferred || len(nodes) != 1 || nodes[0] != node {
		t.Errorf("policy mode %d nodes %v, want preferred (%d) on [%d]", mode, nodes, mpolPreferred, node)
	}
	mode, _, err = policyOf(&mem[len(mem)-1])
	if err != nil || mode != mpolPreferred {
		t.Errorf("policy of the last byte: mode %d, %v", mode, err)
	}
	got, err := PageNodes(mem)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range got {
		if n != node {
			t.Fatalf("page %d of %d on node %d, want %d", i, len(got), n, node)
		}
	}
}

// TestMapOnNode places a mapping's pages on each node with memory and
// verifies the policy (get_mempolicy, which fails if mbind did not apply)
// and where the pages landed (move_pages). With a single node every page
// is on it whatever the policy: that part of the check is vacuous then and
// the policy check is what can fail.
func TestMapOnNode(t *testing.T) {
	nodes := onlineNodes(t)
	for _, node := range nodes {
		m, err := mapOnNode(3<<20+1, node)
		if err != nil {
			t.Fatal(err)
		}
		if page := os.Getpagesize(); len(m.mem)%page != 0 || len(m.mem) < 3<<20+1 {
			t.Errorf("mapping of %d bytes", len(m.mem))
		}
		checkPlaced(t, m.mem, node)
		if err := m.unmap(); err != nil {
			t.Fatal(err)
		}
	}
	if len(nodes) < 2 {
		t.Logf("one NUMA node with memory (%v): pages on node %d prove nothing beyond the policy", nodes, nodes[0])
	}
	// No preference: no policy on the range.
	m, err := mapOnNode(4096, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.unmap()
	if mode, _, err := policyOf(&m.mem[0]); err != nil || mode == mpolPreferred || mode == mpolBind {
		t.Errorf("unbound mapping has policy %d, %v", mode, err)
	}
}

// TestMapOnOtherNode needs two nodes: there the placement is not vacuous.
func TestMapOnOtherNode(t *testing.T) {
	nodes := onlineNodes(t)
	if len(nodes) < 2 {
		t.Skipf("one NUMA node with memory (%v): no other node to place pages on", nodes)
	}
	last := nodes[len(nodes)-1]
	m, err := mapOnNode(8<<20, last)
	if err != nil {
		t.Fatal(err)
	}
	defer m.unmap()
	checkPlaced(t, m.mem, last)
}

func TestMapOnNodeErrors(t *testing.T) {
	if _, err := mapOnNode(0, 0); err == nil {
		t.Error("empty mapping: no error")
	}
	if _, err := mapOnNode(4096, maxNUMANode+1); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("node past the range: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/devices/system/node", "node"+strconv.Itoa(maxNUMANode))); err == nil {
		t.Skip("this host has a node numbered maxNUMANode")
	}
	_, err := mapOnNode(4096, maxNUMANode)
	if err == nil || !strings.Contains(err.Error(), "NUMA node 1023") {
		t.Errorf("a node without memory: %v, want an mbind error naming it", err)
	}
}

// TestPinnedAllocOnNode needs CUDA: pinned memory on the GPU's node (or
// node 0), placed there, usable for copies, freed once.
func TestPinnedAllocOnNode(t *testing.T) {
	p, err := PinnedAllocatorFor()
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("no CUDA: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	node := DeviceNUMANode(CUDA(0))
	if node < 0 {
		node = 0
	}
	const n = 3<<20 + 17
	b, err := p.AllocOnNode(n, node)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != n || b.Device() != Pinned || len(b.Host()) != n || b.Ptr() == 0 {
		t.Fatalf("buffer: len %d device %s host %d ptr %#x", b.Len(), b.Device(), len(b.Host()), b.Ptr())
	}
	checkPlaced(t, b.(*pinnedBuffer).b, node)
	for i := range b.Host() {
		b.Host()[i] = byte(i * 7)
	}
	ca, err := CUDAAllocatorFor(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ca.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	back, err := p.AllocOnNode(n, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := Copy(ctx, d, b); err != nil {
		t.Fatal(err)
	}
	if err := Copy(ctx, back, d); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Host(), b.Host()) {
		t.Error("bytes differ after a round trip through the GPU")
	}
	for _, x := range []Buffer{b, back} {
		if err := x.Free(); err != nil {
			t.Fatal(err)
		}
		if err := x.Free(); !errors.Is(err, ErrFreed) {
			t.Errorf("second Free: %v, want ErrFreed", err)
		}
	}
}

// TestPageNodes: unaligned ranges count every page they touch; populated
// pages are on a node, pages never touched are not.
func TestPageNodes(t *testing.T) {
	m, err := mapOnNode(4*os.Getpagesize(), -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.unmap()
	page := os.Getpagesize()
	nodes, err := PageNodes(m.mem[page-1 : 2*page+1]) // spans pages 0, 1, 2
	if err != nil || len(nodes) != 3 {
		t.Fatalf("%v, %v; want 3 pages", nodes, err)
	}
	for _, n := range nodes {
		if n < 0 {
			t.Errorf("populated page reads %d", n)
		}
	}
	if nodes, err := PageNodes(nil); nodes != nil || err != nil {
		t.Errorf("empty: %v, %v", nodes, err)
	}
	// A fresh mapping nobody touched has no pages yet.
	fresh, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(fresh)
	if nodes, err := PageNodes(fresh); err != nil || len(nodes) != 1 || nodes[0] >= 0 {
		t.Errorf("untouched page: %v, %v; want a negative errno", nodes, err)
	}
}
