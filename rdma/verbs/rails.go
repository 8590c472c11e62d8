package verbs

import (
	"fmt"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
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

// openRails opens the devices of Config.Device and Config.Rails: the first
// usable port (pickPort's) and, without Device, every other device's first
// usable port of the same link layer, up to Rails.
func openRails(cfg Config) ([]rail, error) {
	name, port, err := pickPort(cfg)
	if err != nil {
		return nil, err
	}
	names, ports := []string{name}, []ibverbs.PortInfo{port}
	if cfg.Device == "" && cfg.Rails != 1 {
		devs, _ := ibverbs.Devices()
		for _, d := range devs {
			if d.Err != nil || d.Name == name || cfg.Rails > 1 && len(names) >= cfg.Rails {
				continue
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
				return nil, fmt.Errorf("%w: verbs: %w", rdma.ErrNotViable, err)
			}
			continue // a further rail that cannot be opened is left out
		}
		rails = append(rails, rail{ctx: ctx, port: ports[i]})
	}
	return rails, nil
}
