//go:build !linux

package memory

// AllocOnNode is Alloc: NUMA placement is implemented on Linux only.
func (p *PinnedAllocator) AllocOnNode(n, _ int) (Buffer, error) { return p.Alloc(n) }

// DeviceNUMANode returns -1: NUMA nodes are read from Linux sysfs only.
func DeviceNUMANode(Device) int { return -1 }

// PageNodes fails: NUMA placement is read on Linux only.
func PageNodes([]byte) ([]int, error) { return nil, ErrNotSupported }
