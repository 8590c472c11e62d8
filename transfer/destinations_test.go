package transfer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// carryInto is carry with the receiver's destinations.
func carryInto(t *testing.T, a, b *Engine, msg *grad, dests Destinations) (*grad, *Incoming, error) {
	t.Helper()
	_, got, in, err := carryWith(t, a, b, msg, dests)
	return got, in, err
}

// A message's tensor lands in the receiver's destination on the reader
// (a direct fetch), through the delivery loop, and inline; the field is a
// view whose Free leaves the destination whole, and nothing is allocated.
func TestEngineDestinations(t *testing.T) {
	for _, c := range []struct {
		name   string
		direct bool
		n      int64
	}{{"loop", false, 1000}, {"direct", true, 1000}, {"inline", false, 8}} {
		t.Run(c.name, func(t *testing.T) {
			if c.direct {
				directFetches(t)
			}
			a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
			dst := newTensor(t, c.n, 0)
			dests := func(msg any, d *tensor.Descriptor) *tensor.Tensor {
				if m, ok := msg.(*grad); !ok || m.Step != 7 || d.Bytes != c.n {
					t.Errorf("destination asked for %T %+v, %v", msg, msg, d)
				}
				return dst
			}
			for i := range 3 {
				x := newTensor(t, c.n, byte(i+1))
				allocs := memory.UninitAllocs()
				got, in, err := carryInto(t, a, b, &grad{Step: 7, W: x}, dests)
				if err != nil {
					t.Fatal(err)
				}
				if in != nil {
					d := &delivery{ch: make(chan error, 1)}
					if c.direct {
						err = b.Receive(a.cfg.Node, in, 100, d, nil)
					} else {
						err = b.Enqueue(a.cfg.Node, in, 100, d)
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := <-d.ch; err != nil {
						t.Fatal(err)
					}
				}
				if n := memory.UninitAllocs() - allocs; n != 0 {
					t.Errorf("step %d: %d destinations allocated", i, n)
				}
				if got.W.Buffer().Ptr() != dst.Buffer().Ptr() || dst.Host()[c.n-1] != byte(i+1) {
					t.Fatalf("step %d: field at %#x, destination at %#x holds %d", i, got.W.Buffer().Ptr(), dst.Buffer().Ptr(), dst.Host()[c.n-1])
				}
				if err := got.W.Free(); err != nil || dst.Host() == nil {
					t.Fatalf("freeing the field: %v; destination %v", err, dst)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := x.WaitReleased(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
			if c.direct && b.Stats().ReaderDeliveries != 3 {
				t.Errorf("%d deliveries on the reader, want 3", b.Stats().ReaderDeliveries)
			}
		})
	}
}

// A destination of another shape, or one that is lent, fails the message
// with a clear error and gives the sender's lease back.
func TestEngineDestinationRefused(t *testing.T) {
	a, b, _, _ := enginePair(t, Config{InlineThreshold: 16})
	x := newTensor(t, 1000, 1)
	wrong := newTensor(t, 999, 0)
	_, in, err := carryInto(t, a, b, &grad{W: x}, func(any, *tensor.Descriptor) *tensor.Tensor { return wrong })
	if !errors.Is(err, tensor.ErrDestination) || in != nil {
		t.Fatalf("import into a destination of 999 bytes: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released after the refusal: %v", err)
	}

	// A lent destination: its owner's leases forbid the write.
	lent := newTensor(t, 1000, 0)
	if _, err := a.Export(b.cfg.Node, &grad{W: lent}); err != nil {
		t.Fatal(err)
	}
	_, in, err = carryInto(t, a, b, &grad{W: x}, func(any, *tensor.Descriptor) *tensor.Tensor { return lent })
	if err != nil {
		t.Fatal(err)
	}
	d := &delivery{ch: make(chan error, 1)}
	if err := b.Enqueue(a.cfg.Node, in, 100, d); err != nil {
		t.Fatal(err)
	}
	if err := <-d.ch; !errors.Is(err, tensor.ErrLeased) {
		t.Fatalf("fetch into a lent destination: %v, want ErrLeased", err)
	}
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released after the failed fetch: %v", err)
	}
}
