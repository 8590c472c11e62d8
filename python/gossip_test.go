package python_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// TestPythonGossip: a Python node marked mesh_only joins a cluster of Go
// nodes on gossip membership. Every Go node keeps a mesh connection to it
// (the Go nodes gossip among themselves); the Python node sees each Go
// node up, and requests go both ways. The Go node stopped is a NodeDown
// at the Python node.
func TestPythonGossip(t *testing.T) {
	cfg, err := config.LocalConfig("pygossip", 4)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipGossip
	cfg.Nodes[3].GossipAddress = ""
	cfg.Nodes[3].MeshOnly = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	goNames := []string{cfg.Nodes[0].Name, cfg.Nodes[1].Name, cfg.Nodes[2].Name}
	py := cfg.Nodes[3].Name

	conf := peerConfig(cfg, nil, 3, 0)
	peers := map[string]any{}
	for _, n := range cfg.Nodes[:3] {
		peers[n.Name] = map[string]string{"address": n.Address, "data_address": n.DataAddress}
	}
	conf["peers"], conf["membership"], conf["mesh_only"] = peers, "gossip", true
	p := runPeer(t, python(t), conf)

	nodes := make([]*actor.Node, 3)
	for i, name := range goNames {
		own := *cfg // NewNode validates (writes) its config
		own.Nodes = slices.Clone(cfg.Nodes)
		node, err := actor.NewNode(&own, name, actor.WithLogger(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = node.Stop() })
		if _, err := node.Root().SpawnNamed(scaleProps(), "scale"); err != nil {
			t.Fatal(err)
		}
		nodes[i] = node
	}
	// The Python node sees every Go node up.
	seen := map[string]bool{}
	for len(seen) < len(goNames) {
		l := p.nextLine("up ", func(l string) bool { return !strings.HasPrefix(l, "up ") }, false)
		seen[strings.TrimPrefix(l, "up ")] = true
	}
	for _, name := range goNames {
		if !seen[name] {
			t.Fatalf("the Python node saw %v up, not %s", seen, name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, node := range nodes {
		if err := node.WaitPeer(ctx, py); err != nil {
			t.Fatalf("%s did not see the Python node up: %v", goNames[i], err)
		}
		xt, err := tensor.FromFloat32s([]float32{1, -2, float32(i)}, tensor.Shape{3})
		if err != nil {
			t.Fatal(err)
		}
		res, err := node.Request(ctx, node.PID(py, "double"), &Vec{Scale: 1, X: xt})
		if v, ok := res.(*Vec); err != nil || !ok || fmt.Sprint(v.X.Float32s()) != fmt.Sprintf("[2 -4 %d]", 2*i) {
			t.Fatalf("%s: request to python: %#v, %v", goNames[i], res, err)
		}
	}
	// The Go nodes among themselves: gossip, connections on demand.
	if _, err := nodes[0].Request(ctx, nodes[0].PID(goNames[1], "scale"), &Vec{Scale: 2, X: must1(t)}); err != nil {
		t.Fatalf("%s to %s: %v", goNames[0], goNames[1], err)
	}
	// Python → Go (node0, the "go" of tests/peer.py).
	p.do("wait", "ok wait")
	p.do("request 5", "ok request")
	// node0 stops: a NodeDown at the Python node.
	if err := nodes[0].Stop(); err != nil {
		t.Fatal(err)
	}
	p.expectLine("down " + goNames[0])
}

// must1 is a one-element tensor.
func must1(t *testing.T) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromFloat32s([]float32{1}, tensor.Shape{1})
	if err != nil {
		t.Fatal(err)
	}
	return x
}
