//go:build linux && cgo

package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// call turns an NVML return code into an error naming the call.
func call(name string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("nvml: %s: %s", name, nvml.ErrorString(r))
}

// Probe initializes NVML, reads the topology and shuts NVML down again.
func Probe() (Snapshot, error) {
	if r := nvml.Init(); r != nvml.SUCCESS {
		return Snapshot{}, fmt.Errorf("%w: nvmlInit: %s", ErrUnavailable, errorString(r))
	}
	defer nvml.Shutdown()
	var s Snapshot
	if v, r := nvml.SystemGetDriverVersion(); r == nvml.SUCCESS {
		s.DriverVersion = v
	}
	n, r := nvml.DeviceGetCount()
	if err := call("nvmlDeviceGetCount", r); err != nil {
		return Snapshot{}, err
	}
	devs := make([]nvml.Device, n)
	for i := range n {
		d, r := nvml.DeviceGetHandleByIndex(i)
		if err := call("nvmlDeviceGetHandleByIndex", r); err != nil {
			return Snapshot{}, err
		}
		devs[i] = d
		g := GPU{Index: i}
		if g.UUID, r = d.GetUUID(); r != nvml.SUCCESS {
			return Snapshot{}, call("nvmlDeviceGetUUID", r)
		}
		g.Name, _ = d.GetName()
		if pci, r := d.GetPciInfo(); r == nvml.SUCCESS {
			g.PCIBusID = cString(pci.BusId[:])
		}
		if m, r := d.GetMemoryInfo(); r == nvml.SUCCESS {
			g.MemoryTotal = m.Total
		}
		if b, r := d.GetBAR1MemoryInfo(); r == nvml.SUCCESS {
			g.BAR1Total, g.BAR1Used = b.Bar1Total, b.Bar1Used
		}
		for l := range nvml.NVLINK_MAX_LINKS {
			st, r := d.GetNvLinkState(l)
			if r != nvml.SUCCESS {
				break // NOT_SUPPORTED on PCIe parts, INVALID_ARGUMENT past the last link
			}
			if st == nvml.FEATURE_ENABLED {
				g.NVLinks++
			}
		}
		s.GPUs = append(s.GPUs, g)
	}
	s.P2P = make([][]Link, n)
	for i := range n {
		s.P2P[i] = make([]Link, n)
		for j := range n {
			if i == j {
				continue
			}
			l := &s.P2P[i][j]
			st, r := nvml.DeviceGetP2PStatus(devs[i], devs[j], nvml.P2P_CAPS_INDEX_READ)
			switch {
			case r != nvml.SUCCESS:
				l.Reason = "nvmlDeviceGetP2PStatus: " + errorString(r)
			case st == nvml.P2P_STATUS_OK:
				l.Read = true
			default:
				l.Reason = p2pReason(st)
			}
			if st, r := nvml.DeviceGetP2PStatus(devs[i], devs[j], nvml.P2P_CAPS_INDEX_NVLINK); r == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
				l.NVLink = true
			}
		}
	}
	return s, nil
}

// errorString names an NVML return code without needing the library loaded.
func errorString(r nvml.Return) string {
	if r == nvml.ERROR_LIBRARY_NOT_FOUND {
		return "libnvidia-ml.so.1 not found"
	}
	return r.String()
}

func p2pReason(st nvml.GpuP2PStatus) string {
	switch st {
	case nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "chipset not supported"
	case nvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GPU not supported"
	case nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "IOH topology not supported"
	case nvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "disabled by registry key"
	case nvml.P2P_STATUS_NOT_SUPPORTED:
		return "not supported"
	}
	return "unknown"
}

func cString(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
