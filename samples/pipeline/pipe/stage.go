package pipe

import (
	"context"
	"fmt"
	"slices"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// opTimeout bounds one fetch or one wait for leases.
const opTimeout = 30 * time.Second

// lender keeps the tensors a stage sent to other nodes until their leases
// end: sending lends a tensor, and only then may it be freed.
type lender struct{ ts []*tensor.Tensor }

func (l *lender) add(t *tensor.Tensor) { l.ts = append(l.ts, t) }

// sweep frees every tensor no longer lent.
func (l *lender) sweep() {
	keep := l.ts[:0]
	for _, t := range l.ts {
		if t.Leases() > 0 {
			keep = append(keep, t)
		} else {
			_ = t.Free()
		}
	}
	clear(l.ts[len(keep):])
	l.ts = keep
}

// drain waits (a bounded time) for every lease to end and frees everything.
func (l *lender) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range l.ts {
		_ = t.WaitReleased(ctx)
		_ = t.Free()
	}
	l.ts = nil
}

// stage is one pipeline stage actor. Stages 1 and 2 send to next with the
// original sender (the driver's future), so stage 3 answers the driver
// directly and a delivery failure anywhere fails that micro-batch at once.
type stage struct {
	node *actor.Node
	cfg  Config
	w    []float32
	next *pa.PID
	lent lender
	dev  memory.Device // where the stage's tensors arrive and its activations live
}

// Receive implements protoactor's Actor.
func (s *stage) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Input:
		s.lent.sweep()
		if err := s.stage1(c, m); err != nil {
			c.Respond(&Output{Batch: m.Batch, Err: err.Error()})
		}
	case *Act1:
		s.lent.sweep()
		if err := s.stage2(c, m); err != nil {
			c.Respond(&Output{Batch: m.Batch, Err: err.Error()})
		}
	case *Act2:
		s.lent.sweep()
		out, err := s.stage3(m)
		if err != nil {
			c.Respond(&Output{Batch: m.Batch, Err: err.Error()})
			return
		}
		if c.Sender() != nil && c.Sender().Address != s.node.Name() {
			// Lent to a remote driver; on this node it is handed over.
			s.lent.add(out.Y)
		}
		c.Respond(out)
	case *pa.Stopped:
		s.lent.drain()
	}
}

func (s *stage) stage1(c pa.Context, m *Input) error {
	if m.X != nil {
		defer m.X.Free()
	}
	x, err := hostValues(m.X, s.cfg.Rows*s.cfg.Dim)
	if err != nil {
		return fmt.Errorf("pipe: stage 1: input: %w", err)
	}
	a1, err := s.onDevice(Stage1(&s.cfg, x, s.w), tensor.Shape{int64(s.cfg.Rows), int64(s.cfg.Dim)})
	if err != nil {
		return fmt.Errorf("pipe: stage 1: %w", err)
	}
	// a1 goes twice: eagerly for stage 2, and as a Ref stage 2 forwards.
	c.RequestWithCustomSender(s.next, &Act1{Batch: m.Batch, A: a1, Skip: tensor.NewRef(a1)}, c.Sender())
	s.lent.add(a1)
	return nil
}

func (s *stage) stage2(c pa.Context, m *Act1) error {
	if m.A != nil {
		defer m.A.Free()
	}
	a1, err := hostValues(m.A, s.cfg.Rows*s.cfg.Dim)
	if err != nil {
		s.release(m.Skip)
		return fmt.Errorf("pipe: stage 2: activation: %w", err)
	}
	a2, err := s.onDevice(Stage2(&s.cfg, a1, s.w), tensor.Shape{int64(s.cfg.Rows), int64(s.cfg.Dim)})
	if err != nil {
		s.release(m.Skip)
		return fmt.Errorf("pipe: stage 2: %w", err)
	}
	// m.Skip is forwarded as received: no bytes move here, and stage 3
	// fetches it from stage 1's node.
	c.RequestWithCustomSender(s.next, &Act2{Batch: m.Batch, A: tensor.NewRef(a2), Skip: m.Skip}, c.Sender())
	s.lent.add(a2)
	return nil
}

func (s *stage) stage3(m *Act2) (*Output, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	skip, err := m.Skip.Fetch(ctx, s.dev) // from stage 1's node
	if err != nil {
		s.release(m.A)
		return nil, fmt.Errorf("pipe: stage 3: fetch skip %v: %w", m.Skip, err)
	}
	defer skip.Free()
	a2, err := m.A.Fetch(ctx, s.dev) // from stage 2's node
	if err != nil {
		return nil, fmt.Errorf("pipe: stage 3: fetch %v: %w", m.A, err)
	}
	defer a2.Free()
	n := s.cfg.Rows * s.cfg.Dim
	av, err := hostValues(a2, n)
	if err != nil {
		return nil, fmt.Errorf("pipe: stage 3: %w", err)
	}
	sv, err := hostValues(skip, n)
	if err != nil {
		return nil, fmt.Errorf("pipe: stage 3: %w", err)
	}
	y, err := tensor.FromFloat32s(Stage3(&s.cfg, av, sv, s.w), tensor.Shape{int64(s.cfg.Rows), int64(s.cfg.Out)})
	if err != nil {
		return nil, fmt.Errorf("pipe: stage 3: %w", err)
	}
	return &Output{Batch: m.Batch, Y: y}, nil
}

func (s *stage) release(r tensor.Ref) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_ = r.Release(ctx)
}

// hostValues returns the n float32 values of t, copied to the host first
// when t is on a GPU.
func hostValues(t *tensor.Tensor, n int) ([]float32, error) {
	if t == nil || t.Device().IsHost() {
		return values(t, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	h, err := t.To(ctx, memory.CPU)
	if err != nil {
		return nil, err
	}
	defer h.Free()
	v, err := values(h, n)
	return slices.Clone(v), err
}

// onDevice returns a tensor of shape holding v on the stage's device.
func (s *stage) onDevice(v []float32, shape tensor.Shape) (*tensor.Tensor, error) {
	h, err := tensor.FromFloat32s(v, shape)
	if err != nil || s.dev.IsHost() {
		return h, err
	}
	defer h.Free()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return h.To(ctx, s.dev)
}

// values returns the n float32 values of a host tensor.
func values(t *tensor.Tensor, n int) ([]float32, error) {
	switch {
	case t == nil:
		return nil, fmt.Errorf("no tensor")
	case t.DType() != tensor.Float32 || !t.Device().IsHost():
		return nil, fmt.Errorf("tensor %v, want float32 in host memory", t)
	}
	v := t.Float32s()
	if len(v) != n {
		return nil, fmt.Errorf("tensor %v has %d values, want %d", t, len(v), n)
	}
	return v, nil
}
