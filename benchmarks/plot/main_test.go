package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
)

// writeFixture writes a small transfer run and an NCCL script output.
func writeFixture(t *testing.T) (transfer, nccl string) {
	t.Helper()
	dir := t.TempDir()
	transfer = filepath.Join(dir, "transfer.jsonl")
	var rs []report.Result
	for i, size := range []int64{4 << 10, 1 << 20, 64 << 20} {
		rs = append(rs,
			report.Result{Bench: "transfer", Path: "raw-tcp", Size: size, Metric: report.GBps, Value: float64(i + 1)},
			report.Result{Bench: "transfer", Path: "tensorferry-staging", Size: size, Metric: report.GBps, Value: float64(i) + 0.5},
			report.Result{Bench: "transfer", Path: "tensorferry-staging", Size: size, Metric: report.LatencyUs, Value: 100},
		)
	}
	rs = append(rs, report.Result{Bench: "gpu", Path: "cuMemcpyPeer", Size: 1 << 20, Metric: report.GBps, Value: 300})
	var buf bytes.Buffer
	if err := report.WriteJSON(&buf, rs); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(transfer, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	nccl = filepath.Join(dir, "nccl.txt")
	out := "peer  bytes  us  GB/s\n" +
		`{"peer": "nccl-sendrecv", "bytes": 1048576, "us": 56.0, "GBps": 18.7}` + "\n" +
		`{"peer": "nccl-sendrecv", "bytes": 268435456, "us": 751.9, "GBps": 357.0}` + "\n"
	if err := os.WriteFile(nccl, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return transfer, nccl
}

func TestDraw(t *testing.T) {
	transfer, nccl := writeFixture(t)
	dir := t.TempDir()
	for _, c := range []struct {
		bench, out string
		in         []string
		want       []string // in the SVG
	}{
		{"transfer", "t.svg", []string{transfer}, []string{"raw-tcp", "tensorferry-staging", "4KiB", "1MiB", "16MiB"}},
		{"gpu", "g.svg", []string{transfer, nccl}, []string{"cuMemcpyPeer", "nccl-sendrecv"}},
		{"transfer", "t.png", []string{transfer}, nil},
	} {
		out := filepath.Join(dir, c.out)
		if err := draw1(settings{in: c.in, out: out, bench: c.bench, metric: report.GBps}); err != nil {
			t.Fatalf("%s: %v", c.out, err)
		}
		b, err := os.ReadFile(out)
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %d bytes, %v", c.out, len(b), err)
		}
		if strings.HasSuffix(c.out, ".png") {
			if _, err := png.Decode(bytes.NewReader(b)); err != nil {
				t.Fatalf("%s: not a PNG: %v", c.out, err)
			}
		}
		for _, w := range c.want {
			if !bytes.Contains(b, []byte(w)) {
				t.Errorf("%s lacks %q", c.out, w)
			}
		}
		if c.bench == "transfer" && bytes.Contains(b, []byte("cuMemcpyPeer")) {
			t.Errorf("%s draws the gpu results", c.out)
		}
	}
}

func TestDrawPaths(t *testing.T) {
	transfer, _ := writeFixture(t)
	out := filepath.Join(t.TempDir(), "p.svg")
	if err := draw1(settings{in: []string{transfer}, out: out, bench: "transfer", metric: report.GBps, paths: []string{"raw-tcp"}, logY: true}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("raw-tcp")) || bytes.Contains(b, []byte("tensorferry-staging")) {
		t.Errorf("--paths raw-tcp drew the wrong lines")
	}
}

func TestDrawErrors(t *testing.T) {
	transfer, _ := writeFixture(t)
	dir := t.TempDir()
	for _, s := range []settings{
		{out: filepath.Join(dir, "a.svg"), metric: report.GBps},
		{in: []string{filepath.Join(dir, "missing.jsonl")}, out: filepath.Join(dir, "a.svg"), metric: report.GBps},
		{in: []string{transfer}, out: filepath.Join(dir, "a.svg"), bench: "nothing", metric: report.GBps},
		{in: []string{transfer}, out: filepath.Join(dir, "a.txt"), metric: report.GBps},
	} {
		if err := draw1(s); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
}

func TestSeries(t *testing.T) {
	rs := []report.Result{
		{Bench: "gpu", Path: "a", Size: 2, Metric: report.GBps, Value: 1},
		{Bench: "gpu", Path: "a", Size: 1, Metric: report.GBps, Value: 2},
		{Bench: "gpu", Path: "a", Size: 2, Metric: report.GBps, Value: 3}, // later wins
		{Bench: "nccl", Path: "n", Size: 1, Metric: report.GBps, Value: 4},
		{Bench: "transfer", Path: "t", Size: 1, Metric: report.GBps, Value: 5},
		{Bench: "gpu", Path: "a", Size: 0, Metric: report.GBps, Value: 5}, // no size
		{Bench: "gpu", Path: "a", Size: 4, Metric: report.LatencyUs, Value: 5},
	}
	ls := series(rs, "gpu", report.GBps)
	if len(ls) != 2 || ls[0].path != "a" || ls[1].path != "n" {
		t.Fatalf("lines %+v", ls)
	}
	if p := ls[0].pts; len(p) != 2 || p[0].X != 1 || p[0].Y != 2 || p[1].X != 2 || p[1].Y != 3 {
		t.Fatalf("points %+v", p)
	}
}

// TestByReceivers: at one size, a line per path against its receivers,
// and a baseline without receivers flat across their range; other sizes
// and metrics are left out.
func TestByReceivers(t *testing.T) {
	rs := []report.Result{
		{Bench: "gpu", Path: "relay", Size: 8, Metric: report.LatencyUs, Value: 30, Receivers: 3},
		{Bench: "gpu", Path: "relay", Size: 8, Metric: report.LatencyUs, Value: 10, Receivers: 1},
		{Bench: "gpu", Path: "relay", Size: 4, Metric: report.LatencyUs, Value: 99, Receivers: 2},
		{Bench: "gpu", Path: "relay", Size: 8, Metric: report.GBps, Value: 99, Receivers: 2},
		{Bench: "nccl", Path: "nccl-broadcast", Size: 8, Metric: report.LatencyUs, Value: 7},
	}
	ls := byReceivers(rs, "gpu", report.LatencyUs, 8)
	if len(ls) != 2 || ls[0].path != "relay" || ls[1].path != "nccl-broadcast" {
		t.Fatalf("lines %+v", ls)
	}
	if p := ls[0].pts; len(p) != 2 || p[0].X != 1 || p[0].Y != 10 || p[1].X != 3 || p[1].Y != 30 {
		t.Fatalf("relay %+v", p)
	}
	if p := ls[1].pts; len(p) != 2 || p[0].X != 1 || p[1].X != 3 || p[0].Y != 7 || p[1].Y != 7 {
		t.Fatalf("baseline %+v", p)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "r.jsonl")
	f, err := os.Create(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := report.WriteJSON(f, rs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out := filepath.Join(dir, "n.svg")
	if err := draw1(settings{in: []string{in}, out: out, bench: "gpu", metric: report.LatencyUs, atSize: 8}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v, %v", st, err)
	}
}
