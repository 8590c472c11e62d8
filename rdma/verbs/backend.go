package verbs

import (
	"errors"
	"fmt"
	"os"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/vmihailenco/msgpack/v5"
)

func init() {
	rdma.MustRegister(rdma.Backend{
		Name:        rdma.Verbs,
		Priority:    30,
		HolderBound: true, // an rkey is registered in one peer's protection domain
		Hardware:    true,
		Viable:      Available,
		Advertise:   Advertise,
		Reach:       reach,
		New:         func(env *rdma.Env) (rdma.Channel, error) { return New(env) },
	})
}

// Device describes an RDMA NIC a node can use, as advertised in
// rdma.Caps.Ads[rdma.Verbs].
type Device struct {
	Name    string `msgpack:"n"`
	DMABuf  bool   `msgpack:"b"` // GPU memory registrable through dmabuf
	PeerMem bool   `msgpack:"m"` // GPU memory registrable through peer memory
}

// maxAd bounds the advertisement read from a peer's Caps.
const maxAd = 64 << 10

// LocalDevices lists this machine's RDMA devices with a usable port. GPU
// registration is reported through dmabuf (libibverbs has
// ibv_reg_dmabuf_mr) and peer memory (the nvidia-peermem module is loaded).
func LocalDevices() []Device {
	devs, err := ibverbs.Devices()
	if err != nil {
		return nil
	}
	peerMem := false
	for _, p := range []string{"/sys/module/nvidia_peermem", "/sys/kernel/mm/memory_peers/nv_mem"} {
		if _, err := os.Stat(p); err == nil {
			peerMem = true
		}
	}
	var out []Device
	for _, d := range devs {
		for _, p := range d.Ports {
			if d.Err == nil && p.Usable() {
				out = append(out, Device{Name: d.Name, DMABuf: ibverbs.DmabufSupported(), PeerMem: peerMem})
				break
			}
		}
	}
	return out
}

// Advertise puts this machine's RDMA devices (LocalDevices) in c.
func Advertise(c *rdma.Caps) { SetDevices(c, LocalDevices()) }

// SetDevices puts devs in c as the RDMA devices the node advertises.
func SetDevices(c *rdma.Caps, devs []Device) {
	b, err := msgpack.Marshal(devs)
	if err != nil {
		panic(fmt.Sprintf("verbs: encoding RDMA devices: %v", err)) // a slice of plain structs
	}
	if c.Ads == nil {
		c.Ads = map[string][]byte{}
	}
	c.Ads[rdma.Verbs] = b
}

// errBadAd wraps the error of an advertisement that cannot be read.
var errBadAd = errors.New("verbs: malformed RDMA device list")

// Devices returns the RDMA devices the node of c advertised (none when it
// advertised nothing).
func Devices(c *rdma.Caps) ([]Device, error) {
	b := c.Ads[rdma.Verbs]
	if len(b) == 0 {
		return nil, nil
	}
	var devs []Device
	if err := rdma.DecodeControl(b, maxAd, &devs, errBadAd, "advertisement"); err != nil {
		return nil, err
	}
	return devs, nil
}

// reach needs an RDMA device at both ends, and one that can register GPU
// memory at each end whose memory is on a GPU.
func reach(owner, fetcher *rdma.Caps, src, dst memory.Device) error {
	od, err := Devices(owner)
	if err != nil {
		return fmt.Errorf("%s: %w", owner.Node, err)
	}
	fd, err := Devices(fetcher)
	if err != nil {
		return fmt.Errorf("%s: %w", fetcher.Node, err)
	}
	if len(od) == 0 || len(fd) == 0 {
		return errors.New("no RDMA device at both ends")
	}
	if src.Kind == memory.KindCUDA && !gpuRegistrable(od) {
		return fmt.Errorf("%s cannot register GPU memory (no dmabuf or peer memory)", owner.Node)
	}
	if dst.Kind == memory.KindCUDA && !gpuRegistrable(fd) {
		return fmt.Errorf("%s cannot register GPU memory (no dmabuf or peer memory)", fetcher.Node)
	}
	return nil
}

func gpuRegistrable(devs []Device) bool {
	for _, d := range devs {
		if d.DMABuf || d.PeerMem {
			return true
		}
	}
	return false
}
