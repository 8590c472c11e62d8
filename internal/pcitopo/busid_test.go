package pcitopo

import (
	"errors"
	"strings"
	"testing"
)

func TestParseBusID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" for an error
	}{
		{"0000:06:00.0", "0000:06:00.0"},
		{"00000000:1B:00.0", "0000:1b:00.0"}, // NVML
		{"06:00.0", "0000:06:00.0"},          // lspci
		{"0001:af:1f.7", "0001:af:1f.7"},
		{"10000:e0:00.0", "10000:e0:00.0"}, // Intel VMD domain
		{"ffffffff:ff:1f.7", "ffffffff:ff:1f.7"},
		{"0000:06:20.0", ""}, // device > 31
		{"0000:06:00.8", ""}, // function > 7
		{"000000000:06:00.0", ""},
		{"0000:106:00.0", ""},
		{"0000:06:00", ""},
		{"0000:06.00.0", ""},
		{"0000:0g:00.0", ""},
		{"0000:+6:00.0", ""},
		{"0000:-1:00.0", ""},
		{"0000::00.0", ""},
		{"0000:06:00.", ""},
		{"a:b:c:d.0", ""},
		{"", ""},
		{"pci0000:00", ""},
		{strings.Repeat("0", 40) + ":06:00.0", ""},
	} {
		id, err := ParseBusID(tc.in)
		if tc.want == "" {
			if err == nil || !errors.Is(err, ErrBadBusID) {
				t.Errorf("%q: %v, %v; want ErrBadBusID", tc.in, id, err)
			}
			continue
		}
		if err != nil || id.String() != tc.want {
			t.Errorf("%q: %v, %v; want %s", tc.in, id, err, tc.want)
		}
	}
}

// FuzzParseBusID: never panics; what parses prints in a form that parses
// to the same id.
func FuzzParseBusID(f *testing.F) {
	for _, s := range []string{"0000:06:00.0", "00000000:1B:00.0", "06:00.0", "10000:e0:00.0", "0000:06:20.0", "::.", "pci0000:00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseBusID(s)
		if err != nil {
			return
		}
		again, err := ParseBusID(id.String())
		if err != nil || again != id {
			t.Fatalf("%q → %v → %q → %v, %v", s, id, id.String(), again, err)
		}
	})
}
