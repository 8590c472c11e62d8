package memory

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
	"golang.org/x/sys/unix"
)

// Linux memory policy constants (linux/mempolicy.h).
const (
	mpolPreferred = 1
	mpolBind      = 2
	mpolFNode     = 1 << 0 // get_mempolicy: the node, not the policy
	mpolFAddr     = 1 << 1 // get_mempolicy: of the page at addr
	mpolMFStrict  = 1 << 0 // mbind: fail if pages already placed elsewhere
)

// maxNUMANode bounds the node numbers accepted (the kernel's default
// MAX_NUMNODES is 1024 on x86-64).
const maxNUMANode = 1023

// numaMapping is anonymous memory whose pages were placed on one NUMA node
// before anything touched them.
type numaMapping struct {
	mem []byte // the whole mapping (page-rounded)
}

// mapOnNode maps n bytes (n > 0) of anonymous memory whose pages prefer
// NUMA node (node < 0: no preference), and populates it so that the pages
// exist, zeroed, where the policy put them.
//
// The policy is set with mbind(MPOL_PREFERRED) between mmap and the first
// touch: a page is placed at its first fault, so every page lands on node
// while node has free memory, and on another node (rather than an OOM
// kill, as MPOL_BIND could give) when it has none. set_mempolicy around an
// allocation would have to pin the goroutine to its thread and restore
// the thread's policy after; mbind binds the range itself, whichever
// thread touches it.
func mapOnNode(n, node int) (numaMapping, error) {
	if n <= 0 {
		return numaMapping{}, fmt.Errorf("memory: NUMA mapping of %d bytes", n)
	}
	if node > maxNUMANode {
		return numaMapping{}, fmt.Errorf("memory: NUMA node %d out of range (0..%d)", node, maxNUMANode)
	}
	page := os.Getpagesize()
	size := (n + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return numaMapping{}, fmt.Errorf("memory: mmap %d bytes: %w", size, err)
	}
	m := numaMapping{mem: mem}
	// Pinned pages must not become copy-on-write in a forked child (what
	// libibverbs' ibv_fork_init does for registered memory).
	if err := unix.Madvise(mem, unix.MADV_DONTFORK); err != nil {
		_ = m.unmap()
		return numaMapping{}, fmt.Errorf("memory: madvise DONTFORK: %w", err)
	}
	if node >= 0 {
		if err := mbind(mem, mpolPreferred, node); err != nil {
			_ = m.unmap()
			return numaMapping{}, err
		}
	}
	for i := 0; i < size; i += page {
		mem[i] = 0 // first touch: the page is allocated under the policy
	}
	return m, nil
}

// mbind sets the policy of mem's pages (page-aligned) to mode on node.
func mbind(mem []byte, mode, node int) error {
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	// maxnode counts one bit more than the mask holds: the kernel drops
	// the last bit (get_nodes: --maxnode).
	maxnode := uintptr(len(mask)*64 + 1)
	_, _, e := unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
		uintptr(mode), uintptr(unsafe.Pointer(&mask[0])), maxnode, mpolMFStrict)
	if e != 0 {
		return fmt.Errorf("memory: mbind %d bytes to NUMA node %d: %w", len(mem), node, e)
	}
	return nil
}

// policyOf returns the memory policy mode of the page at p and the nodes
// of its node mask (get_mempolicy with MPOL_F_ADDR).
func policyOf(p *byte) (mode int, nodes []int, err error) {
	mask := make([]uint64, (maxNUMANode+1)/64)
	var m int32
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&mask[0])),
		uintptr(len(mask)*64), uintptr(unsafe.Pointer(p)), mpolFAddr, 0)
	if e != 0 {
		return 0, nil, fmt.Errorf("memory: get_mempolicy: %w", e)
	}
	for i := range len(mask) * 64 {
		if mask[i/64]&(1<<(i%64)) != 0 {
			nodes = append(nodes, i)
		}
	}
	return int(m), nodes, nil
}

// PageNodes returns the NUMA node of every page that mem spans, from
// move_pages with no target nodes (which only queries); a page not
// populated or not placeable reads as a negative errno (-ENOENT, -EFAULT).
// It is how a test or a diagnostic checks where AllocOnNode's pages went.
func PageNodes(mem []byte) ([]int, error) {
	if len(mem) == 0 {
		return nil, nil
	}
	page := uintptr(os.Getpagesize())
	first := uintptr(unsafe.Pointer(&mem[0])) &^ (page - 1)
	last := uintptr(unsafe.Pointer(&mem[len(mem)-1])) &^ (page - 1)
	pages := make([]uintptr, 0, (last-first)/page+1)
	for a := first; a <= last; a += page {
		pages = append(pages, a)
	}
	status := make([]int32, len(pages))
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, uintptr(len(pages)), uintptr(unsafe.Pointer(&pages[0])),
		0, uintptr(unsafe.Pointer(&status[0])), 0)
	if e != 0 {
		return nil, fmt.Errorf("memory: move_pages: %w", e)
	}
	out := make([]int, len(status))
	for i, s := range status {
		out[i] = int(s)
	}
	return out, nil
}

func (m numaMapping) unmap() error {
	if m.mem == nil {
		return nil
	}
	if err := unix.Munmap(m.mem); err != nil {
		return fmt.Errorf("memory: munmap: %w", err)
	}
	return nil
}

// AllocOnNode returns n bytes of pinned host memory whose pages are on
// NUMA node (preferred: another node only when node has no free memory),
// for staging rings serving a GPU attached to that node; node < 0 is
// Alloc. The pages are mapped and placed first (mapOnNode), then
// page-locked and mapped into every context with cuMemHostRegister
// (portable, device-mapped, like Alloc's memory). Free unregisters and
// unmaps them.
func (p *PinnedAllocator) AllocOnNode(n, node int) (Buffer, error) {
	if node < 0 || n <= 0 {
		return p.Alloc(n)
	}
	m, err := mapOnNode(n, node)
	if err != nil {
		return nil, err
	}
	base := uintptr(unsafe.Pointer(&m.mem[0]))
	if err := p.ctx.MemHostRegister(base, len(m.mem), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap); err != nil {
		_ = m.unmap()
		return nil, fmt.Errorf("memory: pinned alloc %d bytes on NUMA node %d: %w", n, node, err)
	}
	ctx := p.ctx
	b := &pinnedBuffer{ctx: ctx, ptr: unsafe.Pointer(&m.mem[0]), b: m.mem[:n:n],
		release: func() error {
			err := ctx.MemHostUnregister(base)
			if uerr := m.unmap(); err == nil {
				err = uerr
			}
			return err
		}}
	b.alloc = Allocation{Device: Pinned, Base: base, Size: n, ID: NextAllocationID()}
	return b, nil
}

// deviceNodes caches DeviceNUMANode by CUDA ordinal.
var deviceNodes sync.Map

// DeviceNUMANode returns the NUMA node of a CUDA device's PCI slot, read
// from sysfs (/sys/bus/pci/devices/<bus id>/numa_node) through the bus id
// the driver gives; -1 when unknown (not a CUDA device, no driver, a
// kernel without NUMA information).
func DeviceNUMANode(dev Device) int {
	if dev.Kind != KindCUDA {
		return -1
	}
	if n, ok := deviceNodes.Load(dev.Index); ok {
		return n.(int)
	}
	_, bus, err := CUDADeviceIdentity(dev)
	if err != nil {
		return -1
	}
	n := numaNode(bus)
	deviceNodes.Store(dev.Index, n)
	return n
}
