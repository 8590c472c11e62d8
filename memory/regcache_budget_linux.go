package memory

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes (RLIM_INFINITY as
// the largest uint64).
func memlockLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("memory: RLIMIT_MEMLOCK: %w", err)
	}
	return r.Cur, nil
}
