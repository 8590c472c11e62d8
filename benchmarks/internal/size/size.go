package size

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// units are the suffixes, largest first.
var units = []struct {
	suffix string
	mult   int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// Parse reads a byte count: a plain non-negative integer ("65536") or one
// with a KiB, MiB or GiB suffix ("64KiB", "16 MiB").
func Parse(s string) (int, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || num[0] == '+' {
		return 0, fmt.Errorf("size: bad size %q: want bytes as an integer or with a KiB, MiB or GiB suffix", s)
	}
	if n > math.MaxInt/mult || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size: %q is too large", s)
	}
	return int(n * mult), nil
}

// Format writes n bytes as Parse reads them, with the largest of the GiB,
// MiB and KiB suffixes that divides n exactly.
func Format(n int) string {
	for _, u := range units {
		if n != 0 && int64(n)%u.mult == 0 {
			return strconv.FormatInt(int64(n)/u.mult, 10) + u.suffix
		}
	}
	return strconv.Itoa(n)
}
