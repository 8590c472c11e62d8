package ps

import (
	"context"
	"fmt"
	"sync"
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
// the gradient of its loss on its device (host memory, or a GPU with the
// kernels of kernels.ptx) and pushes one gradient tensor per shard; it
// starts the next step once every shard acknowledged. Weights and gradient
// stay on the device: the weights of shard i are fetched into wViews[i]
// (Node.WithDestinations), a view of w, and the gradient of shard i is
// lent as grads[i], a view of g, so that a step allocates nothing and
// copies nothing through the host.
type worker struct {
	node   *actor.Node
	cfg    Config
	id     int
	dev    memory.Device
	data   *gradData
	shards []*pa.PID
	driver *pa.PID

	w, g   *tensor.Tensor   // full weights and gradient, float32[Dim] on dev
	wViews []*tensor.Tensor // shard i's weights in w: its pulls' destinations
	grads  []*tensor.Tensor // shard i's gradient in g, lent every step
	destMu sync.Mutex       // wViews as the node reads it (destination)
	step   int
	got    int // shards that answered this step's pull
	acks   int // shards that acknowledged this step's push
	loss   float64
	done   bool
}

func newWorker(node *actor.Node, cfg Config, id int, dev memory.Device, shards []*pa.PID, driver *pa.PID) (*worker, error) {
	wk := &worker{node: node, cfg: cfg, id: id, dev: dev, shards: shards, driver: driver}
	if err := wk.alloc(); err != nil {
		wk.free()
		return nil, fmt.Errorf("ps: worker %d on %s: %w", id, dev, err)
	}
	return wk, nil
}

func (wk *worker) alloc() error {
	var err error
	shape := tensor.Shape{int64(wk.cfg.Dim)}
	if wk.w, err = tensor.New(wk.dev, tensor.Float32, shape); err != nil {
		return err
	}
	if wk.g, err = tensor.New(wk.dev, tensor.Float32, shape); err != nil {
		return err
	}
	for i := range wk.cfg.Shards {
		lo, hi := wk.cfg.shardRange(i)
		wv, err := shardView(wk.w, lo, hi)
		if err != nil {
			return err
		}
		gv, err := shardView(wk.g, lo, hi)
		if err != nil {
			return err
		}
		wk.wViews, wk.grads = append(wk.wViews, wv), append(wk.grads, gv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	wk.data, err = newGradData(ctx, generate(&wk.cfg, wk.id, Truth(&wk.cfg)), wk.dev)
	return err
}

// shardView returns the float32 elements [lo, hi) of t as a tensor sharing
// t's memory (its Free does nothing).
func shardView(t *tensor.Tensor, lo, hi int) (*tensor.Tensor, error) {
	b, err := t.Buffer().Slice(4*lo, 4*(hi-lo))
	if err != nil {
		return nil, err
	}
	return tensor.FromBuffer(b, tensor.Float32, tensor.Shape{int64(hi - lo)})
}

// destination gives the weights of a shard's answer their place in w
// (Node.WithDestinations): the worker pulls each shard once per step and
// reads w only once every shard answered, so nothing else uses it while
// the node fetches into it.
func (wk *worker) destination(msg any, _ *tensor.Descriptor) *tensor.Tensor {
	m, ok := msg.(*Weights)
	if !ok {
		return nil
	}
	wk.destMu.Lock()
	defer wk.destMu.Unlock()
	if m.Shard >= 0 && m.Shard < len(wk.wViews) {
		return wk.wViews[m.Shard]
	}
	return nil
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
		defer m.W.Free() // nothing when it is a view of w
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
	dst := wk.wViews[m.Shard]
	if m.W.DType() != tensor.Float32 || !m.W.Shape().Equal(dst.Shape()) {
		wk.fail(c, fmt.Errorf("ps: worker %d: shard %d sent %v, want float32%v", wk.id, m.Shard, m.W, dst.Shape()))
		return
	}
	if m.W.Device() != dst.Device() || m.W.Buffer().Ptr() != dst.Buffer().Ptr() {
		// Not fetched into its place (a shard of this node passes its
		// copy by pointer): copy it there, device to device.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := memory.Copy(ctx, dst.Buffer(), m.W.Buffer())
		cancel()
		if err != nil {
			wk.fail(c, fmt.Errorf("ps: worker %d: %w", wk.id, err))
			return
		}
	}
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
	err := wk.g.Write(func(g memory.Buffer) error {
		var err error
		wk.loss, err = wk.data.gradient(ctx, wk.w.Buffer(), g)
		return err
	})
	if err != nil {
		wk.fail(c, fmt.Errorf("ps: worker %d: gradient: %w", wk.id, err))
		return
	}
	for i, t := range wk.grads {
		g := t
		if wk.shards[i].Address == wk.node.Name() {
			// Local messages are passed by pointer: give the shard a copy.
			cp, err := t.To(ctx, t.Device())
			if err != nil {
				wk.fail(c, fmt.Errorf("ps: worker %d: %w", wk.id, err))
				return
			}
			g = cp
		}
		c.Request(wk.shards[i], &Push{Worker: wk.id, Step: wk.step, G: g})
	}
	c.Send(wk.driver, &Progress{Worker: wk.id, Step: wk.step, Loss: wk.loss, Samples: len(wk.data.d.y)})
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
	// No destinations from now on: the worker stops once training is over,
	// when no pull is in flight.
	wk.destMu.Lock()
	wk.wViews = nil
	wk.destMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range wk.grads {
		_ = t.WaitReleased(ctx)
	}
	wk.grads = nil
	for _, t := range []*tensor.Tensor{wk.w, wk.g} {
		if t != nil {
			_ = t.Free()
		}
	}
	wk.w, wk.g = nil, nil
	if wk.data != nil {
		wk.data.free()
		wk.data = nil
	}
}
