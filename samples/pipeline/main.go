package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/metrics"
	"github.com/tensorferry/tensorferry/samples/pipeline/pipe"
	"github.com/tensorferry/tensorferry/tracing"
	"go.uber.org/zap"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg := pipe.DefaultConfig()
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Batches, "batches", cfg.Batches, "micro-batches")
	fs.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows per micro-batch")
	fs.IntVar(&cfg.Dim, "dim", cfg.Dim, "width of the input and the activations")
	fs.IntVar(&cfg.Out, "out", cfg.Out, "width of the output")
	fs.IntVar(&cfg.InFlight, "inflight", cfg.InFlight, "micro-batches in flight at once")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the weights and inputs")
	logs := fs.Bool("log", false, "log what the nodes do to stderr")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	metricsAddr := fs.String("metrics-address", "", "serve Prometheus metrics of the 3 nodes at this host:port (/metrics)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pipeline: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "pipeline:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// Traces go where the OTEL_* variables say (none when unset).
	tp, flush, err := tracing.FromEnv(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "pipeline:", err)
		return 2
	}
	defer flush(context.Background())
	if err := pipeline(ctx, cfg, *logs, *metricsAddr, stdout, actor.WithTracerProvider(tp)); err != nil {
		fmt.Fprintln(stderr, "pipeline:", err)
		return 1
	}
	return 0
}

// stageDevices returns the device of each stage's node: cuda:0, cuda:1,
// cuda:0 when CUDA memory can be allocated here (cuda:0 for all three on a
// one-GPU host), else host memory.
func stageDevices() [3]memory.Device {
	if _, err := memory.AllocatorFor(memory.CUDA(0)); err != nil {
		return [3]memory.Device{memory.CPU, memory.CPU, memory.CPU}
	}
	second := memory.CUDA(0)
	if n, err := memory.CUDADeviceCount(); err == nil && n > 1 {
		if _, err := memory.AllocatorFor(memory.CUDA(1)); err == nil {
			second = memory.CUDA(1)
		}
	}
	return [3]memory.Device{memory.CUDA(0), second, memory.CUDA(0)}
}

func pipeline(ctx context.Context, cfg pipe.Config, logs bool, metricsAddr string, w io.Writer, opts ...actor.Option) error {
	cc, err := config.LocalConfig("pipeline", 3)
	if err != nil {
		return err
	}
	// LocalConfig declares a node down after 500ms of silence, which a
	// loaded machine (or the race detector) can exceed: use the defaults.
	def := config.DefaultConfig()
	cc.HeartbeatInterval, cc.FailureTimeout = def.HeartbeatInterval, def.FailureTimeout
	devs := stageDevices()
	for i := range cc.Nodes {
		cc.Nodes[i].Devices = []memory.Device{devs[i]}
	}
	fmt.Fprintf(w, "embedded cluster: 3 nodes on loopback; stages on %v, %v, %v\n", devs[0], devs[1], devs[2])
	log := zap.NewNop()
	if logs {
		if l, err := zap.NewDevelopment(); err == nil {
			log = l
		}
	}
	var nodes []*actor.Node
	defer func() {
		for _, n := range nodes {
			_ = n.Stop()
		}
	}()
	for _, nc := range cc.Nodes {
		n, err := actor.NewNode(cc, nc.Name, append([]actor.Option{actor.WithLogger(log)}, opts...)...)
		if err != nil {
			return err
		}
		if err := n.Start(); err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	if metricsAddr != "" {
		srv, err := metrics.Serve(ctx, metricsAddr, metrics.Options{}, nodes...)
		if err != nil {
			return err
		}
		defer srv.Close()
		fmt.Fprintf(w, "metrics of the 3 nodes: http://%s/metrics\n", srv.Addr())
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					return fmt.Errorf("%s waiting for %s: %w", a.Name(), b.Name(), err)
				}
			}
		}
	}
	fmt.Fprintf(w, "embedded cluster: stage 1 on %s, stage 2 on %s, stage 3 and the driver on %s\n", nodes[0].Name(), nodes[1].Name(), nodes[2].Name())
	fmt.Fprintf(w, "%d micro-batches of %d×%d float32 (%d KiB activations), %d in flight\n",
		cfg.Batches, cfg.Rows, cfg.Dim, cfg.Rows*cfg.Dim*4>>10, cfg.InFlight)
	res, err := pipe.Run(ctx, nodes, cfg, func(r pipe.BatchResult) {
		status := "OK"
		if !r.OK {
			status = "FAIL: " + r.Err.Error()
		}
		fmt.Fprintf(w, "batch %3d  %8.2f ms  %s\n", r.Batch, float64(r.Latency.Microseconds())/1000, status)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%d micro-batches in %v (%.1f per second)\n", cfg.Batches, res.Elapsed.Round(time.Millisecond), float64(cfg.Batches)/res.Elapsed.Seconds())
	for _, n := range nodes {
		st := n.Stats()
		names := make([]string, 0, len(st.Channels))
		for c := range st.Channels {
			names = append(names, c)
		}
		slices.Sort(names)
		for _, c := range names {
			fmt.Fprintf(w, "%s fetched %d bytes in %d transfers over %s\n", n.Name(), st.Channels[c].Bytes, st.Channels[c].Transfers, c)
		}
	}
	if res.Failed > 0 {
		return fmt.Errorf("%d of %d micro-batches differ from the in-process reference", res.Failed, cfg.Batches)
	}
	fmt.Fprintln(w, "OK: every output equals the in-process reference bit for bit")
	return nil
}
