// Command torchps runs a parameter server whose shards are Go actors and
// whose workers are PyTorch processes (worker.py, through the Python package
// python/tensorferry): each worker pulls the weights from every shard,
// computes the gradient of a linear regression with autograd on its own
// generated data (whose solution is known), and pushes it; the shards apply
// SGD. Every transfer's channel is printed.
//
// With a GPU (and the ipc channel viable), the shards keep their weights
// on cuda:0 and the workers compute on their GPU: weights and gradients
// move between the Go node and the PyTorch processes over ipc (CUDA IPC,
// device to device; the shards' SGD step runs on the host). Without one,
// everything is on the CPU and tensors above the inline threshold go
// through staging. It exits non-zero unless every worker's loss
// converged.
//
//	go run ./samples/torchps -workers 2 -steps 30
package main

import (
	"context"
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
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/ipc"
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

// shard holds one slice of the weights, on dev.
type shard struct {
	name string
	w    []float32
	lr   float32
	dev  memory.Device
}

func (s *shard) Receive(c pa.Context) {
	ctx := context.Background()
	switch m := c.Message().(type) {
	case *Pull:
		t, err := tensor.FromFloat32s(append([]float32(nil), s.w...), tensor.Shape{int64(len(s.w))})
		if err == nil && s.dev != memory.CPU {
			var d *tensor.Tensor
			d, err = t.To(ctx, s.dev)
			_ = t.Free()
			t = d
		}
		if err != nil {
			log.Printf("%s: %v", s.name, err)
			return
		}
		c.Respond(&Weights{W: t})
	case *Push:
		g := m.G
		if g.Device() != memory.CPU {
			h, err := g.To(ctx, memory.CPU)
			if err != nil {
				log.Printf("%s: %v", s.name, err)
				return
			}
			defer h.Free()
			g = h
		}
		gs := g.Float32s()
		if len(gs) != len(s.w) {
			log.Printf("%s: gradient of %d elements, want %d", s.name, len(gs), len(s.w))
			return
		}
		for i := range gs {
			s.w[i] -= s.lr * gs[i]
		}
		fmt.Printf("%s step %d push from %s: gradient on %s\n", s.name, m.Step, c.Sender().Address, m.G.Device())
		c.Respond(&Ack{Step: m.Step})
	}
}

func main() {
	workers := flag.Int("workers", 2, "PyTorch workers")
	shards := flag.Int("shards", 2, "Go shards")
	steps := flag.Int("steps", 30, "SGD steps per worker")
	dim := flag.Int("dim", 65536, "weights (float32); a shard's slice above the inline threshold goes through staging")
	py := flag.String("python", "/usr/bin/python3", "Python with torch")
	gpu := flag.String("gpu", "auto", "auto: shards and workers on GPUs when CUDA and the ipc channel are there; on: insist; off: CPU")
	worker := flag.String("worker", "", "the worker script (default: worker.py beside this source, else samples/torchps/worker.py)")
	flag.Parse()
	cuda, err := useGPU(*gpu)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(*workers, *shards, *steps, *dim, *py, cuda, *worker); err != nil {
		log.Fatal(err)
	}
}

// useGPU decides whether the sample runs on GPUs.
func useGPU(mode string) (bool, error) {
	why := ""
	if n, err := memory.CUDADeviceCount(); err != nil || n == 0 {
		why = fmt.Sprintf("no CUDA device (%v)", err)
	} else if err := ipc.Available(); err != nil {
		why = err.Error()
	}
	switch mode {
	case "off":
		return false, nil
	case "on":
		if why != "" {
			return false, fmt.Errorf("torchps: -gpu on: %s", why)
		}
		return true, nil
	case "auto":
		if why != "" {
			fmt.Println("torchps: on the CPU:", why)
		}
		return why == "", nil
	}
	return false, fmt.Errorf("torchps: -gpu %q: want auto, on or off", mode)
}

// workerScript finds worker.py: beside this source file when it is there
// (go run, go test), else under the working directory.
func workerScript(given string) string {
	if given != "" {
		return given
	}
	if _, self, _, ok := runtime.Caller(0); ok {
		p := filepath.Join(filepath.Dir(self), "worker.py")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join("samples", "torchps", "worker.py")
}

func run(workers, shards, steps, dim int, py string, cuda bool, worker string) error {
	if shards < 1 || dim%shards != 0 {
		return fmt.Errorf("torchps: dim %d is not a multiple of %d shards", dim, shards)
	}
	cfg, err := config.LocalConfig("torchps", 1+workers)
	if err != nil {
		return err
	}
	dev := memory.CPU
	if cuda {
		dev = memory.CUDA(0)
		cfg.Nodes[0].Devices = []memory.Device{dev}
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
		s := &shard{name: fmt.Sprintf("shard-%d", i), w: make([]float32, per), lr: 20 / float32(workers), dev: dev}
		if _, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return s }), s.name); err != nil {
			return err
		}
	}
	script := workerScript(worker)
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
			"shards": shards, "dim": dim, "steps": steps, "seed": i + 1, "cuda": cuda})
		if err != nil {
			return err
		}
		cmd := exec.Command(py, script)
		cmd.Env = append(os.Environ(), "TF_WORKER="+string(wc), "PYTHONDONTWRITEBYTECODE=1")
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
