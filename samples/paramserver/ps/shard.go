package ps

import (
	"context"
	"errors"
	"fmt"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// opTimeout bounds one wait for leases or one device operation.
const opTimeout = 30 * time.Second

// pendingPull is a sync-mode pull for a step the shard has not reached.
type pendingPull struct {
	to   *pa.PID
	step int
}

// shard holds weights[lo:hi] on its device. Its tensors are allocated by
// newShard and freed when the actor stops.
type shard struct {
	node   *actor.Node
	cfg    Config
	id     int
	w, sum *tensor.Tensor // sum: the step's gradients so far (sync)
	step   int            // version of w: updates applied
	got    int            // gradients of this step summed into sum (sync)
	acks   []*pa.PID      // pushers waiting for this step's update (sync)
	pulls  []pendingPull
	err    error // first failure; every later request gets it
	// Updates that wait until w is no longer lent (see apply); waiting is
	// set while a goroutine pipes w.Released() to the actor.
	deferred []deferredUpdate
	waiting  bool
}

// deferredUpdate is an update of w that waits for w's leases to end.
type deferredUpdate struct {
	g    *tensor.Tensor // the gradient; freed once applied when own
	own  bool
	lr   float32
	done func(c pa.Context) // after the update (acks, weights to pulls)
	fail func(c pa.Context, err error)
}

// weightsReleased tells the shard that w is no longer lent (a local
// message, sent by the goroutine apply starts).
type weightsReleased struct{}

func newShard(node *actor.Node, cfg Config, id int, dev memory.Device) (*shard, error) {
	lo, hi := cfg.shardRange(id)
	zeros, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{int64(hi - lo)})
	if err != nil {
		return nil, err
	}
	defer zeros.Free()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// Device memory is not zeroed by tensor.New: start from a copy of zeros.
	w, err := zeros.To(ctx, dev)
	if err != nil {
		return nil, fmt.Errorf("ps: shard %d on %s: %w", id, dev, err)
	}
	s := &shard{node: node, cfg: cfg, id: id, w: w}
	if cfg.Mode == Sync {
		if s.sum, err = tensor.New(dev, tensor.Float32, w.Shape()); err != nil {
			_ = w.Free()
			return nil, fmt.Errorf("ps: shard %d on %s: %w", id, dev, err)
		}
	}
	return s, nil
}

// Receive implements protoactor's Actor.
func (s *shard) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Pull:
		s.pull(c, c.Sender(), m.Step)
	case *Push:
		s.push(c, m)
	case *actor.DeliveryFailed:
		// Weights or an Ack did not reach a worker (its node could not
		// fetch the tensor, or went down): tell it, without a tensor, so it
		// fails at once instead of waiting.
		c.Send(m.Target, &Weights{Shard: s.id, Err: m.Error()})
	case weightsReleased:
		s.waiting = false
		s.applyDeferred(c)
	case *pa.Stopped:
		s.free()
	}
}

func (s *shard) pull(c pa.Context, to *pa.PID, step int) {
	switch {
	case s.err != nil:
		c.Send(to, &Weights{Shard: s.id, Err: s.err.Error()})
	case s.cfg.Mode == Sync && step > s.step:
		s.pulls = append(s.pulls, pendingPull{to: to, step: step})
	case s.cfg.Mode == Sync && step >= 0 && step < s.step:
		c.Send(to, &Weights{Shard: s.id, Err: fmt.Sprintf("ps: shard %d: pull of step %d, shard is at step %d", s.id, step, s.step)})
	default:
		s.sendWeights(c, to)
	}
}

// sendWeights lends w to a remote requester: the receiving node fetches it
// out of band and releases the lease; until then w must not be written (see
// update). A requester on this node gets its own copy, since local messages
// are passed by pointer.
func (s *shard) sendWeights(c pa.Context, to *pa.PID) {
	w := s.w
	if to.Address == s.node.Name() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		cp, err := s.w.To(ctx, s.w.Device())
		if err != nil {
			c.Send(to, &Weights{Shard: s.id, Err: fmt.Sprintf("ps: shard %d: copy weights: %v", s.id, err)})
			return
		}
		w = cp
	}
	// Request, not Send: a delivery failure comes back as DeliveryFailed.
	c.Request(to, &Weights{Shard: s.id, Step: s.step, W: w})
}

