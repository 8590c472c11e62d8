// Command torchps runs a parameter server whose shards are Go actors and
// whose workers are PyTorch processes (worker.py, through the Python package
// python/tensorferry): each worker pulls the weights from every shard,
// computes the gradient of a linear regression with autograd on its own
// generated data (whose solution is known), and pushes it; the shards apply
// SGD. Every transfer's channel is printed; tensors above the inline
// threshold go through staging (CPU). It exits non-zero unless every
// worker's loss converged.
//
//	go run ./samples/torchps -workers 2 -steps 30
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// Pull asks a shard for its weights.
type Pull struct{ Step int }

// Weights answers Pull.
type Weights struct{ W *tensor.Tensor }

// Push carries a worker's gradient for one shard.
type Push struct {
	Step int
	G    *tensor.Tensor
}

// Ack answers Push.
type Ack struct{ Step int }

func init() {
	actor.MustRegisterMessage("torchps.Pull", &Pull{})
	actor.MustRegisterMessage("torchps.Weights", &Weights{})
	actor.MustRegisterMessage("torchps.Push", &Push{})
	actor.MustRegisterMessage("torchps.Ack", &Ack{})
}

// shard holds one slice of the weights.
type shard struct {
	name string
	w    []float32
	lr   float32
}

func (s *shard) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Pull:
		t, err := tensor.FromFloat32s(append([]float32(nil), s.w...), tensor.Shape{int64(len(s.w))})
		if err != nil {
			log.Printf("%s: %v", s.name, err)
			return
		}
		c.Respond(&Weights{W: t})
	case *Push:
		g := m.G.Float32s()
		if len(g) != len(s.w) {
			log.Printf("%s: gradient of %d elements, want %d", s.name, len(g), len(s.w))
			return
		}
		for i := range g {
			s.w[i] -= s.lr * g[i]
		}
		c.Respond(&Ack{Step: m.Step})
	}
}

func main() {
	workers := flag.Int("workers", 2, "PyTorch workers")
	shards := flag.Int("shards", 2, "Go shards")
	steps := flag.Int("steps", 30, "SGD steps per worker")
	dim := flag.Int("dim", 65536, "weights (float32); a shard's slice above the inline threshold goes through staging")
	py := flag.String("python", "/usr/bin/python3", "Python with torch and msgpack")
	flag.Parse()
	if err := run(*workers, *shards, *steps, *dim, *py); err != nil {
		log.Fatal(err)
	}
}

func run(workers, shards, steps, dim int, py string) error {
	if shards < 1 || dim%shards != 0 {
		return fmt.Errorf("torchps: dim %d is not a multiple of %d shards", dim, shards)
	}
	cfg, err := config.LocalConfig("torchps", 1+workers)
	if err != nil {
		return err
	}
	node, err := actor.NewNode(cfg, cfg.Nodes[0].Name, actor.WithLogger(zap.NewNop()))
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer node.Stop()
	per := dim / shards
	for i := range shards {
		s := &shard{name: fmt.Sprintf("shard-%d", i), w: make([]float32, per), lr: 20 / float32(workers)}
		if _, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return s }), s.name); err != nil {
			return err
		}
	}
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "worker.py")
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		nc := cfg.Nodes[1+i]
		peers := map[string]any{cfg.Nodes[0].Name: map[string]string{
			"address": cfg.Nodes[0].Address, "data_address": cfg.Nodes[0].DataAddress}}
		wc, err := json.Marshal(map[string]any{"cluster": cfg.Cluster, "secret": string(cfg.Secret),
			"name": nc.Name, "address": nc.Address, "data_address": nc.DataAddress, "peers": peers,
			"inline_threshold": cfg.Transport.InlineThreshold, "heartbeat": cfg.HeartbeatInterval.Seconds(),
			"failure_timeout": cfg.FailureTimeout.Seconds(), "ps": cfg.Nodes[0].Name,
			"shards": shards, "dim": dim, "steps": steps, "seed": i + 1})
		if err != nil {
			return err
		}
		cmd := exec.Command(py, script)
		cmd.Env = append(os.Environ(), "TF_WORKER="+string(wc))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("torchps: start worker: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				errs[i] = fmt.Errorf("torchps: worker %s: %w", nc.Name, err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	fmt.Println("torchps: every worker converged")
	return nil
}
