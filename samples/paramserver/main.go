package main

import (
	"cmp"
	"context"
	"encoding/json"
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
	"github.com/tensorferry/tensorferry/samples/paramserver/ps"
	"github.com/tensorferry/tensorferry/tracing"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command-line flags.
type options struct {
	train   ps.Config
	config  string
	node    string
	json    bool
	log     bool
	tol     float64
	timeout time.Duration
	tracer  trace.TracerProvider // from the OTEL_* variables; nil: none
	metrics string
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{train: ps.DefaultConfig()}
	fs := flag.NewFlagSet("paramserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", string(o.train.Mode), "sync or async")
	fs.IntVar(&o.train.Steps, "steps", o.train.Steps, "SGD steps per worker")
	fs.IntVar(&o.train.Dim, "dim", o.train.Dim, "length of the parameter vector (float32)")
	fs.IntVar(&o.train.Workers, "workers", o.train.Workers, "worker actors")
	fs.IntVar(&o.train.Shards, "shards", o.train.Shards, "parameter server shards")
	fs.IntVar(&o.train.SamplesPerWorker, "samples", 0, "data rows per worker (0: 8·dim/workers)")
	fs.Float64Var(&o.train.LR, "lr", o.train.LR, "learning rate")
	fs.Uint64Var(&o.train.Seed, "seed", o.train.Seed, "seed of w* and the data")
	fs.StringVar(&o.config, "config", "", "cluster config file: run one node of a real cluster (with --node)")
	fs.StringVar(&o.node, "node", "", "this node's name in --config")
	fs.BoolVar(&o.json, "json", false, "print the final figures as JSON")
	fs.BoolVar(&o.log, "log", false, "log what the nodes do to stderr")
	fs.Float64Var(&o.tol, "tol", 1e-2, "largest ‖w−w*‖/‖w*‖ counted as converged")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.StringVar(&o.metrics, "metrics-address", "", "serve Prometheus metrics of the node(s) at this host:port (/metrics); with --config, default: the node's metrics_address")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.train.Mode = ps.Mode(*mode)
	if (o.config == "") != (o.node == "") {
		return nil, errors.New("--config and --node go together")
	}
	return o, o.train.Validate()
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "paramserver:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	tp, flush, err := tracing.FromEnv(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "paramserver:", err)
		return 2
	}
	defer flush(context.Background())
	o.tracer = tp

	var res *ps.Result
	if o.config == "" {
		res, err = embedded(ctx, o, stdout)
	} else {
		res, err = member(ctx, o, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "paramserver:", err)
		return 1
	}
	if res == nil {
		return 0 // a node that did not drive
	}
	converged := res.Distance <= o.tol
	if o.json {
		out := struct {
			*ps.Result
			ElapsedSeconds float64
			Tolerance      float64
			Converged      bool
		}{res, res.Elapsed.Seconds(), o.tol, converged}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		report(stdout, res)
	}
	if !converged {
		fmt.Fprintf(stderr, "paramserver: not converged: distance %.3g > %.3g\n", res.Distance, o.tol)
		return 1
	}
	return 0
}

// logger returns the nodes' logger option: zap's development logger with
// --log, else none.
func (o *options) logger() actor.Option {
	if !o.log {
		return actor.WithLogger(zap.NewNop())
	}
	l, err := zap.NewDevelopment()
	if err != nil {
		return actor.WithLogger(zap.NewNop())
	}
	return actor.WithLogger(l)
}

