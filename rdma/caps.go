package rdma

import (
	"fmt"
	"maps"
	"slices"

	"github.com/tensorferry/tensorferry/memory"
)

// DeviceInfo describes one CUDA device a node offers.
type DeviceInfo struct {
	Device   string `msgpack:"d"` // "cuda:N"
	UUID     string `msgpack:"u"`
	PCIBusID string `msgpack:"p"`
}

// Caps is what a node advertises to its peers after the handshake: enough
// for both ends to run the same pure selection.
type Caps struct {
	Node        string `msgpack:"n"`
	Incarnation uint64 `msgpack:"i"`
	// HostID is equal for processes on the same host (machine id + boot id).
	HostID  string       `msgpack:"h"`
	Devices []DeviceInfo `msgpack:"g"`
	// P2P lists pairs of GPU UUIDs between which peer access works.
	P2P [][2]string `msgpack:"p"`
	// Ads holds what each running channel advertises (see
	// Backend.Advertise), by channel name; only that channel reads it.
	Ads map[string][]byte `msgpack:"a"`
	// Channels lists the channels the node runs (viable and not disabled).
	Channels []string `msgpack:"c"`
	// NotRunning gives the reason for each channel the node does not run.
	NotRunning map[string]string `msgpack:"x"`
}

// Runs reports whether the node runs the named channel.
func (c *Caps) Runs(channel string) bool { return slices.Contains(c.Channels, channel) }

// DeviceUUID returns the UUID of the node's GPU dev, or "" when the node
// did not advertise one.
func (c *Caps) DeviceUUID(dev memory.Device) string {
	s := dev.String()
	for _, d := range c.Devices {
		if d.Device == s {
			return d.UUID
		}
	}
	return ""
}

// PeerAccess reports whether the node reported peer access between the GPUs
// of UUIDs a and b (always for a GPU with itself; never for an unknown
// UUID).
func (c *Caps) PeerAccess(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	if a == b {
		return true
	}
	for _, p := range c.P2P {
		if (p[0] == a && p[1] == b) || (p[0] == b && p[1] == a) {
			return true
		}
	}
	return false
}

// Rejection says why a channel was not chosen.
type Rejection struct {
	Channel string
	Reason  string
}

// Choice is the result of Select.
type Choice struct {
	Channel  string // "" when nothing can move the bytes
	Rejected []Rejection
}

// Select picks the channel that moves a tensor from owner's device src to
// fetcher's device dst: the first registered backend, in priority order,
// whose Scope admits the pair, that both ends run and whose Reach accepts
// the pair. It is a pure function of the two ends' Caps (and the registered
// backends), so both ends (and `ferry topo`) agree, and it gives a reason
// for every backend it rejected.
func Select(owner, fetcher *Caps, src, dst memory.Device) Choice {
	return selectChannel(owner, fetcher, src, dst, true)
}

// Choose is Select's channel alone, "" when nothing can move the bytes:
// what a fetch needs on its path, without formatting a reason for each
// backend it passes over (Select gives them, for the error when it is "").
func Choose(owner, fetcher *Caps, src, dst memory.Device) string {
	return selectChannel(owner, fetcher, src, dst, false).Channel
}

// selectChannel is Select; it writes Rejected only when reasons is set.
func selectChannel(owner, fetcher *Caps, src, dst memory.Device, reasons bool) Choice {
	var ch Choice
	reject := func(name, format string, args ...any) {
		if reasons {
			ch.Rejected = append(ch.Rejected, Rejection{name, fmt.Sprintf(format, args...)})
		}
	}
	notRunning := func(name string) bool {
		for _, c := range []*Caps{owner, fetcher} {
			if !c.Runs(name) {
				why := c.NotRunning[name]
				if why == "" {
					why = "not enabled"
				}
				reject(name, "%s does not run it: %s", c.Node, why)
				return true
			}
		}
		return false
	}
	for _, b := range backends() {
		if ch.Channel != "" {
			if !reasons {
				break
			}
			reject(b.Name, "%s preferred", ch.Channel)
			continue
		}
		if b.Scope != nil {
			if err := b.Scope(owner, fetcher, src, dst); err != nil {
				reject(b.Name, "%v", err)
				continue
			}
		}
		if notRunning(b.Name) {
			continue
		}
		if err := b.Reach(owner, fetcher, src, dst); err != nil {
			reject(b.Name, "%v", err)
			continue
		}
		ch.Channel = b.Name
	}
	return ch
}

// ForHolder returns the capabilities with which this node fetches a
// descriptor whose lease was issued to holder: c itself when holder is
// this node (or ""), else a copy that does not run the holder-bound
// channels (Backend.HolderBound), which serve an export only to its holder.
func (c *Caps) ForHolder(holder string) *Caps {
	if holder == "" || holder == c.Node {
		return c
	}
	out := *c
	out.Channels = nil
	out.NotRunning = maps.Clone(c.NotRunning)
	if out.NotRunning == nil {
		out.NotRunning = map[string]string{}
	}
	for _, name := range c.Channels {
		if b, ok := LookupBackend(name); ok && b.HolderBound {
			out.NotRunning[name] = "forwarded descriptor (lent to " + holder + "): served only to its holder"
			continue
		}
		out.Channels = append(out.Channels, name)
	}
	return &out
}

// DirectSmall returns the AnySize channel (see Backend.AnySize) that both
// ends run and that moves a tensor from owner's device src to every GPU
// the fetcher advertised, or "" when there is none (src is not a GPU, the
// fetcher advertised no GPU, the ends are on different hosts).
func DirectSmall(owner, fetcher *Caps, src memory.Device) string {
	if src.Kind != memory.KindCUDA || len(fetcher.Devices) == 0 {
		return ""
	}
next:
	for _, b := range backends() {
		if !b.AnySize || !owner.Runs(b.Name) || !fetcher.Runs(b.Name) {
			continue
		}
		for _, d := range fetcher.Devices {
			dst, err := memory.ParseDevice(d.Device)
			if err != nil {
				continue next
			}
			if b.Scope != nil && b.Scope(owner, fetcher, src, dst) != nil {
				continue next
			}
			if b.Reach(owner, fetcher, src, dst) != nil {
				continue next
			}
		}
		return b.Name
	}
	return ""
}
