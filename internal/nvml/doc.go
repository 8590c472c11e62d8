// Package nvml reads the GPU topology of this host through NVIDIA's NVML
// (github.com/NVIDIA/go-nvml, which dlopens libnvidia-ml.so.1 itself): each
// GPU's identity, memory and BAR1 sizes, NVLink count, and the P2P status
// between every pair. Without the library, or in builds without cgo, Probe
// returns an error matching ErrUnavailable, never panics.
//
//	snap, err := nvml.Probe()
//	if errors.Is(err, nvml.ErrUnavailable) {
//		// no NVIDIA driver here
//	}
//	for _, g := range snap.GPUs {
//		fmt.Println(g.Index, g.UUID, g.PCIBusID)
//	}
package nvml

import "errors"

// ErrUnavailable means NVML cannot be used here (no library, no driver, or a
// build without cgo).
var ErrUnavailable = errors.New("nvml: unavailable")

// GPU describes one device as NVML sees it (NVML index order, which is PCI
// bus order, like CUDA_DEVICE_ORDER=PCI_BUS_ID).
type GPU struct {
	Index       int
	UUID        string // "GPU-..."
	Name        string
	PCIBusID    string // as NVML prints it, "00000000:06:00.0"
	MemoryTotal uint64 // bytes
	BAR1Total   uint64 // bytes
	BAR1Used    uint64 // bytes
	NVLinks     int    // active NVLink links
}

// Link is the peer-to-peer status from one GPU to another.
type Link struct {
	Read   bool   // P2P reads supported (NVML P2P_CAPS_INDEX_READ)
	NVLink bool   // P2P over NVLink (NVML P2P_CAPS_INDEX_NVLINK)
	Reason string // why Read is false; empty when it is true
}

// Snapshot is the topology at the time of Probe.
type Snapshot struct {
	DriverVersion string
	GPUs          []GPU
	P2P           [][]Link // P2P[i][j]: from GPUs[i] to GPUs[j]; the diagonal is zero
}
