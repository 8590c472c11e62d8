package ps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// Result is what a training run achieved.
type Result struct {
	Mode     Mode
	Steps    int
	Dim      int
	Workers  int
	Shards   []ShardPlace
	Loss     float64 // mean loss over all rows at the last step's pulled weights
	Distance float64 // ‖w − w*‖ / ‖w*‖ of the final weights
	Elapsed  time.Duration
	// StepTime is the median time between the ends of consecutive steps
	// (every worker's gradient computed): in sync mode one step's
	// exchange (pushes, the shards' update, pulls) and gradient.
	StepTime time.Duration
	// Channels sums, over every node, what each data channel moved.
	Channels map[string]ChannelBytes
	// Kinds splits Channels by what moved: "gradients" into the nodes that
	// hold only shards, "weights" into the nodes that run only workers
	// (the driver's final pull included), "mixed" into nodes with both.
	Kinds        map[string]map[string]ChannelBytes
	MessagesSent int64 // over every node
}

// transferKind says what moves into node: see Result.Kinds.
func transferKind(l Layout, node string) string {
	shards, workers := slices.Contains(l.ShardNodes, node), slices.Contains(l.WorkerNodes, node)
	switch {
	case shards && !workers:
		return "gradients"
	case workers && !shards:
		return "weights"
	}
	return "mixed"
}

// stepLoss accumulates the workers' losses of one step.
type stepLoss struct {
	sum     float64
	samples int
	n       int
}

// driverActor collects Progress and Done from the workers.
type driverActor struct {
	cfg      Config
	progress func(step int, loss float64)
	steps    map[int]*stepLoss
	lastLoss float64
	stepEnds []time.Time // when every worker reported each step
	done     int
	result   chan error // gets one value: nil when every worker is done
	ended    bool
}

// Receive implements protoactor's Actor.
func (d *driverActor) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Progress:
		s := d.steps[m.Step]
		if s == nil {
			s = &stepLoss{}
			d.steps[m.Step] = s
		}
		s.sum += m.Loss * float64(m.Samples)
		s.samples += m.Samples
		if s.n++; s.n == d.cfg.Workers {
			delete(d.steps, m.Step)
			d.lastLoss = s.sum / float64(s.samples)
			d.stepEnds = append(d.stepEnds, time.Now())
			if d.progress != nil {
				d.progress(m.Step, d.lastLoss)
			}
		}
	case *Done:
		switch {
		case d.ended:
		case m.Err != "":
			d.ended = true
			d.result <- fmt.Errorf("ps: worker %d: %s", m.Worker, m.Err)
		default:
			if d.done++; d.done == d.cfg.Workers {
				d.ended = true
				d.result <- nil
			}
		}
	}
}

