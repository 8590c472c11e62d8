package actor

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"go.uber.org/zap"
)

// hostID identifies this host: equal for processes on one host (same machine
// id and boot), different elsewhere.
func hostID() string {
	var parts []string
	for _, f := range []string{"/etc/machine-id", "/proc/sys/kernel/random/boot_id"} {
		if b, err := os.ReadFile(f); err == nil {
			parts = append(parts, strings.TrimSpace(string(b)))
		}
	}
	if len(parts) == 0 {
		h, _ := os.Hostname()
		parts = append(parts, h)
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return hex.EncodeToString(sum[:8])
}

// gpuCaps describes the node's CUDA devices and the P2P pairs among them.
func gpuCaps(devs []memory.Device, log *zap.Logger) ([]rdma.DeviceInfo, [][2]string) {
	var out []rdma.DeviceInfo
	for _, d := range devs {
		if d.Kind == memory.KindCUDA {
			out = append(out, rdma.DeviceInfo{Device: d.String()})
		}
	}
	return out, nil
}
