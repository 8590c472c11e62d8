package main

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/goleak"
)

// TestMain makes the test binary the receiving process when the sender
// re-executes it.
func TestMain(m *testing.M) {
	if isReceiver() {
		runReceiver()
		os.Exit(0)
	}
	if isExchanger() {
		runExchanger()
		os.Exit(0)
	}
	childArgs = func() []string { return []string{"-test.run=^$"} }
	os.Exit(m.Run())
}

// TestActorPairHost runs the two-process actor path with host tensors (the
// code of the ipc and staging modes, without a GPU): every figure is there
// and names the channel that carried it.
func TestActorPairHost(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := options{sizes: []int{4 << 10, 1 << 20}, reps: 2, timeout: 30 * time.Second}
	p, err := openPair(pairConfig{src: memory.CPU, dst: memory.CPU, disable: []string{rdma.IPC}, timeout: o.timeout})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := measure(o, []pathMaker{actorPath(pathIPC, p, memory.CPU), streamPath(pathIPCStream, p, memory.CPU, 4)})
	if cerr := p.close(); cerr != nil {
		t.Errorf("close: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if name := renamePath(rs, pathIPC); name != "tensorferry-staging" {
		t.Errorf("path renamed to %q, want tensorferry-staging", name)
	}
	if name := renamePath(rs, pathIPCStream); name != "tensorferry-staging-stream" {
		t.Errorf("stream path renamed to %q, want tensorferry-staging-stream", name)
	}
	want := map[string]string{ // size/metric → channel
		"4096/gbps": "inline", "4096/us": "inline",
		"1048576/gbps": "staging", "1048576/us": "staging", "1048576/fetch_gbps": "staging",
	}
	for k, v := range maps.Clone(want) {
		if !strings.HasSuffix(k, "fetch_gbps") { // fetches overlap in a stream
			want["stream/"+k] = v
		}
	}
	for _, r := range rs {
		k := fmt.Sprintf("%d/%s", r.Size, r.Metric)
		if r.Path == "tensorferry-staging-stream" {
			k = "stream/" + k
		}
		ch, ok := want[k]
		if !ok || r.Channel != ch || r.Value <= 0 || r.N != 2 || r.Bench != "gpu" {
			t.Errorf("unexpected figure %+v", r)
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("missing figures %v", want)
	}
}

// TestNoGPU checks the skip reason on a machine without a GPU.
func TestNoGPU(t *testing.T) {
	n, why := gpuCount()
	if n > 0 {
		t.Skipf("this machine has %d GPUs", n)
	}
	if !strings.Contains(why, "cuda") {
		t.Errorf("skip reason %q does not come from the CUDA driver", why)
	}
}

func TestOptions(t *testing.T) {
	ss, err := sizes("64KiB", "16MiB")
	if err != nil || len(ss) != 3 || ss[0] != 64<<10 || ss[2] != 16<<20 {
		t.Errorf("sizes: %v, %v", ss, err)
	}
	if _, err := sizes("2GiB", "4GiB"); err == nil {
		t.Error("sizes: no error for an empty range")
	}
	o := options{src: 0, dst: 1}
	for _, c := range []struct {
		mode string
		gpus int
		ok   bool
	}{{"peer", 1, false}, {"ipc", 2, true}, {"ipc", 1, true}, {"staging", 1, true}, {"regcache", 1, true}} {
		if got := needs(c.mode, c.gpus, o) == ""; got != c.ok {
			t.Errorf("%s on %d GPUs: runs %v, want %v", c.mode, c.gpus, got, c.ok)
		}
	}
	for _, m := range []string{"staging", "ipc"} {
		if got := fitDevices(m, 1, o); got.dst != 0 {
			t.Errorf("%s on one GPU receives on cuda:%d", m, got.dst)
		}
	}
	if got := fitDevices("ipc", 2, o); got.dst != 1 {
		t.Errorf("ipc on two GPUs receives on cuda:%d", got.dst)
	}
	if repsFor(options{}, 1<<30) != 5 || repsFor(options{}, 4<<10) != 200 || repsFor(options{reps: 3}, 1<<30) != 3 {
		t.Error("repsFor")
	}
}

func TestSummary(t *testing.T) {
	g := func(path string, size int64, metric string, v float64) report.Result {
		return report.Result{Bench: "gpu", Path: path, Size: size, Metric: metric, Value: v}
	}
	rs := []report.Result{
		g(pathPeer, 256<<20, report.GBps, 400),
		g("tensorferry-ipc", 256<<20, report.GBps, 380),
		g("tensorferry-ipc-stream", 256<<20, report.GBps, 390),
		g(pathStagingGPU, 64<<20, report.GBps, 9),
		g(pathRawTCP, 64<<20, report.GBps, 10),
		g(pathNaive, 64<<20, report.GBps, 3),
		g(pathRegH2D, 256<<20, "first_ms", 20),
		g(pathRegH2D, 256<<20, "repeat_ms", 5),
	}
	nccl := []report.Result{{Bench: "nccl", Path: "nccl-sendrecv", Size: 256 << 20, Metric: report.GBps, Value: 357}}
	got := strings.Join(summary(rs, nccl), "\n")
	for _, want := range []string{"tensorferry-ipc 256MiB: 380.0 GB/s = 95.0 % of cuMemcpyPeer", "tensorferry-ipc 256MiB: 380.0 GB/s vs NCCL 357.0 GB/s = 1.06× (target ≥ 1×)",
		"tensorferry-ipc-stream 256MiB: 390.0 GB/s = 97.5 % of cuMemcpyPeer", "90.0 % of raw TCP", "3.00× the naive", "first 20.00 ms, repeated 5.00 ms"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

func TestFloors(t *testing.T) {
	o := options{sizes: []int{4 << 10, 1 << 20}}
	g := func(path string, size int64, v float64) report.Result {
		return report.Result{Bench: "gpu", Path: path, Size: size, Metric: report.LatencyUs, Value: v, N: 10}
	}
	rs := []report.Result{
		g("tensorferry-ipc", 4<<10, 60), g("tensorferry-ipc-stream", 4<<10, 10),
		g(pathCopySync, 4<<10, 10), g(pathRawRTT, 4<<10, 20),
		g("tensorferry-ipc", 1<<20, 90), g(pathCopySync, 1<<20, 20), // no round trip at 1 MiB: no floor
	}
	out := withFloors(o, rs)
	var floor, x []report.Result
	for _, r := range out {
		switch {
		case r.Path == pathFloor:
			floor = append(floor, r)
		case r.Metric == metricXFloor:
			x = append(x, r)
		}
	}
	if len(floor) != 1 || floor[0].Size != 4<<10 || floor[0].Value != 30 {
		t.Fatalf("floors %+v, want 30 µs at 4 KiB only", floor)
	}
	if len(x) != 1 || x[0].Path != "tensorferry-ipc" || x[0].Value != 2 {
		t.Fatalf("ratios %+v, want tensorferry-ipc at 2×", x)
	}
	lines := floorLines(out)
	if len(lines) != 1 || !strings.Contains(lines[0], "2.00× its floor of 30.0 µs") {
		t.Errorf("summary lines %q", lines)
	}
}

// TestReuseHost runs the reuse mode's two paths with host tensors: both
// deliver the bytes (the first step checks them), and the receiver that
// reuses its destination allocates no tensor for a message.
func TestReuseHost(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := options{sizes: []int{1 << 20, 4 << 20}, reps: 3, timeout: 30 * time.Second}
	rs, err := measureReuse(o, pairConfig{src: memory.CPU, dst: memory.CPU, disable: []string{rdma.IPC}, timeout: o.timeout})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rs {
		if r.Value <= 0 || r.N != 3 || r.Channel != "staging" {
			t.Errorf("figure %+v", r)
		}
		got[r.Path]++
	}
	if got[pathReuse] == 0 || got[pathAlloc] == 0 {
		t.Errorf("figures by path %v, want both %s and %s", got, pathReuse, pathAlloc)
	}
}

func TestDestPool(t *testing.T) {
	p := &destPool{dev: memory.CPU}
	defer p.close()
	d := &tensor.Descriptor{DType: tensor.Uint8, Shape: tensor.Shape{1 << 20}, Bytes: 1 << 20}
	a := p.get(&Msg{}, d)
	if a == nil || p.get(&Msg{}, d) != a {
		t.Fatal("a second message of the same shape gets another destination")
	}
	if p.get(&Ack{}, d) != nil {
		t.Error("a destination for an Ack")
	}
	d2 := &tensor.Descriptor{DType: tensor.Uint8, Shape: tensor.Shape{2 << 20}, Bytes: 2 << 20}
	if b := p.get(&Msg{}, d2); b == nil || b.ByteSize() != 2<<20 {
		t.Errorf("destination %v for %v", b, d2.Shape)
	}
}

// TestExchangeHost runs the psexchange mode with host tensors on three
// processes: every step checks the bytes each shard and worker got the
// first time, and the figures name the channel.
func TestExchangeHost(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := options{psSizes: []int{1 << 20, 3 << 20}, reps: 2, timeout: 30 * time.Second}
	rs, err := measureExchange(o, []memory.Device{memory.CPU, memory.CPU, memory.CPU})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2*len(o.psSizes) {
		t.Fatalf("%d figures, want %d: %v", len(rs), 2*len(o.psSizes), rs)
	}
	for _, r := range rs {
		if r.Path != pathExchange+"-3gpu" || r.Value <= 0 || r.N != 2 || r.Channel != "staging" {
			t.Errorf("figure %+v", r)
		}
	}
}

// TestFanoutHost runs the fanout mode's code with host tensors: one
// tensor lent to three actors of the receiving process, relay on and off,
// each receiver's bytes checked; both paths report their figures.
func TestFanoutHost(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := options{sizes: []int{8 << 20}, reps: 2, timeout: 30 * time.Second}
	var rs []report.Result
	for _, noRelay := range []bool{false, true} {
		path := map[bool]string{false: pathFanoutRelay, true: pathFanoutNoRelay}[noRelay]
		got, err := measureFanout(o, path, pairConfig{src: memory.CPU, dst: memory.CPU, disable: []string{rdma.IPC},
			timeout: o.timeout, sinks: 3, noRelay: noRelay, relayMin: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, got...)
	}
	want := map[string]bool{pathFanoutRelay + "/gbps": true, pathFanoutRelay + "/us": true, pathFanoutNoRelay + "/gbps": true, pathFanoutNoRelay + "/us": true}
	for _, r := range rs {
		k := r.Path + "/" + r.Metric
		t.Logf("%s %s = %.1f (%s)", r.Path, r.Metric, r.Value, r.Channel)
		if want := map[string]string{pathFanoutRelay: "relay", pathFanoutNoRelay: "staging"}[r.Path]; r.Channel != want {
			t.Errorf("%s: channel %s, want %s", r.Path, r.Channel, want)
		}
		if !want[k] || r.Value <= 0 || r.N != 2 || r.Size != 8<<20 {
			t.Errorf("unexpected figure %+v", r)
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("missing figures %v", want)
	}
}