func report(w io.Writer, res *ps.Result) {
	fmt.Fprintf(w, "done: %s, %d steps, dim %d, %d workers, %d shards in %v\n",
		res.Mode, res.Steps, res.Dim, res.Workers, len(res.Shards), res.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "final loss %.4g, distance ‖w−w*‖/‖w*‖ = %.3g\n", res.Loss, res.Distance)
	if res.StepTime > 0 {
		fmt.Fprintf(w, "step time: median %v (pull, gradient, push, update)\n", res.StepTime.Round(time.Microsecond))
	}
	names := make([]string, 0, len(res.Channels))
	for n := range res.Channels {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		ch := res.Channels[n]
		fmt.Fprintf(w, "channel %-8s %6d transfers %12d bytes\n", n, ch.Transfers, ch.Bytes)
	}
	// By kind: which channel carried the gradients, which the weights.
	for _, kind := range []string{"gradients", "weights", "mixed"} {
		chs := res.Kinds[kind]
		names := make([]string, 0, len(chs))
		for n, ch := range chs {
			if ch.Transfers > 0 {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		for _, n := range names {
			ch := chs[n]
			fmt.Fprintf(w, "channel %-8s %6d transfers %12d bytes of %s\n", n, ch.Transfers, ch.Bytes, kind)
		}
	}
	fmt.Fprintf(w, "messages sent: %d\n", res.MessagesSent)
}

func progress(w io.Writer, quiet bool) func(int, float64) {
	if quiet {
		return nil
	}
	return func(step int, loss float64) { fmt.Fprintf(w, "step %3d  loss %.6g\n", step, loss) }
}

// embedded runs a 3-node cluster on loopback in this process: node0 holds
// the shards, node1 and node2 the workers (all on the GPUs if there are
// any).
func embedded(ctx context.Context, o *options, stdout io.Writer) (*ps.Result, error) {
	c, err := startEmbedded(ctx, o, stdout)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	return c.drive(ctx, o, stdout)
}

// embeddedCluster is the 3-node cluster of embedded, started.
type embeddedCluster struct {
	nodes   []*actor.Node
	driver  *actor.Node
	layout  ps.Layout
	metrics *metrics.Server // nil without --metrics-address
}

func (c *embeddedCluster) stop() {
	if c.metrics != nil {
		_ = c.metrics.Close()
	}
	for _, n := range c.nodes {
		_ = n.Stop()
	}
}

func (c *embeddedCluster) drive(ctx context.Context, o *options, stdout io.Writer) (*ps.Result, error) {
	return ps.Drive(ctx, c.driver, o.train, c.layout, progress(stdout, o.json))
}

// startEmbedded starts embedded's cluster, and its metrics listener with
// --metrics-address.
func startEmbedded(ctx context.Context, o *options, stdout io.Writer) (_ *embeddedCluster, err error) {
	cc, err := config.LocalConfig("paramserver", 3)
	if err != nil {
		return nil, err
	}
	// LocalConfig declares a node down after 500ms of silence, which a
	// loaded machine (or the race detector) can exceed: use the defaults.
	def := config.DefaultConfig()
	cc.HeartbeatInterval, cc.FailureTimeout = def.HeartbeatInterval, def.FailureTimeout
	gpus := shardDevices()
	cc.Nodes[0].Devices = gpus
	if gpus[0].Kind == memory.KindCUDA {
		// The workers compute on the GPUs too: node1 on the first, node2
		// on the last.
		cc.Nodes[1].Devices = gpus[:1]
		cc.Nodes[2].Devices = gpus[len(gpus)-1:]
	}
	if !o.json {
		fmt.Fprintf(stdout, "embedded cluster: 3 nodes on loopback; shards on %s use %v, workers on %s %v and %s %v\n",
			cc.Nodes[0].Name, cc.Nodes[0].Devices, cc.Nodes[1].Name, cc.Nodes[1].Devices, cc.Nodes[2].Name, cc.Nodes[2].Devices)
	}
	c := &embeddedCluster{}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for _, nc := range cc.Nodes {
		n, err := actor.NewNode(cc, nc.Name, o.logger(), actor.WithTracerProvider(o.tracer))
		if err != nil {
			return nil, err
		}
		if _, err := ps.Serve(n, cc); err != nil {
			return nil, err
		}
		if err := n.Start(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if c.layout, err = ps.Roles([]string{"node0", "node1", "node2"}, o.train.Shards, o.train.Workers); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if n.Name() == c.layout.Driver() {
			c.driver = n
		}
	}
	if o.metrics != "" {
		if c.metrics, err = metrics.Serve(ctx, o.metrics, metrics.Options{}, c.nodes...); err != nil {
			return nil, err
		}
		if !o.json {
			fmt.Fprintf(stdout, "metrics of the 3 nodes: http://%s/metrics\n", c.metrics.Addr())
		}
	}
	return c, nil
}

// shardDevices returns cuda:0 (and cuda:1) when CUDA memory can be
// allocated here, else host memory.
func shardDevices() []memory.Device {
	if _, err := memory.AllocatorFor(memory.CUDA(0)); err != nil {
		return []memory.Device{memory.CPU}
	}
	devs := []memory.Device{memory.CUDA(0)}
	if n, err := memory.CUDADeviceCount(); err == nil && n > 1 {
		if _, err := memory.AllocatorFor(memory.CUDA(1)); err == nil {
			devs = append(devs, memory.CUDA(1))
		}
	}
	return devs
}

// member runs one node of the cluster in --config. It returns a Result on
// the driving node and nil elsewhere.
func member(ctx context.Context, o *options, stdout io.Writer) (*ps.Result, error) {
	cc, err := config.Load(o.config)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(cc.Nodes))
	for i, nc := range cc.Nodes {
		names[i] = nc.Name
	}
	layout, err := ps.Roles(names, o.train.Shards, o.train.Workers)
	if err != nil {
		return nil, err
	}
	n, err := actor.NewNode(cc, o.node, o.logger(), actor.WithTracerProvider(o.tracer))
	if err != nil {
		return nil, err
	}
	agent, err := ps.Serve(n, cc)
	if err != nil {
		return nil, err
	}
	if err := n.Start(); err != nil {
		return nil, err
	}
	defer n.Stop()
	// --metrics-address, else the node's metrics_address in the config.
	nc, _ := cc.Node(o.node)
	if addr := cmp.Or(o.metrics, nc.MetricsAddress); addr != "" {
		srv, err := metrics.Serve(ctx, addr, metrics.Options{Pprof: nc.Pprof}, n)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		if !o.json {
			fmt.Fprintf(stdout, "metrics: http://%s/metrics\n", srv.Addr())
		}
	}
	if n.Name() == layout.Driver() {
		if !o.json {
			fmt.Fprintf(stdout, "%s drives: shards on %v, workers on %v\n", n.Name(), layout.ShardNodes, layout.WorkerNodes)
		}
		return ps.Drive(ctx, n, o.train, layout, progress(stdout, o.json))
	}
	if !o.json {
		fmt.Fprintf(stdout, "%s serves; %s drives\n", n.Name(), layout.Driver())
	}
	select {
	case <-agent.Done():
		return nil, agent.Err()
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the driver: %w", ctx.Err())
	}
}
