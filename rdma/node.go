package rdma

import (
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/zap"
)

// LocalCaps returns the capabilities of a node of this machine named node,
// whose devices are devices: this host's id, the identity of its GPUs and
// the pairs of GPUs between which NVML reports P2P reads, then for each
// registered backend, in priority order, either the reason it does not run
// (disabled reports true for it: "disabled in the config"; Viable fails:
// its error) or its name in Channels and its advertisement in Ads. disabled
// may be nil; log, which may be nil, gets at info level why a GPU or a
// channel cannot be used.
//
// Nothing is started: Open starts the channels listed.
func LocalCaps(node string, incarnation uint64, devices []memory.Device, disabled func(channel string) bool, log *zap.Logger) Caps {
	if log == nil {
		log = zap.NewNop()
	}
	c := Caps{Node: node, Incarnation: incarnation, HostID: memory.HostID(),
		NotRunning: map[string]string{}, Ads: map[string][]byte{}}
	c.Devices, c.P2P = gpuCaps(devices, log)
	for _, b := range backends() {
		if disabled != nil && disabled(b.Name) {
			c.NotRunning[b.Name] = "disabled in the config"
			continue
		}
		if b.Viable != nil {
			if err := b.Viable(); err != nil {
				c.NotRunning[b.Name] = err.Error()
				log.Info("channel not viable", zap.String("channel", b.Name), zap.Error(err))
				continue
			}
		}
		c.Channels = append(c.Channels, b.Name)
		if b.Advertise != nil {
			b.Advertise(&c)
		}
	}
	return c
}

// gpuCaps describes the node's CUDA devices (by the config's CUDA ordinals)
// and the pairs of GPUs of this host between which NVML reports P2P reads.
func gpuCaps(devs []memory.Device, log *zap.Logger) ([]DeviceInfo, [][2]string) {
	var out []DeviceInfo
	for _, d := range devs {
		if d.Kind != memory.KindCUDA {
			continue
		}
		uuid, bus, err := memory.CUDADeviceIdentity(d)
		if err != nil {
			log.Info("GPU identity unknown: ipc disabled for it", zap.Stringer("device", d), zap.Error(err))
		}
		out = append(out, DeviceInfo{Device: d.String(), UUID: uuid, PCIBusID: bus})
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

// Open starts the channels listed in c.Channels for the node described by
// env, each with its backend's New or, where override has an entry for its
// name, with that constructor instead (an override replaces only the
// constructor: the channel is still started only if c lists it). A channel
// whose constructor fails moves from c.Channels to c.NotRunning, with the
// error as the reason (logged at info level), and loses its c.Ads entry.
// Open returns the channels started, by name; the caller closes them.
func Open(env *Env, c *Caps, override map[string]func(*Env) (Channel, error)) map[string]Channel {
	out := map[string]Channel{}
	var running []string
	for _, name := range c.Channels {
		f := override[name]
		if f == nil {
			if b, ok := LookupBackend(name); ok {
				f = b.New
			}
		}
		var (
			ch  Channel
			err error
		)
		if f == nil {
			err = fmt.Errorf("%w: %q", ErrUnknownChannel, name)
		} else {
			ch, err = f(env)
			if err == nil && ch == nil {
				err = fmt.Errorf("rdma: the constructor of channel %q returned no channel", name)
			}
		}
		if err != nil {
			if c.NotRunning == nil {
				c.NotRunning = map[string]string{}
			}
			c.NotRunning[name] = err.Error()
			delete(c.Ads, name)
			env.Logger().Info("channel not running", zap.String("channel", name), zap.Error(err))
			continue
		}
		out[name] = ch
		running = append(running, name)
	}
	c.Channels = running
	return out
}
