package memory

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/tensorferry/tensorferry/internal/nvml"
)

// GPUInfo describes one GPU of this host.
type GPUInfo struct {
	Index       int    // NVML index (PCI bus order)
	UUID        string // "GPU-...", the same string CUDA and nvidia-smi print
	Name        string
	PCIBusID    string // "00000000:06:00.0"
	NUMANode    int    // NUMA node of the GPU's PCI slot; -1 when unknown
	MemoryTotal uint64 // bytes
	BAR1Total   uint64 // bytes of BAR1 (the window RDMA NICs and peers map)
	BAR1Used    uint64 // bytes
	NVLinks     int    // active NVLink links
}

// P2PLink is the peer-to-peer status from one GPU to another.
type P2PLink struct {
	Read   bool   // one GPU can read the other's memory directly
	NVLink bool   // over NVLink (otherwise PCIe)
	Reason string // why Read is false
}

// HostTopology is what this host offers for choosing data channels.
type HostTopology struct {
	HostID        string // HostID(): equal for processes of one host
	DriverVersion string
	GPUs          []GPUInfo
	P2P           [][]P2PLink // P2P[i][j]: from GPUs[i] to GPUs[j]; diagonal zero
}

// Topology reads the GPUs of this host and the P2P matrix between them
// through NVML. Without NVML it returns a topology with only HostID set and
// an error saying why (matching ErrNotSupported); it never panics.
func Topology() (HostTopology, error) {
	t := HostTopology{HostID: HostID()}
	snap, err := nvml.Probe()
	if err != nil {
		return t, fmt.Errorf("%w: topology: %w", ErrNotSupported, err)
	}
	t.DriverVersion = snap.DriverVersion
	for _, g := range snap.GPUs {
		t.GPUs = append(t.GPUs, GPUInfo{
			Index:       g.Index,
			UUID:        g.UUID,
			Name:        g.Name,
			PCIBusID:    g.PCIBusID,
			NUMANode:    numaNode(g.PCIBusID),
			MemoryTotal: g.MemoryTotal,
			BAR1Total:   g.BAR1Total,
			BAR1Used:    g.BAR1Used,
			NVLinks:     g.NVLinks,
		})
	}
	t.P2P = make([][]P2PLink, len(snap.P2P))
	for i, row := range snap.P2P {
		t.P2P[i] = make([]P2PLink, len(row))
		for j, l := range row {
			t.P2P[i][j] = P2PLink{Read: l.Read, NVLink: l.NVLink, Reason: l.Reason}
		}
	}
	return t, nil
}

// numaNode reads the NUMA node of a PCI device from sysfs; -1 when unknown.
// NVML prints an 8-digit domain ("00000000:06:00.0"), sysfs a 4-digit one.
func numaNode(busID string) int {
	id := strings.ToLower(busID)
	if i := strings.IndexByte(id, ':'); i > 4 {
		id = id[i-4:]
	}
	b, err := os.ReadFile("/sys/bus/pci/devices/" + id + "/numa_node")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// HostIDEnv overrides HostID when set (tests that pretend to be several
// hosts on one machine).
const HostIDEnv = "TENSORFERRY_HOST_ID"

// HostID identifies this host: processes on one host (also in different
// containers) get the same value, other hosts a different one. It hashes the
// kernel's boot id (/proc/sys/kernel/random/boot_id: random per boot, shared
// by every container of the host) with nothing container-specific; without
// it, /etc/machine-id, then the host name. Two processes may use CUDA IPC
// only when their HostIDs match.
func HostID() string {
	if v := os.Getenv(HostIDEnv); v != "" {
		return v
	}
	for _, f := range []string{"/proc/sys/kernel/random/boot_id", "/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(f); err == nil {
			if s := strings.TrimSpace(string(b)); s != "" {
				return hashID(f, s)
			}
		}
	}
	h, err := os.Hostname()
	if err != nil {
		h = "unknown"
	}
	return hashID("hostname", h)
}

func hashID(kind, v string) string {
	sum := sha256.Sum256([]byte("tensorferry host\x00" + kind + "\x00" + v))
	return hex.EncodeToString(sum[:8])
}
