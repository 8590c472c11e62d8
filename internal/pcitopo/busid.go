package pcitopo

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// BusID is a PCI address: domain, bus, device (slot) and function.
type BusID struct {
	Domain   uint32
	Bus      uint8
	Device   uint8 // 0..31
	Function uint8 // 0..7
}

// ErrBadBusID is wrapped by ParseBusID's errors.
var ErrBadBusID = errors.New("pcitopo: malformed PCI bus id")

// ParseBusID reads a PCI address in any of the forms the tools print:
// "0000:06:00.0" (sysfs, CUDA), "00000000:06:00.0" (NVML, nvidia-smi) or
// "06:00.0" (lspci, domain 0); hex digits in either case.
func ParseBusID(s string) (BusID, error) {
	bad := func(why string) (BusID, error) {
		return BusID{}, fmt.Errorf("%w %q: %s", ErrBadBusID, s, why)
	}
	if len(s) > 32 {
		return bad("too long")
	}
	parts := strings.Split(s, ":")
	var dom string
	switch len(parts) {
	case 2:
		dom = "0"
	case 3:
		dom = parts[0]
		parts = parts[1:]
	default:
		return bad("want [domain:]bus:device.function")
	}
	busStr := parts[0]
	devStr, fnStr, ok := strings.Cut(parts[1], ".")
	if !ok {
		return bad("no function number")
	}
	d, err := hexField(dom, 8, 32)
	if err != nil {
		return bad("domain: " + err.Error())
	}
	b, err := hexField(busStr, 2, 8)
	if err != nil {
		return bad("bus: " + err.Error())
	}
	dev, err := hexField(devStr, 2, 8)
	if err != nil || dev > 31 {
		return bad("device: want 00..1f")
	}
	fn, err := hexField(fnStr, 1, 8)
	if err != nil || fn > 7 {
		return bad("function: want 0..7")
	}
	return BusID{Domain: uint32(d), Bus: uint8(b), Device: uint8(dev), Function: uint8(fn)}, nil
}

// hexField parses 1..maxDigits hex digits (no sign, no prefix).
func hexField(s string, maxDigits, bits int) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("want 1 to %d hex digits", maxDigits)
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return 0, errors.New("not hex")
		}
	}
	return strconv.ParseUint(s, 16, bits)
}

// String returns the sysfs form, "0000:06:00.0" (at least four domain
// digits, lower case), the name of the device's directory under
// /sys/bus/pci/devices.
func (b BusID) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", b.Domain, b.Bus, b.Device, b.Function)
}
