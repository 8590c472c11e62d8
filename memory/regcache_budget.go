package memory

import (
	"fmt"
	"math"
)

// PinBudget returns the default budget for registrations that pin memory
// of dev for RDMA (a RegCache of NIC registrations, one per device):
//
//   - host memory: the locked-memory limit (RLIMIT_MEMLOCK), three quarters
//     of it, the rest left to destination registrations and pinned
//     buffers; no byte bound when the limit is unlimited;
//   - CUDA memory: the GPU's BAR1 space free now (BAR1Total - BAR1Used from
//     NVML), through which a NIC reaches registered GPU memory.
//
// It returns an error, and a zero (unlimited) budget, when the limit cannot
// be read (no NVML, an unknown GPU); callers then bound the cache by count.
func PinBudget(dev Device) (RegBudget, error) {
	if dev.IsHost() {
		cur, err := memlockLimit()
		if err != nil {
			return RegBudget{}, err
		}
		if cur == math.MaxUint64 || cur > math.MaxInt64 {
			return RegBudget{}, nil
		}
		return RegBudget{Bytes: int64(cur / 4 * 3)}, nil
	}
	if dev.Kind != KindCUDA {
		return RegBudget{}, fmt.Errorf("memory: no pin budget for %s memory", dev)
	}
	uuid, _, err := CUDADeviceIdentity(dev)
	if err != nil {
		return RegBudget{}, err
	}
	top, err := Topology()
	if err != nil {
		return RegBudget{}, err
	}
	for _, g := range top.GPUs {
		if g.UUID == uuid && g.BAR1Total > 0 {
			free := g.BAR1Total - min(g.BAR1Used, g.BAR1Total)
			return RegBudget{Bytes: int64(min(free, math.MaxInt64))}, nil
		}
	}
	return RegBudget{}, fmt.Errorf("memory: %s (%s): NVML reports no BAR1 size", dev, uuid)
}
