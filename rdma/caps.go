package rdma

import (
	"fmt"
	"slices"

	"github.com/tensorferry/tensorferry/memory"
)

// DeviceInfo describes one CUDA device a node offers.
type DeviceInfo struct {
	Device   string `msgpack:"d"` // "cuda:N"
	UUID     string `msgpack:"u"`
	PCIBusID string `msgpack:"p"`
}

// RDMADevice describes an RDMA NIC a node can use.
type RDMADevice struct {
	Name    string `msgpack:"n"`
	DMABuf  bool   `msgpack:"b"` // GPU memory registrable through dmabuf
	PeerMem bool   `msgpack:"m"` // GPU memory registrable through peer memory
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
	P2P  [][2]string  `msgpack:"p"`
	RDMA []RDMADevice `msgpack:"r"`
	// Channels lists the channels the node runs (viable and not disabled).
	Channels []string `msgpack:"c"`
	// NotRunning gives the reason for each channel the node does not run.
	NotRunning map[string]string `msgpack:"x"`
}

// Runs reports whether the node runs the named channel.
func (c *Caps) Runs(channel string) bool { return slices.Contains(c.Channels, channel) }

func (c *Caps) uuid(dev memory.Device) string {
	s := dev.String()
	for _, d := range c.Devices {
		if d.Device == s {
			return d.UUID
		}
	}
	return ""
}

func (c *Caps) p2p(a, b string) bool {
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
// fetcher's device dst. It is a pure function of the two ends' Caps, so both
// ends (and `ferry topo`) agree, and it gives a reason for every channel it
// rejected.
func Select(owner, fetcher *Caps, src, dst memory.Device) Choice {
	var ch Choice
	reject := func(name, format string, args ...any) {
		ch.Rejected = append(ch.Rejected, Rejection{name, fmt.Sprintf(format, args...)})
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
	for _, name := range Names {
		if ch.Channel != "" {
			reject(name, "%s preferred", ch.Channel)
			continue
		}
		switch name {
		case Local:
			if owner.Node != fetcher.Node || owner.Incarnation != fetcher.Incarnation {
				reject(name, "different processes")
				continue
			}
		case IPC:
			if owner.HostID == "" || owner.HostID != fetcher.HostID {
				reject(name, "different hosts")
				continue
			}
			if src.Kind != memory.KindCUDA || dst.Kind != memory.KindCUDA {
				reject(name, "needs GPU memory at both ends (%s -> %s)", src, dst)
				continue
			}
			if notRunning(name) {
				continue
			}
			su, du := owner.uuid(src), fetcher.uuid(dst)
			if su == "" || du == "" {
				reject(name, "GPU UUID unknown for %s or %s", src, dst)
				continue
			}
			if !owner.p2p(su, du) && !fetcher.p2p(su, du) {
				reject(name, "no P2P access between %s and %s (NVML)", su, du)
				continue
			}
		case Verbs:
			if notRunning(name) {
				continue
			}
			if len(owner.RDMA) == 0 || len(fetcher.RDMA) == 0 {
				reject(name, "no RDMA device at both ends")
				continue
			}
			if src.Kind == memory.KindCUDA && !gpuRegistrable(owner.RDMA) {
				reject(name, "%s cannot register GPU memory (no dmabuf or peer memory)", owner.Node)
				continue
			}
			if dst.Kind == memory.KindCUDA && !gpuRegistrable(fetcher.RDMA) {
				reject(name, "%s cannot register GPU memory (no dmabuf or peer memory)", fetcher.Node)
				continue
			}
		case Staging:
			if notRunning(name) {
				continue
			}
		}
		ch.Channel = name
	}
	return ch
}

func gpuRegistrable(devs []RDMADevice) bool {
	for _, d := range devs {
		if d.DMABuf || d.PeerMem {
			return true
		}
	}
	return false
}
