package size

import "testing"

func TestParseFormat(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		back string
	}{
		{"0", 0, "0"},
		{"1000", 1000, "1000"},
		{"65536", 64 << 10, "64KiB"},
		{"64KiB", 64 << 10, "64KiB"},
		{" 16 MiB ", 16 << 20, "16MiB"},
		{"1024MiB", 1 << 30, "1GiB"},
		{"3GiB", 3 << 30, "3GiB"},
		{"1536KiB", 1536 << 10, "1536KiB"},
	} {
		n, err := Parse(c.in)
		if err != nil || n != c.n {
			t.Errorf("Parse(%q) = %d, %v; want %d", c.in, n, err, c.n)
			continue
		}
		if got := Format(n); got != c.back {
			t.Errorf("Format(%d) = %q, want %q", n, got, c.back)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"", "KiB", "-1", "+5", "1.5MiB", "12 KB", "9223372036854775807GiB"} {
		if n, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, n)
		}
	}
}
