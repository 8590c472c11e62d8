package actor_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// destProps answers Grad with a Digest of the tensor, received into dst
// (WithDestinations) when dst is not nil; Digest.Err says when the field
// is not a view of dst. The handler frees the field, which must leave dst
// whole.
func destProps(node *actor.Node, dst *tensor.Tensor) *pa.Props {
	recv := func(c pa.Context) {
		m, ok := c.Message().(*Grad)
		if !ok {
			return
		}
		d := digest(m.W)
		if dst != nil && m.W.Buffer().Ptr() != dst.Buffer().Ptr() {
			d.Err = fmt.Sprintf("field at %#x, destination at %#x", m.W.Buffer().Ptr(), dst.Buffer().Ptr())
		}
		_ = m.W.Free()
		c.Respond(d)
	}
	if dst == nil {
		return pa.PropsFromFunc(recv)
	}
	return pa.PropsFromFunc(recv, node.WithDestinations(func(msg any, d *tensor.Descriptor) *tensor.Tensor {
		if _, ok := msg.(*Grad); ok {
			return dst
		}
		return nil
	}))
}

// pullSteps sends steps same-shaped tensors of new contents to pid, one
// at a time, checks each answer, and returns the destinations the process
// allocated after the first step.
func pullSteps(t *testing.T, a *actor.Node, pid *pa.PID, shape tensor.Shape, steps int) uint64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 6))
	var before uint64
	for step := range steps {
		x := randomTensor(t, rng, tensor.Float32, shape)
		if step == 1 {
			before = memory.UninitAllocs()
		}
		res, err := a.Root().RequestFuture(pid, &Grad{Step: step, W: x}, 30*time.Second).Result()
		checkDigest(t, res, err, x)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = x.Free()
	}
	return memory.UninitAllocs() - before
}

func TestDestinationsAllocateNothing(t *testing.T) {
	_, nodes := startCluster(t, 2)
	for _, shape := range []tensor.Shape{{1 << 19}, {3, 5}} { // fetched, inline
		dst, err := tensor.New(memory.CPU, tensor.Float32, shape)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("dest%d", len(shape))
		if _, err := nodes[1].Root().SpawnNamed(destProps(nodes[1], dst), name); err != nil {
			t.Fatal(err)
		}
		if n := pullSteps(t, nodes[0], nodes[0].PID(nodes[1].Name(), name), shape, 6); n != 0 {
			t.Errorf("%v: %d destinations allocated after the first step, want 0", shape, n)
		}
		_ = dst.Free()
	}
	// Without destinations, every step allocates one: the count above can
	// fail.
	if _, err := nodes[1].Root().SpawnNamed(destProps(nodes[1], nil), "alloc"); err != nil {
		t.Fatal(err)
	}
	if n := pullSteps(t, nodes[0], nodes[0].PID(nodes[1].Name(), "alloc"), tensor.Shape{1 << 19}, 6); n < 5 {
		t.Errorf("without destinations %d allocations in 5 steps, want at least 5", n)
	}
}

func TestDestinationsOfWrongShapeFailTheMessage(t *testing.T) {
	_, nodes := startCluster(t, 2)
	dst, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{7})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if _, err := nodes[1].Root().SpawnNamed(destProps(nodes[1], dst), "dest"); err != nil {
		t.Fatal(err)
	}
	x := randomTensor(t, rand.New(rand.NewPCG(1, 1)), tensor.Float32, tensor.Shape{1 << 19})
	defer x.Free()
	res, err := nodes[0].Root().RequestFuture(nodes[0].PID(nodes[1].Name(), "dest"), &Grad{W: x}, 30*time.Second).Result()
	if err == nil {
		if d, ok := res.(*Digest); ok && d.Err == "" {
			t.Fatalf("a tensor of %v delivered into a destination of %v", x, dst)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released after the refused destination: %v", err)
	}
}

// refIntoProps fetches RefMsg's Ref into dst (or, for a dst of the wrong
// shape, checks that FetchInto refuses it and the Ref can still be
// fetched) and answers a Digest of dst.
func refIntoProps(dst, wrong *tensor.Tensor) *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		m, ok := c.Message().(*RefMsg)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.R.FetchInto(ctx, wrong); !errors.Is(err, tensor.ErrDestination) {
			c.Respond(&Digest{Err: fmt.Sprintf("FetchInto of a wrong destination: %v, want ErrDestination", err)})
			_ = m.R.Release(ctx)
			return
		}
		if err := m.R.FetchInto(ctx, dst); err != nil {
			c.Respond(&Digest{Err: err.Error()})
			return
		}
		if err := m.R.FetchInto(ctx, dst); !errors.Is(err, tensor.ErrRefSpent) {
			c.Respond(&Digest{Err: fmt.Sprintf("second FetchInto: %v, want ErrRefSpent", err)})
			return
		}
		c.Respond(digest(dst))
	})
}

func TestRefFetchInto(t *testing.T) {
	_, nodes := startCluster(t, 2)
	shape := tensor.Shape{1 << 19}
	dst, err := tensor.New(memory.CPU, tensor.Float32, shape)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	wrong, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{1<<19 - 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Free()
	if _, err := nodes[1].Root().SpawnNamed(refIntoProps(dst, wrong), "into"); err != nil {
		t.Fatal(err)
	}
	pid := nodes[0].PID(nodes[1].Name(), "into")
	rng := rand.New(rand.NewPCG(7, 8))
	for range 3 {
		x := randomTensor(t, rng, tensor.Float32, shape)
		before := memory.UninitAllocs()
		res, err := nodes[0].Root().RequestFuture(pid, &RefMsg{R: tensor.NewRef(x)}, 30*time.Second).Result()
		checkDigest(t, res, err, x)
		if n := memory.UninitAllocs() - before; n != 0 {
			t.Errorf("FetchInto allocated %d destinations", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = x.Free()
	}
}
