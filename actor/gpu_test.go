package actor_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// gpus returns the number of CUDA devices or skips the test.
func gpus(t *testing.T) int {
	t.Helper()
	n, err := memory.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA device: %v", err)
	}
	return n
}

// gpuProcessCluster runs node0 here on cuda:0 and node1 as a child process
// on cuda:1 (cuda:0 with one GPU).
func gpuProcessCluster(t *testing.T, disable []string) (*actor.Node, memory.Device) {
	n := gpus(t)
	if testing.Short() {
		t.Skip("starts processes")
	}
	cfg, err := config.LocalConfig("gpu", 2)
	if err != nil {
		t.Fatal(err)
	}
	dst := memory.CUDA(min(1, n-1))
	cfg.Nodes[0].Devices = []memory.Device{memory.CUDA(0)}
	cfg.Nodes[1].Devices = []memory.Device{dst}
	cfg.DisableChannels = disable
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	startChild(t, path, "node1")
	a, err := actor.NewNode(cfg, "node0", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	return a, dst
}

// sendGPUTensors sends device tensors of several sizes to node1 and checks
// the bytes and the channel that moved each: wantChannel for those above
// the inline threshold, and for the small ones too when smallDirect (a
// small device tensor to a peer of the same host goes device to device,
// see transfer.Config.InlineDevice); else the small ones go inline.
func sendGPUTensors(t *testing.T, a *actor.Node, wantChannel string, smallDirect bool) {
	rng := rand.New(rand.NewPCG(9, 10))
	pid := a.PID("node1", "tensors")
	var prev map[string]int64
	for _, shape := range []tensor.Shape{{7}, {1 << 16}, {1<<20 + 3}, {64 << 20}} {
		host := randomTensor(t, rng, tensor.Uint8, shape)
		x, err := host.To(context.Background(), memory.CUDA(0))
		if err != nil {
			t.Fatal(err)
		}
		res, err := a.Root().RequestFuture(pid, &Grad{W: x}, 60*time.Second).Result()
		checkDigest(t, res, err, host)
		d := res.(*Digest)
		moved := d.Via[wantChannel] - prev[wantChannel]
		prev = d.Via
		switch {
		case x.ByteSize() > 64<<10 || smallDirect:
			if moved != 1 {
				t.Fatalf("%v: not moved by %s: %v", x, wantChannel, d.Via)
			}
		case moved != 0:
			t.Fatalf("%v: moved by %s, want inline: %v", x, wantChannel, d.Via)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = x.Free()
		_ = host.Free()
	}
}

// TestGPUTensorsAcrossProcessesIPC sends device tensors from a process on
// GPU0 to one on GPU1: the ipc channel moves them, the small ones too.
func TestGPUTensorsAcrossProcessesIPC(t *testing.T) {
	a, _ := gpuProcessCluster(t, nil)
	sendGPUTensors(t, a, "ipc", true)
	sendTwiceOnTheReader(t, a)
}

// sendTwiceOnTheReader sends one device tensor again and again to node1:
// from the second time on node1 maps its allocation already and the
// owner's offer is direct, so the connection's reader fetches and delivers
// it (StatsSnapshot.ReaderDeliveries), the bytes intact. A send may still
// find the previous message being finished by the delivery loop (its
// leases go back before the loop counts it done) and queue behind it:
// one of four sends after the first must take the reader.
func sendTwiceOnTheReader(t *testing.T, a *actor.Node) {
	rng := rand.New(rand.NewPCG(11, 12))
	host := randomTensor(t, rng, tensor.Uint8, tensor.Shape{1 << 20})
	defer host.Free()
	x, err := host.To(context.Background(), memory.CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	var reader []int64
	for i := range 5 {
		if i >= 2 && reader[i-1] > reader[0] {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		res, err := a.Request(ctx, a.PID("node1", "tensors"), &Grad{W: x})
		cancel()
		checkDigest(t, res, err, host)
		reader = append(reader, res.(*Digest).Reader)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if reader[len(reader)-1] <= reader[0] {
		t.Fatalf("no send after the first of one allocation was delivered on the reader (reader deliveries %v)", reader)
	}
}

// TestGPUTensorsAcrossProcessesStaging forces the staging channel (pinned
// ring, D2H → TCP → H2D) between the same processes.
func TestGPUTensorsAcrossProcessesStaging(t *testing.T) {
	a, _ := gpuProcessCluster(t, []string{"ipc"})
	sendGPUTensors(t, a, "staging", false)
}

// TestCUDACacheBytesFromConfig: memory.cuda_cache_bytes sets the cache of
// the caching allocator of each CUDA device of the node when it starts.
func TestCUDACacheBytesFromConfig(t *testing.T) {
	gpus(t)
	cfg, err := config.LocalConfig("gpu-cache", 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Nodes[0].Devices = []memory.Device{memory.CUDA(0)}
	a, err := memory.CUDAAllocatorFor(memory.CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	before := a.CacheBytes()
	t.Cleanup(func() { _ = a.SetCacheBytes(before) })
	want := before + 3<<20 // differs from whatever it is now
	cfg.Memory.CUDACacheBytes = want
	n, err := actor.NewNode(cfg, "node0", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop() })
	if got := a.CacheBytes(); got != want {
		t.Errorf("cache of cuda:0 holds %d bytes after Start, want the config's %d", got, want)
	}
}
