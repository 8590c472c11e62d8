package actor_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func init() {
	actor.MustRegisterMessage("test.BytesValue", &wrapperspb.BytesValue{})
}

func TestProtobufMessages(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	echo := pa.PropsFromFunc(func(c pa.Context) {
		if m, ok := c.Message().(*wrapperspb.BytesValue); ok {
			c.Respond(wrapperspb.Bytes(append([]byte("re:"), m.Value...)))
		}
	})
	if _, err := b.Root().SpawnNamed(echo, "pb"); err != nil {
		t.Fatal(err)
	}
	res, err := a.Root().RequestFuture(a.PID(b.Name(), "pb"), wrapperspb.Bytes([]byte("hello")), 5*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.(*wrapperspb.BytesValue).Value); got != "re:hello" {
		t.Fatalf("got %q", got)
	}
}

// A tensor that cannot be materialized on the receiving actor's device is
// reported to the sender (never dropped), and its lease is released.
func TestUndeliverableTensorIsReported(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	bad := memory.CUDA(999) // no machine has it
	if _, err := b.Root().SpawnNamed(tensorProps(b).Configure(b.WithDevice(bad)), "gpu-only"); err != nil {
		t.Fatal(err)
	}
	x := randomTensor(t, rand.New(rand.NewPCG(1, 1)), tensor.Float32, tensor.Shape{1 << 18})
	pid := a.PID(b.Name(), "gpu-only")

	// A future fails at once.
	start := time.Now()
	if _, err := a.Root().RequestFuture(pid, &Grad{W: x}, 20*time.Second).Result(); !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("err = %v, want ErrDeadLetter", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("reported after %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease kept: %v", err)
	}

	// An actor sender gets DeliveryFailed with the reason.
	got := make(chan *actor.DeliveryFailed, 1)
	sender := pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *pa.Started:
			c.Request(pid, &Grad{W: x})
		case *actor.DeliveryFailed:
			got <- m
		}
	})
	if _, err := a.Root().SpawnNamed(sender, "sender"); err != nil {
		t.Fatal(err)
	}
	select {
	case df := <-got:
		if !strings.Contains(df.Reason, "cuda:999") {
			t.Fatalf("reason %q does not name the device", df.Reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no DeliveryFailed")
	}
}