func (s *shard) push(c pa.Context, m *Push) {
	if s.err != nil {
		c.Send(c.Sender(), &Ack{Shard: s.id, Step: m.Step, Err: s.err.Error()})
		return
	}
	g, err := s.onDevice(m.G)
	if err != nil {
		s.fail(c, c.Sender(), m.Step, err)
		return
	}
	sender, step := c.Sender(), m.Step
	if s.cfg.Mode == Async {
		// Each worker's gradient averages over its own rows only: scale by
		// 1/Workers so that one round of pushes moves as far as one sync step.
		s.apply(c, deferredUpdate{g: g, own: true, lr: float32(s.cfg.LR / float64(s.cfg.Workers)),
			done: func(c pa.Context) {
				s.step++
				c.Send(sender, &Ack{Shard: s.id, Step: step})
			},
			fail: func(c pa.Context, err error) { s.fail(c, sender, step, err) }})
		return
	}
	defer g.Free()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if m.Step != s.step {
		s.fail(c, c.Sender(), m.Step, fmt.Errorf("ps: shard %d: gradient of step %d from worker %d at step %d", s.id, m.Step, m.Worker, s.step))
		return
	}
	if s.got == 0 {
		err = memory.Copy(ctx, s.sum.Buffer(), g.Buffer())
	} else {
		err = axpy(ctx, 1, g.Buffer(), s.sum.Buffer())
	}
	if err != nil {
		s.fail(c, c.Sender(), m.Step, err)
		return
	}
	s.got++
	s.acks = append(s.acks, c.Sender())
	if s.got < s.cfg.Workers {
		return
	}
	// Every worker's gradient is in: apply the average (once w is not lent).
	s.apply(c, deferredUpdate{g: s.sum, lr: float32(s.cfg.LR / float64(s.cfg.Workers)), done: s.endStep,
		fail: func(c pa.Context, err error) { s.fail(c, nil, step, err) }})
}

// endStep answers the step's pushers and the pulls of the next step once
// the sync update is applied.
func (s *shard) endStep(c pa.Context) {
	for _, to := range s.acks {
		c.Send(to, &Ack{Shard: s.id, Step: s.step})
	}
	s.step++
	s.got, s.acks = 0, s.acks[:0]
	keep := s.pulls[:0]
	for _, p := range s.pulls {
		if p.step == s.step {
			s.sendWeights(c, p.to)
		} else {
			keep = append(keep, p)
		}
	}
	s.pulls = keep
}

// apply applies w -= lr·g now if w is not lent, else once its leases end
// (the weights may be lent to workers whose nodes are fetching them). It
// never blocks the actor: a goroutine waits on w.Released() and tells the
// actor, which applies the deferred updates in order (weightsReleased).
func (s *shard) apply(c pa.Context, u deferredUpdate) {
	s.deferred = append(s.deferred, u)
	s.applyDeferred(c)
}

// applyDeferred applies the deferred updates while w is not lent; if it is
// lent again, it waits for the next release.
func (s *shard) applyDeferred(c pa.Context) {
	for len(s.deferred) > 0 && !s.waiting {
		u := s.deferred[0]
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := s.w.Write(func(w memory.Buffer) error { return sgd(ctx, w, u.g.Buffer(), u.lr) })
		cancel()
		if errors.Is(err, tensor.ErrLeased) {
			s.waiting = true
			self, root, released := c.Self(), c.ActorSystem().Root, s.w.Released()
			go func() { <-released; root.Send(self, weightsReleased{}) }()
			return
		}
		s.deferred = s.deferred[1:]
		if u.own {
			_ = u.g.Free()
		}
		if err != nil {
			u.fail(c, fmt.Errorf("ps: shard %d: %w", s.id, err))
			continue
		}
		u.done(c)
	}
}

// onDevice returns the gradient on the shard's device (a copy when it
// arrived elsewhere, freeing the original).
func (s *shard) onDevice(g *tensor.Tensor) (*tensor.Tensor, error) {
	if g == nil {
		return nil, fmt.Errorf("ps: shard %d: push without a gradient", s.id)
	}
	if g.DType() != tensor.Float32 || !g.Shape().Equal(s.w.Shape()) {
		_ = g.Free()
		return nil, fmt.Errorf("ps: shard %d: gradient %v, want float32%v", s.id, g, s.w.Shape())
	}
	if g.Device() == s.w.Device() {
		return g, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	cp, err := g.To(ctx, s.w.Device())
	_ = g.Free()
	return cp, err
}

// fail records err, answers every waiting pusher (and to, if not nil) and
// every pending pull with it.
func (s *shard) fail(c pa.Context, to *pa.PID, step int, err error) {
	s.err = err
	if to != nil {
		s.acks = append(s.acks, to)
	}
	for _, p := range s.acks {
		c.Send(p, &Ack{Shard: s.id, Step: step, Err: err.Error()})
	}
	for _, p := range s.pulls {
		c.Send(p.to, &Weights{Shard: s.id, Err: err.Error()})
	}
	s.acks, s.pulls = nil, nil
}

func (s *shard) free() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, u := range s.deferred {
		if u.own {
			_ = u.g.Free()
		}
	}
	s.deferred = nil
	_ = s.w.WaitReleased(ctx)
	_ = s.w.Free()
	if s.sum != nil {
		_ = s.sum.Free()
	}
}
