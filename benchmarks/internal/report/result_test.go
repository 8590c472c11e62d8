package report

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	in := []Result{
		{Bench: "transfer", Path: "raw-tcp", Size: 1 << 20, Metric: GBps, Value: 3.25, N: 9},
		{Bench: "transfer", Path: "tensorferry-staging", Size: 4 << 10, Metric: RTTP50Us, Value: 41.5, N: 100, Channel: "inline"},
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, in); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `{"bench":"transfer","path":"raw-tcp","size":1048576,"metric":"gbps","value":3.25,"n":9}`) {
		t.Fatalf("JSON: %s", buf.String())
	}
	out, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) || out[0] != in[0] || out[1] != in[1] {
		t.Fatalf("read back %+v, want %+v", out, in)
	}
	var tab bytes.Buffer
	if err := WriteTable(&tab, in); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1MiB", "4KiB", "3.25", "inline"} {
		if !strings.Contains(tab.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tab.String())
		}
	}
}

// ncclOutput is what nccl_sendrecv.py prints: a table, then JSON lines.
const ncclOutput = `peer                     bytes          us      GB/s
peer-copy-1proc        1048576        10.0    104.86
{"peer": "peer-copy-1proc", "bytes": 1048576, "us": 10.0, "GBps": 104.8576}
{"peer": "nccl-sendrecv", "bytes": 268435456, "us": 751.9, "GBps": 357.0}
`

func TestReadNCCL(t *testing.T) {
	rs, err := Read(strings.NewReader(ncclOutput))
	if err != nil {
		t.Fatal(err)
	}
	want := []Result{
		{Bench: "nccl", Path: "peer-copy-1proc", Size: 1 << 20, Metric: GBps, Value: 104.8576},
		{Bench: "nccl", Path: "peer-copy-1proc", Size: 1 << 20, Metric: LatencyUs, Value: 10},
		{Bench: "nccl", Path: "nccl-sendrecv", Size: 256 << 20, Metric: GBps, Value: 357},
		{Bench: "nccl", Path: "nccl-sendrecv", Size: 256 << 20, Metric: LatencyUs, Value: 751.9},
	}
	if len(rs) != len(want) {
		t.Fatalf("got %+v", rs)
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, rs[i], want[i])
		}
	}
}

func TestReadBad(t *testing.T) {
	for _, in := range []string{
		`{"bench":"transfer"`,
		`{"bench":"transfer","metric":"gbps","value":1}`,
		`{"peer":"nccl-sendrecv","bytes":1}`,
		`{"bench":"x","path":"y","metric":"z","value":"fast"}`,
	} {
		if _, err := Read(strings.NewReader("table line\n" + in + "\n")); !errors.Is(err, ErrBadLine) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: %v, want ErrBadLine at line 2", in, err)
		}
	}
}

func TestStats(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	if m := Median(ds); m != 3 {
		t.Errorf("median %v", m)
	}
	if p := Percentile(ds, 99); p != 5 {
		t.Errorf("p99 %v", p)
	}
	if Median(nil) != 0 {
		t.Error("median of nothing")
	}
	if bw := Bandwidth(2e9, time.Second); bw != 2 {
		t.Errorf("bandwidth %v", bw)
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(ncclOutput))
	f.Add([]byte(`{"bench":"transfer","path":"raw-tcp","size":1048576,"metric":"gbps","value":3.25,"n":9}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, r := range rs {
			if r.Bench == "" || r.Path == "" || r.Metric == "" {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}
