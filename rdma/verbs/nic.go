package verbs

import (
	"slices"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/zap"
)

// nicPlan is how the channel orders the RDMA devices for the GPU it serves.
type nicPlan struct {
	gpu  string      // the GPU's bus id; "" when there is none
	rank pcitopo.GPU // the GPU's NICs, nearest first; empty without a GPU
	err  error       // why the GPU could not be ranked
}

// planNICs ranks this machine's NICs for the GPU at bus id gpu (any form
// pcitopo.ParseBusID reads); gpu "" means CUDA device 0 of this process
// (under CUDA_VISIBLE_DEVICES, the GPU the process was given) when there is
// one. Without a GPU the plan is empty and devices keep their order.
func planNICs(gpu, sysRoot string) nicPlan {
	if gpu == "" {
		_, bus, err := memory.CUDADeviceIdentity(memory.CUDA(0))
		if err != nil {
			return nicPlan{}
		}
		gpu = bus
	}
	p := nicPlan{gpu: gpu}
	t, err := pcitopo.Rank(sysRoot, []string{gpu})
	if err != nil {
		p.err = err
		return p
	}
	p.rank = t.GPUs[0]
	p.err = p.rank.Err
	return p
}

// order returns devs nearest first from the plan's GPU (stable: the
// libibverbs order within a class; devices the ranking does not list
// last), with each device's class.
func (p nicPlan) order(devs []ibverbs.DeviceInfo) ([]ibverbs.DeviceInfo, map[string]pcitopo.Class) {
	class := map[string]pcitopo.Class{}
	pos := map[string]int{}
	for i, n := range p.rank.NICs {
		class[n.NIC], pos[n.NIC] = n.Class, i
	}
	out := slices.Clone(devs)
	at := func(name string) int {
		if i, ok := pos[name]; ok {
			return i
		}
		return len(pos)
	}
	slices.SortStableFunc(out, func(a, b ibverbs.DeviceInfo) int { return at(a.Name) - at(b.Name) })
	return out, class
}

// nearest returns the names of the NICs of the GPU's nearest class.
func (p nicPlan) nearest() []string {
	var out []string
	for _, n := range p.rank.Nearest() {
		out = append(out, n.NIC)
	}
	return out
}

// report logs the NIC taken for the plan's GPU: at debug level when it is
// of the nearest class, as a warning when it crosses sockets or a nearer
// NIC had no usable port, and why the GPU could not be ranked.
func (p nicPlan) report(log *zap.Logger, name string, class pcitopo.Class) {
	if p.gpu == "" {
		return
	}
	fields := []zap.Field{zap.String("gpu", p.gpu), zap.String("device", name),
		zap.Stringer("class", class), zap.Strings("nearest", p.nearest())}
	switch {
	case p.err != nil:
		log.Warn("verbs: GPU's distance to the NICs unknown; taking the first usable device", append(fields, zap.Error(p.err))...)
	case class == pcitopo.ClassSys:
		log.Warn("verbs: the GPU's NIC is across sockets (SYS): GPUDirect RDMA will be slow or refused", fields...)
	case len(p.rank.NICs) > 0 && class != p.rank.NICs[0].Class:
		log.Warn("verbs: no NIC of the GPU's nearest class has a usable port; taking a farther one", fields...)
	default:
		log.Debug("verbs: NIC nearest the GPU", fields...)
	}
}
