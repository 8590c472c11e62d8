package transfer

import (
	"fmt"

	"github.com/tensorferry/tensorferry/rdma"
	_ "github.com/tensorferry/tensorferry/rdma/builtin" // the default channels register themselves
	"github.com/tensorferry/tensorferry/tensor"
)

// openChannels builds the node's capabilities and starts the channels they
// list: every registered backend that is viable here and not disabled,
// with cfg.Channels replacing constructors.
func openChannels(env *rdma.Env, cfg *Config) (map[string]rdma.Channel, rdma.Caps, error) {
	override := map[string]func(*rdma.Env) (rdma.Channel, error){}
	for name, f := range cfg.Channels {
		if _, ok := rdma.LookupBackend(name); !ok {
			return nil, rdma.Caps{}, fmt.Errorf("transfer: channel %q: %w (register a backend with rdma.Register)", name, rdma.ErrUnknownChannel)
		}
		override[name] = f
	}
	caps := rdma.LocalCaps(cfg.Node, cfg.Incarnation, cfg.Devices, cfg.Disabled, cfg.Log)
	if cfg.HostID != "" {
		caps.HostID = cfg.HostID
	}
	channels := rdma.Open(env, &caps, override)
	return channels, caps, nil
}

// fetcherCaps returns this node's capabilities for fetching d: all of them,
// except, for a descriptor forwarded here (this node is not its holder),
// the channels bound to the holder.
func (e *Engine) fetcherCaps(d *tensor.Descriptor) *rdma.Caps {
	if d.Holder == "" {
		return &e.caps
	}
	return e.caps.ForHolder(d.Holder)
}
