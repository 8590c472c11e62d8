package ipc

import (
	"errors"
	"fmt"
	"os"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
)

func init() {
	rdma.MustRegister(rdma.Backend{
		Name:        rdma.IPC,
		Priority:    20,
		HolderBound: true, // an IPC handle is granted to one peer
		AnySize:     true, // one device copy beats two through the host
		Hardware:    true,
		Viable:      Available,
		Scope:       scope,
		Reach:       reach,
		New:         func(env *rdma.Env) (rdma.Channel, error) { return New(env) },
	})
}

// Available returns nil when the channel can run on this machine with the
// default Config: a CUDA driver with a device, and the shared memory
// directory for the same-host proof. Else its error wraps rdma.ErrNotViable.
func Available() error { return viable(DefaultConfig()) }

func viable(cfg Config) error {
	n, err := memory.CUDADeviceCount()
	if err != nil {
		return fmt.Errorf("%w: ipc: no CUDA driver: %w", rdma.ErrNotViable, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: ipc: no CUDA device", rdma.ErrNotViable)
	}
	if fi, err := os.Stat(cfg.ShmDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: ipc: no shared memory directory %s for the same-host proof: %v", rdma.ErrNotViable, cfg.ShmDir, err)
	}
	return nil
}

var errOtherHost = errors.New("different hosts")

// scope admits GPU memory at both ends of one host.
func scope(owner, fetcher *rdma.Caps, src, dst memory.Device) error {
	if owner.HostID == "" || owner.HostID != fetcher.HostID {
		return errOtherHost
	}
	if src.Kind != memory.KindCUDA || dst.Kind != memory.KindCUDA {
		return fmt.Errorf("needs GPU memory at both ends (%s -> %s)", src, dst)
	}
	return nil
}

// reach needs both GPUs' identities and peer access between them, as
// reported by either end.
func reach(owner, fetcher *rdma.Caps, src, dst memory.Device) error {
	su, du := owner.DeviceUUID(src), fetcher.DeviceUUID(dst)
	if su == "" || du == "" {
		return fmt.Errorf("GPU UUID unknown for %s or %s", src, dst)
	}
	if !owner.PeerAccess(su, du) && !fetcher.PeerAccess(su, du) {
		return fmt.Errorf("no P2P access between %s and %s (NVML)", su, du)
	}
	return nil
}