// Drive runs training from node, which must be layout.Driver() and run an
// Agent (Serve) like every other node of the layout: it waits for the other
// nodes, sets every node up, trains, pulls the final weights, and tells
// every node to finish. progress, if not nil, is called with the mean loss
// of each step once every worker reported it.
func Drive(ctx context.Context, node *actor.Node, cfg Config, layout Layout, progress func(step int, loss float64)) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if node.Name() != layout.Driver() {
		return nil, fmt.Errorf("ps: node %s cannot drive: the layout's driver is %s", node.Name(), layout.Driver())
	}
	var nodes []string
	for _, n := range append(slices.Clone(layout.ShardNodes), layout.WorkerNodes...) {
		if !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	for _, n := range nodes {
		if n != node.Name() {
			if err := node.WaitPeer(ctx, n); err != nil {
				return nil, fmt.Errorf("ps: waiting for node %s: %w", n, err)
			}
		}
	}
	d := &driverActor{cfg: cfg, progress: progress, steps: map[int]*stepLoss{}, result: make(chan error, 1)}
	dpid, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return d }), driverID)
	if err != nil {
		return nil, fmt.Errorf("ps: spawn driver: %w", err)
	}
	defer func() { _ = node.Root().StopFuture(dpid).Wait() }()

	start := time.Now()
	res := &Result{Mode: cfg.Mode, Steps: cfg.Steps, Dim: cfg.Dim, Workers: cfg.Workers, Channels: map[string]ChannelBytes{},
		Kinds: map[string]map[string]ChannelBytes{}}
	var setUp []string
	defer func() {
		// Whatever happened, every node that was set up stops its actors
		// and may exit.
		for _, n := range setUp {
			node.Root().Send(node.PID(n, agentID), &Exit{})
		}
	}()
	finish := func() error {
		var errs []error
		for _, n := range setUp {
			r, err := node.Root().RequestFuture(node.PID(n, agentID), &Finish{}, stopTimeout).Result()
			f, ok := r.(*Finished)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("ps: finish %s: %w", n, err))
			case !ok:
				errs = append(errs, fmt.Errorf("ps: finish %s: answer %T", n, r))
			default:
				res.MessagesSent += f.MessagesSent
				kind := transferKind(layout, n)
				if res.Kinds[kind] == nil {
					res.Kinds[kind] = map[string]ChannelBytes{}
				}
				for name, ch := range f.Channels {
					for _, m := range []map[string]ChannelBytes{res.Channels, res.Kinds[kind]} {
						t := m[name]
						t.Bytes += ch.Bytes
						t.Transfers += ch.Transfers
						m[name] = t
					}
				}
			}
		}
		return errors.Join(errs...)
	}

	setup := &Setup{Config: cfg, Layout: layout, DriverNode: node.Name()}
	for _, n := range nodes {
		r, err := node.Root().RequestFuture(node.PID(n, agentID), setup, stopTimeout).Result()
		if err == nil {
			if rd, ok := r.(*Ready); !ok {
				err = fmt.Errorf("answer %T", r)
			} else if rd.Err != "" {
				err = errors.New(rd.Err)
			} else {
				res.Shards = append(res.Shards, rd.Shards...)
			}
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("ps: set up node %s: %w", n, err), finish())
		}
		setUp = append(setUp, n)
	}
	slices.SortFunc(res.Shards, func(a, b ShardPlace) int { return a.Shard - b.Shard })

	for j, n := range layout.WorkerNodes {
		node.Root().Send(node.PID(n, workerID(j)), &Train{})
	}
	select {
	case err = <-d.result:
	case <-ctx.Done():
		err = fmt.Errorf("ps: training: %w", ctx.Err())
	}
	if err != nil {
		return nil, errors.Join(err, finish())
	}

	w := make([]float32, cfg.Dim)
	for i, n := range layout.ShardNodes {
		if err := pullFinal(node, cfg, i, node.PID(n, shardID(i)), w); err != nil {
			return nil, errors.Join(err, finish())
		}
	}
	res.Elapsed = time.Since(start)
	res.Distance = Distance(w, Truth(&cfg))
	res.Loss = d.loss()
	res.StepTime = d.stepTime()
	if err := finish(); err != nil {
		return nil, err
	}
	return res, nil
}

// loss returns the last step's loss. Safe once every worker is done: the
// driver actor receives nothing after that.
func (d *driverActor) loss() float64 { return d.lastLoss }

// stepTime returns the median time between consecutive step ends (0 with
// fewer than two steps). Safe once every worker is done, as loss.
func (d *driverActor) stepTime() time.Duration {
	var ds []time.Duration
	for i := 1; i < len(d.stepEnds); i++ {
		ds = append(ds, d.stepEnds[i].Sub(d.stepEnds[i-1]))
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// pullFinal copies shard i's current weights into w.
func pullFinal(node *actor.Node, cfg Config, i int, pid *pa.PID, w []float32) error {
	r, err := node.Root().RequestFuture(pid, &Pull{Step: -1}, opTimeout).Result()
	if err != nil {
		return fmt.Errorf("ps: final pull of shard %d: %w", i, err)
	}
	m, ok := r.(*Weights)
	if !ok {
		return fmt.Errorf("ps: final pull of shard %d: answer %T", i, r)
	}
	if m.W != nil {
		defer m.W.Free()
	}
	if m.Err != "" || m.W == nil {
		return fmt.Errorf("ps: final pull of shard %d: %s", i, m.Err)
	}
	vals, free, err := hostFloat32s(m.W)
	if err != nil {
		return fmt.Errorf("ps: final pull of shard %d: %w", i, err)
	}
	defer free()
	lo, hi := cfg.shardRange(i)
	if len(vals) != hi-lo {
		return fmt.Errorf("ps: final pull of shard %d: %d values, want %d", i, len(vals), hi-lo)
	}
	copy(w[lo:hi], vals)
	return nil
}

// hostFloat32s returns the values of a float32 tensor on the host, copying
// it there first when it lives on a device (the final weights, once).
func hostFloat32s(t *tensor.Tensor) ([]float32, func(), error) {
	if t.DType() != tensor.Float32 {
		return nil, nil, fmt.Errorf("tensor %v is not float32", t)
	}
	if t.Device().IsHost() {
		return t.Float32s(), func() {}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	h, err := t.To(ctx, memory.CPU)
	if err != nil {
		return nil, nil, err
	}
	return h.Float32s(), func() { _ = h.Free() }, nil
}
