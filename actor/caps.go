package actor

import (
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"go.uber.org/zap"
)

// hostID identifies this host for channel selection.
func hostID() string { return memory.HostID() }

// gpuCaps describes the node's CUDA devices (by the config's CUDA ordinals)
// and the pairs of GPUs of this host between which NVML reports P2P reads.
func gpuCaps(devs []memory.Device, log *zap.Logger) ([]rdma.DeviceInfo, [][2]string) {
	var out []rdma.DeviceInfo
	for _, d := range devs {
		if d.Kind != memory.KindCUDA {
			continue
		}
		uuid, bus, err := memory.CUDADeviceIdentity(d)
		if err != nil {
			log.Info("GPU identity unknown: ipc disabled for it", zap.Stringer("device", d), zap.Error(err))
		}
		out = append(out, rdma.DeviceInfo{Device: d.String(), UUID: uuid, PCIBusID: bus})
	}
	if len(out) == 0 {
		return nil, nil
	}
	topo, err := memory.Topology()
	if err != nil {
		log.Info("no GPU topology: no P2P pairs advertised", zap.Error(err))
		return out, nil
	}
	var p2p [][2]string
	for i, row := range topo.P2P {
		for j, l := range row {
			if i != j && l.Read {
				p2p = append(p2p, [2]string{topo.GPUs[i].UUID, topo.GPUs[j].UUID})
			}
		}
	}
	return out, p2p
}
