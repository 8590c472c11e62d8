package verbs

import (
	"fmt"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/rdma"
)

// rail is one RDMA device (NIC) and port a transfer can use. A fetcher's
// rail i connects to the owner's rail i, as rail-optimized fabrics wire NIC
// i of every host to switch i.
type rail struct {
	ctx  *ibverbs.Context
	port ibverbs.PortInfo
}

// railKey names the per-peer state of one rail.
type railKey struct {
	node string
	rail int
}

// openRails opens the devices of Config.Device, or of plan (the NICs
// ranked for Config.GPU), and Config.Rails: rail 0 is pickPort's, and
// without Device each further rail is another device with a usable port of
// the same link layer (its first usable one) and, where plan ranked the
// GPU's NICs, of rail 0's distance class, nearest first, up to Rails. It
// returns rail 0's class.
func openRails(cfg Config, plan nicPlan) ([]rail, pcitopo.Class, error) {
	name, port, class, err := pickPort(cfg, plan)
	if err != nil {
		return nil, 0, err
	}
	names, ports := []string{name}, []ibverbs.PortInfo{port}
	if cfg.Device == "" && cfg.Rails != 1 {
		devs, _ := ibverbs.Devices()
		devs, classes := plan.order(devs)
		for _, d := range devs {
			if d.Err != nil || d.Name == name || cfg.Rails > 1 && len(names) >= cfg.Rails {
				continue
			}
			if len(plan.rank.NICs) > 0 && classes[d.Name] != class {
				continue // farther from the GPU than rail 0: its slices would lag
			}
			for _, p := range d.Ports {
				if p.Usable() && p.LinkLayer == port.LinkLayer {
					names, ports = append(names, d.Name), append(ports, p)
					break
				}
			}
		}
	}
	rails := make([]rail, 0, len(names))
	for i, n := range names {
		ctx, err := ibverbs.Open(n)
		if err != nil {
			if i == 0 {
				return nil, 0, fmt.Errorf("%w: verbs: %w", rdma.ErrNotViable, err)
			}
			continue // a further rail that cannot be opened is left out
		}
		rails = append(rails, rail{ctx: ctx, port: ports[i]})
	}
	return rails, class, nil
}
