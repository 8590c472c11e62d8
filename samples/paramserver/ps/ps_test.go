package ps

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
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

// startCluster starts n loopback nodes, each with an Agent.
func startCluster(t *testing.T, n int) []*actor.Node {
	t.Helper()
	cc, err := config.LocalConfig("ps-test", n)
	if err != nil {
		t.Fatal(err)
	}
	// LocalConfig declares a node down after 500ms of silence, which a
	// loaded machine (or the race detector) can exceed: use the defaults.
	def := config.DefaultConfig()
	cc.HeartbeatInterval, cc.FailureTimeout = def.HeartbeatInterval, def.FailureTimeout
	var nodes []*actor.Node
	for _, nc := range cc.Nodes {
		node, err := actor.NewNode(cc, nc.Name, actor.WithLogger(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Serve(node, cc); err != nil {
			t.Fatal(err)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = node.Stop() })
		nodes = append(nodes, node)
	}
	return nodes
}

func train(t *testing.T, nodes []*actor.Node, cfg Config) *Result {
	t.Helper()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name()
	}
	layout, err := Roles(names, cfg.Shards, cfg.Workers)
	if err != nil {
		t.Fatal(err)
	}
	var driver *actor.Node
	for _, n := range nodes {
		if n.Name() == layout.Driver() {
			driver = n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var losses []float64
	res, err := Drive(ctx, driver, cfg, layout, func(_ int, loss float64) { losses = append(losses, loss) })
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) != cfg.Steps {
		t.Errorf("%d progress reports, want %d", len(losses), cfg.Steps)
	}
	if len(losses) > 1 && !(losses[len(losses)-1] < losses[0]/100) {
		t.Errorf("loss went from %v to %v", losses[0], losses[len(losses)-1])
	}
	return res
}

// smallConfig has shards of 20000 float32 (80000 bytes): above the 64 KiB
// inline threshold, so every pull and push moves out of band.
func smallConfig(mode Mode) Config {
	c := DefaultConfig()
	c.Mode, c.Dim, c.Steps = mode, 40000, 20
	return c
}

func TestTrain(t *testing.T) {
	for _, mode := range []Mode{Sync, Async} {
		t.Run(string(mode), func(t *testing.T) {
			nodes := startCluster(t, 3)
			cfg := smallConfig(mode)
			allocs := memory.UninitAllocs()
			res := train(t, nodes, cfg)
			// Workers fetch their weights into their own tensors
			// (WithDestinations): the only receive destinations
			// allocated are the shards' for the gradients and the
			// driver's for the final pulls.
			if n, want := memory.UninitAllocs()-allocs, uint64(cfg.Steps*cfg.Workers*cfg.Shards+cfg.Shards); n != want {
				t.Errorf("%d receive destinations allocated, want %d (pushes and final pulls only)", n, want)
			}
			if res.Distance > 1e-2 {
				t.Errorf("distance to w* %v, want ≤ 1e-2", res.Distance)
			}
			st := res.Channels["staging"]
			if st.Bytes == 0 {
				t.Fatalf("no bytes through staging: %+v", res.Channels)
			}
			// Each step every worker pulls and pushes the whole vector
			// once; the driver pulls it once at the end.
			want := int64(2*cfg.Steps*cfg.Workers+1) * int64(cfg.Dim) * 4
			if st.Bytes != want {
				t.Errorf("staging moved %d bytes, want %d", st.Bytes, want)
			}
			for i, s := range res.Shards {
				if s.Shard != i || s.Node != "node0" || s.Device != "cpu" {
					t.Errorf("shard %d placed %+v", i, s)
				}
			}
		})
	}
}

// On one node shards and workers share the node: local messages pass
// pointers, so they must exchange copies.
func TestSingleNode(t *testing.T) {
	nodes := startCluster(t, 1)
	cfg := smallConfig(Sync)
	cfg.Dim, cfg.Shards, cfg.Workers = 2000, 3, 3
	res := train(t, nodes, cfg)
	if res.Distance > 1e-2 {
		t.Errorf("distance to w* %v, want ≤ 1e-2", res.Distance)
	}
	if res.Channels["staging"].Bytes != 0 {
		t.Errorf("staging used within one node: %+v", res.Channels)
	}
}

func TestDriveOnWrongNode(t *testing.T) {
	nodes := startCluster(t, 2)
	layout, err := Roles([]string{"node0", "node1"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Drive(context.Background(), nodes[0], smallConfig(Sync), layout, nil); err == nil {
		t.Fatal("node0 drove, but the layout's driver is node1")
	}
}

func TestRoles(t *testing.T) {
	tests := []struct {
		nodes           []string
		shards, workers int
		shardNodes      []string
		workerNodes     []string
	}{
		{[]string{"a"}, 2, 2, []string{"a", "a"}, []string{"a", "a"}},
		{[]string{"a", "b"}, 2, 3, []string{"a", "a"}, []string{"b", "b", "b"}},
		{[]string{"a", "b", "c"}, 2, 2, []string{"a", "a"}, []string{"b", "c"}},
		{[]string{"a", "b", "c", "d", "e", "f"}, 3, 3, []string{"a", "b", "a"}, []string{"c", "d", "e"}},
	}
	for _, tt := range tests {
		l, err := Roles(tt.nodes, tt.shards, tt.workers)
		if err != nil {
			t.Fatal(err)
		}
		if !equal(l.ShardNodes, tt.shardNodes) || !equal(l.WorkerNodes, tt.workerNodes) {
			t.Errorf("Roles(%v, %d, %d) = %+v", tt.nodes, tt.shards, tt.workers, l)
		}
	}
	if _, err := Roles(nil, 1, 1); !errors.Is(err, ErrConfig) {
		t.Errorf("Roles of no nodes: %v", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestConfigValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.Mode = "eventual" },
		func(c *Config) { c.Steps = 0 },
		func(c *Config) { c.Dim = 0 },
		func(c *Config) { c.Shards = c.Dim + 1 },
		func(c *Config) { c.Workers = 0 },
		func(c *Config) { c.LR = math.NaN() },
		func(c *Config) { c.Noise = -1 },
		func(c *Config) { c.NonZeros = c.Dim + 1 },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("case %d: Validate = %v, want ErrConfig", i, err)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil || c.SamplesPerWorker != 8*c.Dim/c.Workers {
		t.Errorf("default: %v, %d samples per worker", err, c.SamplesPerWorker)
	}
}

// The gradient matches central finite differences of the loss.
func TestGradient(t *testing.T) {
	c := Config{Dim: 12, Workers: 1, Shards: 1, SamplesPerWorker: 40, NonZeros: 3, Noise: 0.1, Seed: 7, Steps: 1, LR: 0.5}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d := generate(&c, 0, Truth(&c))
	w := make([]float32, c.Dim)
	for i := range w {
		w[i] = float32(i%5) * 0.25
	}
	g := make([]float32, c.Dim)
	d.gradient(w, g)
	scratch := make([]float32, c.Dim)
	for i := range w {
		const h = 1e-2
		old := w[i]
		w[i] = old + h
		lp := d.gradient(w, scratch)
		w[i] = old - h
		lm := d.gradient(w, scratch)
		w[i] = old
		num := (lp - lm) / (2 * h)
		if math.Abs(num-float64(g[i])) > 1e-2*math.Max(1, math.Abs(num)) {
			t.Errorf("g[%d] = %v, finite difference %v", i, g[i], num)
		}
	}
	if Distance(Truth(&c), Truth(&c)) != 0 {
		t.Error("distance of w* to itself is not 0")
	}
}
