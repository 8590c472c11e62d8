package memory

import (
	"fmt"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// CUDADeviceCount returns the number of CUDA devices, or an error wrapping
// ErrNotSupported with the driver's reason.
func CUDADeviceCount() (int, error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return n, nil
}

// CUDADeviceIdentity returns the UUID ("GPU-...") and PCI bus id of a CUDA
// device by its CUDA ordinal. NVML may number GPUs differently; the UUID is
// what ties the two together.
func CUDADeviceIdentity(dev Device) (uuid, pciBusID string, err error) {
	if dev.Kind != KindCUDA {
		return "", "", fmt.Errorf("memory: %s is not a CUDA device", dev)
	}
	if uuid, err = cuda.DeviceUUID(dev.Index); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	if pciBusID, err = cuda.DevicePCIBusID(dev.Index); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return uuid, pciBusID, nil
}

// CUDATotalMemory returns the memory of a CUDA device in bytes, or an error
// wrapping ErrNotSupported.
func CUDATotalMemory(dev Device) (int64, error) {
	if dev.Kind != KindCUDA {
		return 0, fmt.Errorf("memory: %s is not a CUDA device", dev)
	}
	n, err := cuda.TotalMem(dev.Index)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return n, nil
}

// HostMemory returns the host's physical memory in bytes.
func HostMemory() int64 { return hostMemory() }
