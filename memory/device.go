package memory

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is the kind of memory a Device names.
type Kind uint8

const (
	// KindHost is ordinary, pageable host memory.
	KindHost Kind = iota
	// KindPinned is page-locked host memory registered with the CUDA driver.
	KindPinned
	// KindCUDA is memory on a CUDA device.
	KindCUDA
)

// String returns "host", "pinned" or "cuda".
func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindPinned:
		return "pinned"
	case KindCUDA:
		return "cuda"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Device names where a buffer lives: the host ("cpu"), pinned host memory
// ("pinned"), or one CUDA device by ordinal ("cuda:0").
type Device struct {
	Kind  Kind
	Index int // CUDA ordinal; 0 for host kinds
}

// CPU is the host device.
var CPU = Device{Kind: KindHost}

// Pinned is page-locked host memory.
var Pinned = Device{Kind: KindPinned}

// CUDA returns the device "cuda:i".
func CUDA(i int) Device { return Device{Kind: KindCUDA, Index: i} }

// IsHost reports whether the CPU can address the device's memory directly
// (host or pinned).
func (d Device) IsHost() bool { return d.Kind == KindHost || d.Kind == KindPinned }

// String returns the device in the form ParseDevice accepts.
func (d Device) String() string {
	switch d.Kind {
	case KindHost:
		return "cpu"
	case KindPinned:
		return "pinned"
	case KindCUDA:
		return "cuda:" + strconv.Itoa(d.Index)
	}
	return fmt.Sprintf("device(%d:%d)", d.Kind, d.Index)
}

// ParseDevice parses "cpu", "pinned", "cuda" (meaning cuda:0) or "cuda:N".
func ParseDevice(s string) (Device, error) {
	switch s {
	case "cpu", "host":
		return CPU, nil
	case "pinned":
		return Pinned, nil
	case "cuda":
		return CUDA(0), nil
	}
	if rest, ok := strings.CutPrefix(s, "cuda:"); ok {
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 || n > 1023 {
			return Device{}, fmt.Errorf("memory: bad device %q: want cuda:N with N a GPU ordinal", s)
		}
		return CUDA(n), nil
	}
	return Device{}, fmt.Errorf("memory: unknown device %q: want cpu, pinned or cuda:N", s)
}

// MarshalText implements encoding.TextMarshaler.
func (d Device) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Device) UnmarshalText(b []byte) error {
	v, err := ParseDevice(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
