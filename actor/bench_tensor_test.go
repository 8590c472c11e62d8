package actor_test

import (
	"context"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// This file uses only API that the tree before the engine redesign
// (c9ba0e0) and the tree after it have in common, so that the same file
// measures both side by side.

// BenchTensor carries one tensor that is delivered with the message
// (inline bytes up to the inline threshold, fetched out of band above it).
type BenchTensor struct {
	N int
	W *tensor.Tensor
}

// BenchAck acknowledges a BenchTensor: the bytes that arrived.
type BenchAck struct {
	N     int
	Bytes int64
}

func init() {
	actor.MustRegisterMessage("bench.Tensor", &BenchTensor{})
	actor.MustRegisterMessage("bench.TensorAck", &BenchAck{})
}

// BenchmarkTensorMessage is one RequestFuture round trip of a message with
// one float32 tensor field from one node to an actor on another, which
// answers with an acknowledgement and frees the tensor it received. The
// sender's tensor is reused; each iteration waits until its lease (if any)
// is released, so an iteration is the whole cycle of one tensor message.
func BenchmarkTensorMessage(b *testing.B) {
	for _, bc := range []struct {
		name  string
		bytes int
	}{
		{"inline-4KiB", 4 << 10},
		{"inline-64KiB", 64 << 10},
		{"fetched-1MiB", 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			_, nodes := startClusterB(b, 2)
			a, c := nodes[0], nodes[1]
			_, err := c.Root().SpawnNamed(pa.PropsFromFunc(func(ctx pa.Context) {
				if m, ok := ctx.Message().(*BenchTensor); ok {
					var n int64
					if m.W != nil {
						n = m.W.ByteSize()
					}
					ctx.Respond(&BenchAck{N: m.N, Bytes: n})
					if m.W != nil {
						_ = m.W.Free()
					}
				}
			}), "tsink")
			if err != nil {
				b.Fatal(err)
			}
			pid := a.PID(c.Name(), "tsink")
			x, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{int64(bc.bytes / 4)})
			if err != nil {
				b.Fatal(err)
			}
			defer x.Free()
			h := x.Host()
			for i := range h {
				h[i] = byte(i)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.SetBytes(int64(bc.bytes))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				res, err := a.Root().RequestFuture(pid, &BenchTensor{N: i, W: x}, 10*time.Second).Result()
				if err != nil {
					b.Fatal(err)
				}
				ack, ok := res.(*BenchAck)
				if !ok || ack.N != i || ack.Bytes != int64(bc.bytes) {
					b.Fatalf("reply %T %+v, want ack %d of %d bytes", res, res, i, bc.bytes)
				}
				if err := x.WaitReleased(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
