package pipe

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor-go's dead-letter log throttle runs a timer goroutine
		// that outlives ActorSystem.Shutdown by up to its interval.
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}

func startCluster(t *testing.T, devs ...memory.Device) []*actor.Node {
	t.Helper()
	cc, err := config.LocalConfig("pipe-test", 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range devs {
		cc.Nodes[i].Devices = []memory.Device{d}
	}
	// LocalConfig declares a node down after 500ms of silence, which a
	// loaded machine (or the race detector) can exceed: use the defaults.
	def := config.DefaultConfig()
	cc.HeartbeatInterval, cc.FailureTimeout = def.HeartbeatInterval, def.FailureTimeout
	var nodes []*actor.Node
	for _, nc := range cc.Nodes {
		n, err := actor.NewNode(cc, nc.Name, actor.WithLogger(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
		nodes = append(nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return nodes
}

// smallConfig has 32×520 float32 activations (66560 bytes): just above the
// 64 KiB inline threshold, so every activation moves out of band.
func smallConfig() Config {
	return Config{Batches: 6, Rows: 32, Dim: 520, Out: 16, InFlight: 4, Seed: 3}
}

func TestPipeline(t *testing.T) {
	nodes := startCluster(t)
	cfg := smallConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	calls := 0
	res, err := Run(ctx, nodes, cfg, func(BatchResult) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 0 || calls != cfg.Batches {
		t.Fatalf("%d failed, %d progress calls: %+v", res.Failed, calls, res.Batches)
	}
	for i, r := range res.Batches {
		if r.Batch != i || !r.OK || r.Err != nil || r.Latency <= 0 {
			t.Errorf("batch %d: %+v", i, r)
		}
	}
	act := int64(cfg.Rows * cfg.Dim * 4)
	n := int64(cfg.Batches)
	// node0 fetched the inputs; node1 only stage 1's activation (the
	// forwarded Ref moved no bytes there); node2 the forwarded Ref, from
	// node0, and stage 2's activation.
	for i, want := range []int64{n, n, 2 * n} {
		st := nodes[i].Stats().Channels["staging"]
		if st.Transfers != want || st.Bytes != want*act {
			t.Errorf("%s: staging %+v, want %d transfers of %d bytes", nodes[i].Name(), st, want, act)
		}
	}
	for _, n := range nodes {
		if l := n.Stats().Exports; l != 0 {
			t.Errorf("%s: %d exports left", n.Name(), l)
		}
	}
}

// TestPipelineGPU runs the stages on cuda:0, cuda:1 (cuda:0 on a one-GPU
// host) and cuda:0: activations travel GPU to GPU, and every output still
// equals the host reference bit for bit.
func TestPipelineGPU(t *testing.T) {
	if _, err := memory.AllocatorFor(memory.CUDA(0)); err != nil {
		t.Skipf("no CUDA device here: %v", err)
	}
	second := memory.CUDA(0)
	if n, err := memory.CUDADeviceCount(); err == nil && n > 1 {
		second = memory.CUDA(1)
	}
	nodes := startCluster(t, memory.CUDA(0), second, memory.CUDA(0))
	cfg := smallConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, nodes, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 0 {
		t.Fatalf("%d failed: %+v", res.Failed, res.Batches)
	}
	// node1 and node2 fetched activations that live on GPUs, over ipc.
	for _, n := range nodes[1:] {
		st := n.Stats().Channels["ipc"]
		t.Logf("%s: %+v", n.Name(), n.Stats().Channels)
		if st.Transfers == 0 {
			t.Errorf("%s fetched nothing over ipc: %+v", n.Name(), n.Stats().Channels)
		}
	}
	for _, n := range nodes {
		if l := n.Stats().Exports; l != 0 {
			t.Errorf("%s: %d exports left", n.Name(), l)
		}
	}
}

func TestRunRejects(t *testing.T) {
	nodes := startCluster(t)
	if _, err := Run(context.Background(), nodes[:2], smallConfig(), nil); err == nil {
		t.Error("ran on two nodes")
	}
	if _, err := Run(context.Background(), []*actor.Node{nodes[0], nodes[1], nodes[0]}, smallConfig(), nil); err == nil {
		t.Error("ran with a node twice")
	}
	bad := smallConfig()
	bad.InFlight = 0
	if _, err := Run(context.Background(), nodes, bad, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("InFlight 0: %v", err)
	}
}

// check finds a single differing element, a stage's error and a wrong batch.
func TestCheck(t *testing.T) {
	cfg := smallConfig()
	mk := func(b int, flip int) *Output {
		want := Reference(&cfg, b)
		if flip >= 0 {
			want[flip] = math.Nextafter32(want[flip], float32(math.Inf(1)))
		}
		y, err := tensor.FromFloat32s(want, tensor.Shape{int64(cfg.Rows), int64(cfg.Out)})
		if err != nil {
			t.Fatal(err)
		}
		return &Output{Batch: b, Y: y}
	}
	if err := check(&cfg, 1, mk(1, -1), nil); err != nil {
		t.Errorf("equal output: %v", err)
	}
	if err := check(&cfg, 1, mk(1, 37), nil); err == nil || !strings.Contains(err.Error(), "output[37]") {
		t.Errorf("one element off: %v", err)
	}
	if err := check(&cfg, 2, mk(1, -1), nil); err == nil {
		t.Error("answer for another batch accepted")
	}
	if err := check(&cfg, 1, &Output{Batch: 1, Err: "pipe: stage 2: boom"}, nil); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("stage error: %v", err)
	}
}
