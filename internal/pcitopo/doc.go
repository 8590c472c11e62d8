// Package pcitopo reads the PCI tree from sysfs and ranks, for each GPU,
// the RDMA NICs of the host by distance class, the classes of
// `nvidia-smi topo -m`, nearest first:
//
//	PIX   at most one PCIe switch between GPU and NIC
//	PXB   several PCIe switches, no host bridge
//	PHB   through a PCIe host bridge (the CPU's root complex)
//	NODE  between host bridges of one NUMA node
//	SYS   across NUMA nodes (QPI/UPI): GPUDirect RDMA slow or refused
//
// plus "unknown" where the path cannot be read (soft-RoCE has no PCI
// function; a sysfs entry is missing or malformed), which ranks last.
// A GPUDirect RDMA transfer should use a NIC of the GPU's nearest class.
//
// Everything is read from a sysfs under a root directory ("/" for this
// machine), so that tests run on trees captured as fixtures: GPUs by bus
// id at root/sys/bus/pci/devices/<id> (bus ids from NVML, CUDA or lspci;
// ParseBusID reads each form), RDMA devices at root/sys/class/infiniband/
// <name>/device, NUMA nodes from each device's numa_node. Nothing here
// needs a GPU, a NIC or cgo; bad or missing entries give an error or the
// unknown class, never a panic.
//
//	topo, err := pcitopo.Rank("/", []string{"00000000:1B:00.0"})
//	if err != nil {
//		return err // /sys/class/infiniband unreadable
//	}
//	g := topo.GPUs[0]
//	for _, p := range g.Nearest() {
//		fmt.Println(p.NIC, p.Class) // mlx5_0 PIX
//	}
//	if g.CrossSocketOnly() {
//		// warn: every NIC is across sockets from this GPU
//	}
//
// NUMANode gives the node of one PCI device (the staging channel allocates
// a GPU's pinned ring there).
package pcitopo
