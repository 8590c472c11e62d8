package ps

import (
	"context"
	"fmt"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// stepTimeout is how long a worker waits for any answer from the shards
// before it gives up: longer than a transfer's deadline plus a shard's
// longest wait for leases.
const stepTimeout = 2 * time.Minute

// worker owns a slice of the data. Each step it pulls every shard, computes
// the gradient of its loss on host memory and pushes one gradient tensor per
// shard; it starts the next step once every shard acknowledged.
type worker struct {
	node   *actor.Node
	cfg    Config
	id     int
	data   *dataset
	shards []*pa.PID
	driver *pa.PID

	w, g  []float32        // full weights and gradient, host
	grads []*tensor.Tensor // per-shard gradient tensors, reused every step
	step  int
	got   int // shards that answered this step's pull
	acks  int // shards that acknowledged this step's push
	loss  float64
	done  bool
}

func newWorker(node *actor.Node, cfg Config, id int, shards []*pa.PID, driver *pa.PID) (*worker, error) {
	wk := &worker{node: node, cfg: cfg, id: id, shards: shards, driver: driver,
		w: make([]float32, cfg.Dim), g: make([]float32, cfg.Dim)}
	for i := range cfg.Shards {
		lo, hi := cfg.shardRange(i)
		t, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{int64(hi - lo)})
		if err != nil {
			wk.free()
			return nil, fmt.Errorf("ps: worker %d: %w", id, err)
		}
		wk.grads = append(wk.grads, t)
	}
	wk.data = generate(&cfg, id, Truth(&cfg))
	return wk, nil
}

// Receive implements protoactor's Actor.
func (wk *worker) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Train:
		// A watchdog: a step that gets no answer for this long fails.
		c.SetReceiveTimeout(stepTimeout)
		// Fail at once if a shard's node goes down: messages in flight to
		// or from it are lost.
		for _, s := range wk.shards {
			c.Watch(s)
		}
		wk.startStep(c)
	case *pa.Terminated:
		wk.fail(c, fmt.Errorf("ps: worker %d: shard %v ended (%v)", wk.id, m.Who, m.Why))
	case *pa.ReceiveTimeout:
		wk.fail(c, fmt.Errorf("ps: worker %d: step %d: no answer from the shards for %v", wk.id, wk.step, stepTimeout))
	case *Weights:
		wk.weights(c, m)
	case *Ack:
		wk.ack(c, m)
	case *actor.DeliveryFailed:
		wk.fail(c, m)
	case *pa.DeadLetterResponse:
		wk.fail(c, fmt.Errorf("ps: worker %d: %v is gone", wk.id, m.Target))
	case *pa.Stopped:
		wk.free()
	}
}

func (wk *worker) startStep(c pa.Context) {
	if wk.done {
		return
	}
	if wk.step == wk.cfg.Steps {
		wk.done = true
		c.CancelReceiveTimeout()
		c.Send(wk.driver, &Done{Worker: wk.id})
		return
	}
	wk.got, wk.acks = 0, 0
	for _, s := range wk.shards {
		c.Request(s, &Pull{Step: wk.step})
	}
}

func (wk *worker) weights(c pa.Context, m *Weights) {
	if m.W != nil {
		defer m.W.Free()
	}
	if wk.done {
		return
	}
	if m.Err != "" {
		wk.fail(c, fmt.Errorf("ps: worker %d: shard %d: %s", wk.id, m.Shard, m.Err))
		return
	}
	if m.Shard < 0 || m.Shard >= wk.cfg.Shards || m.W == nil {
		wk.fail(c, fmt.Errorf("ps: worker %d: bad weights from shard %d", wk.id, m.Shard))
		return
	}
	lo, hi := wk.cfg.shardRange(m.Shard)
	vals, free, err := hostFloat32s(m.W)
	if err != nil {
		wk.fail(c, fmt.Errorf("ps: worker %d: %w", wk.id, err))
		return
	}
	defer free()
	if len(vals) != hi-lo {
		wk.fail(c, fmt.Errorf("ps: worker %d: shard %d sent %d weights, want %d", wk.id, m.Shard, len(vals), hi-lo))
		return
	}
	copy(wk.w[lo:hi], vals)
	if wk.got++; wk.got == len(wk.shards) {
		wk.compute(c)
	}
}

// compute takes the gradient at the pulled weights and pushes its shards.
func (wk *worker) compute(c pa.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// The gradient tensors of the last step were lent to the shards: wait
	// until every shard's node fetched them before overwriting.
	for _, t := range wk.grads {
		if err := t.WaitReleased(ctx); err != nil {
			wk.fail(c, fmt.Errorf("ps: worker %d: %w", wk.id, err))
			return
		}
	}
	wk.loss = wk.data.gradient(wk.w, wk.g)
	for i, t := range wk.grads {
		lo, hi := wk.cfg.shardRange(i)
		copy(t.Float32s(), wk.g[lo:hi])
		g := t
		if wk.shards[i].Address == wk.node.Name() {
			// Local messages are passed by pointer: give the shard a copy.
			cp, err := t.To(ctx, memory.CPU)
			if err != nil {
				wk.fail(c, fmt.Errorf("ps: worker %d: %w", wk.id, err))
				return
			}
			g = cp
		}
		c.Request(wk.shards[i], &Push{Worker: wk.id, Step: wk.step, G: g})
	}
	c.Send(wk.driver, &Progress{Worker: wk.id, Step: wk.step, Loss: wk.loss, Samples: len(wk.data.y)})
}

func (wk *worker) ack(c pa.Context, m *Ack) {
	if wk.done {
		return
	}
	if m.Err != "" {
		wk.fail(c, fmt.Errorf("ps: worker %d: shard %d: %s", wk.id, m.Shard, m.Err))
		return
	}
	if wk.acks++; wk.acks == len(wk.shards) {
		wk.step++
		wk.startStep(c)
	}
}

func (wk *worker) fail(c pa.Context, err error) {
	if wk.done {
		return
	}
	wk.done = true
	c.CancelReceiveTimeout()
	c.Send(wk.driver, &Done{Worker: wk.id, Err: err.Error()})
}

func (wk *worker) free() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range wk.grads {
		_ = t.WaitReleased(ctx)
		_ = t.Free()
	}
	wk.grads = nil
}

// hostFloat32s returns the values of a float32 tensor on the host, copying
// it there first when it lives on a device.
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
