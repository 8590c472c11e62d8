package config

import "fmt"

// Switch turns one of the control path's fast paths on or off, or leaves
// it to its default (SwitchAuto, the zero value), which each field that
// has one describes. Where the default depends on the host (the fast paths
// that pay only with processors to spare), the environment variable
// TENSORFERRY_FASTPATHS=on makes it on everywhere (package
// internal/fastpath); an explicit SwitchOff stays off. YAML: auto, on or
// off (true and false too).
type Switch int8

// Values of a Switch.
const (
	SwitchAuto Switch = iota
	SwitchOn
	SwitchOff
)

// On reports whether s is on, where SwitchAuto is def.
func (s Switch) On(def bool) bool {
	switch s {
	case SwitchOn:
		return true
	case SwitchOff:
		return false
	}
	return def
}

// String returns auto, on or off, as YAML spells s.
func (s Switch) String() string {
	switch s {
	case SwitchAuto:
		return "auto"
	case SwitchOn:
		return "on"
	case SwitchOff:
		return "off"
	}
	return fmt.Sprintf("Switch(%d)", int8(s))
}

// parseSwitch reads a Switch as YAML spells it.
func parseSwitch(s string) (Switch, bool) {
	switch s {
	case "auto":
		return SwitchAuto, true
	case "on", "true":
		return SwitchOn, true
	case "off", "false":
		return SwitchOff, true
	}
	return SwitchAuto, false
}

func (s Switch) valid() bool { return s >= SwitchAuto && s <= SwitchOff }
