//go:build !linux || !cgo

package nvml

import "fmt"

// Probe reports that NVML is not available in this build.
func Probe() (Snapshot, error) {
	return Snapshot{}, fmt.Errorf("%w: not supported in this build (needs linux and cgo)", ErrUnavailable)
}
