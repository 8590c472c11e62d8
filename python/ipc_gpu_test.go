package python_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/ipc"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// gpuPython returns the interpreter whose torch sees a GPU, or skips the
// test saying why (no CUDA device, ipc not viable, no torch with CUDA).
func gpuPython(t *testing.T) string {
	t.Helper()
	if n, err := memory.CUDADeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device: %v", err)
	}
	if err := ipc.Available(); err != nil {
		t.Skipf("the ipc channel cannot run here: %v", err)
	}
	py := python(t)
	if out, err := exec.Command(py, "-c", "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'").CombinedOutput(); err != nil {
		t.Skipf("%s: torch without CUDA: %v: %s", py, err, out)
	}
	return py
}

// gpuScaleProps answers a Vec whose X is on a GPU with X times Scale on
// cuda:0, its Note naming the device X arrived on.
func gpuScaleProps() *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		v, ok := c.Message().(*Vec)
		if !ok {
			return
		}
		ctx := context.Background()
		h, err := v.X.To(ctx, memory.CPU)
		if err != nil {
			panic(err)
		}
		defer h.Free()
		x := h.Float32s()
		out := make([]float32, len(x))
		for i := range x {
			out[i] = x[i] * float32(v.Scale)
		}
		y, err := tensor.FromFloat32s(out, v.X.Shape())
		if err != nil {
			panic(err)
		}
		defer y.Free()
		yd, err := y.To(ctx, memory.CUDA(0))
		if err != nil {
			panic(err)
		}
		c.Respond(&Vec{Scale: v.Scale, X: yd, Note: "scaled on " + v.X.Device().String()})
	})
}

// gpuCluster runs a Go node on cuda:0 with the actor "gpuscale" and a
// PyTorch process on the same host, with env added to the process's.
func gpuCluster(t *testing.T, env ...string) (*actor.Node, *config.Config, *peer) {
	gpuPython(t)
	cfg, err := config.LocalConfig("pyipc", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Nodes[0].Devices = []memory.Device{memory.CUDA(0)}
	p := startPeer(t, cfg, 1, 0, env...)
	node := startGoWith(t, cfg, zap.NewNop(), "gpuscale", gpuScaleProps())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.WaitPeer(ctx, cfg.Nodes[1].Name); err != nil {
		t.Fatal(err)
	}
	p.do("wait", "ok wait")
	t.Log(p.do("ipc", "ipc running"))
	return node, cfg, p
}

// TestPythonIPC runs a Go node on cuda:0 and a PyTorch process on the same
// host: CUDA tensors go Go → Python and Python → Go over ipc (each side
// opens the other's CUDA IPC handles), checked byte for byte, and both
// sides report the channel "ipc".
func TestPythonIPC(t *testing.T) {
	node, cfg, p := gpuCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// Go → Python and back: Python's handler doubles on its GPU.
	pid := node.PID(cfg.Nodes[1].Name, "gpudouble")
	var moved int64
	for _, n := range []int{7, 1 << 10, 1<<18 + 3, 16 << 20} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%1013) - 500.5
		}
		host, err := tensor.FromFloat32s(x, tensor.Shape{int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		xd, err := host.To(ctx, memory.CUDA(0))
		_ = host.Free()
		if err != nil {
			t.Fatal(err)
		}
		before := node.Stats().Channels["ipc"].Bytes
		res, err := node.Request(ctx, pid, &Vec{Scale: 2, X: xd, Note: "from go"})
		if err != nil {
			t.Fatalf("%d floats to python: %v", n, err)
		}
		v, ok := res.(*Vec)
		if !ok || v.Note != "doubled on cuda:0" {
			t.Fatalf("%d floats: reply %#v (the python handler must get the tensor on its GPU)", n, res)
		}
		if v.X.Device() != memory.CUDA(0) {
			t.Fatalf("%d floats: the reply landed on %s", n, v.X.Device())
		}
		back, err := v.X.To(ctx, memory.CPU)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, n)
		for i := range x {
			want[i] = 2 * x[i]
		}
		wb, _ := tensor.FromFloat32s(want, tensor.Shape{int64(n)})
		if !bytes.Equal(back.Host(), wb.Host()) {
			t.Fatalf("%d floats: the reply's bytes differ from 2x", n)
		}
		_, _, _ = back.Free(), wb.Free(), v.X.Free()
		if got := node.Stats().Channels["ipc"].Bytes - before; got != int64(4*n) {
			t.Fatalf("%d floats: the go node fetched %d bytes over ipc, want %d (channels %v)", n, got, 4*n, node.Stats().Channels)
		}
		if err := xd.WaitReleased(ctx); err != nil {
			t.Fatalf("%d floats: the python node did not release the tensor it fetched: %v", n, err)
		}
		_ = xd.Free()
		moved += int64(4 * n)
	}
	var transfers [][]any
	l := p.do("transfers", "transfers")
	if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "transfers ")), &transfers); err != nil {
		t.Fatalf("%s: %v", l, err)
	}
	var viaIPC float64
	for _, tr := range transfers {
		if tr[0] != "ipc" {
			t.Fatalf("python fetched over %v: %s", tr[0], l)
		}
		viaIPC += tr[2].(float64)
	}
	if int64(viaIPC) != moved {
		t.Fatalf("python fetched %v bytes over ipc, want %d: %s", viaIPC, moved, l)
	}

	// Python → Go and back, started by the Python side: Go fetches the
	// request's tensor over ipc, Python the reply's (it lands on its GPU
	// only through ipc; staging gives host memory).
	for _, n := range []int{1000, 4 << 20} {
		before := node.Stats().Channels["ipc"].Bytes
		p.do(fmt.Sprintf("gpurequest %d", n), "ok gpurequest")
		if got := node.Stats().Channels["ipc"].Bytes - before; got != int64(4*n) {
			t.Fatalf("gpurequest %d: the go node fetched %d bytes over ipc, want %d", n, got, 4*n)
		}
	}
	if l := p.do("warnings", "warnings"); l != "warnings []" {
		t.Fatalf("python node: %s", l)
	}
}

// TestPythonIPCExpandableSegments runs the PyTorch process with the
// caching allocator's expandable segments, whose memory has no legacy CUDA
// IPC handle: its tensors are refused by its ipc channel with an error
// that says why and served through staging instead, while the Go node's
// tensors still reach it over ipc.
func TestPythonIPCExpandableSegments(t *testing.T) {
	node, _, p := gpuCluster(t, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
	before := node.Stats().Channels
	p.do("gpurequest 300000", "ok gpurequest")
	after := node.Stats().Channels
	if got := after["staging"].Bytes - before["staging"].Bytes; got != 4*300000 {
		t.Fatalf("the go node fetched %d bytes over staging, want %d (channels %v)", got, 4*300000, after)
	}
	if l := p.do("warnings", "warnings"); !strings.Contains(l, "expandable segments") {
		t.Fatalf("python node: %s (want the refusal that names expandable segments)", l)
	}
}
