package actor_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestTensorMessagesKeepOrder: messages with tensors to fetch (several
// fetched at once, the later ones smaller so that they finish first) and
// plain messages between them arrive in the order they were sent, with the
// right bytes, and every lease comes back.
func TestTensorMessagesKeepOrder(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	const n = 60
	var mu sync.Mutex
	var got []int
	var bad []string
	done := make(chan struct{})
	record := func(i int) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, i)
		if len(got) == n {
			close(done)
		}
	}
	// Every message and its expected digest exist before the receiver runs.
	rng := rand.New(rand.NewPCG(3, 4))
	want := map[int]uint64{}
	msgs := make([]any, n)
	var sent []*tensor.Tensor
	for i := range n {
		if i%3 == 2 {
			msgs[i] = &Ping{N: i}
			continue
		}
		x := randomTensor(t, rng, tensor.Uint8, tensor.Shape{int64(128<<10 + (n-i)*32<<10)})
		want[i] = digest(x).Hash
		sent = append(sent, x)
		msgs[i] = &Grad{Step: i, W: x}
	}
	_, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *Grad:
			if d := digest(m.W); d.Hash != want[m.Step] {
				mu.Lock()
				bad = append(bad, m.W.String())
				mu.Unlock()
			}
			_ = m.W.Free()
			record(m.Step)
		case *Ping:
			record(m.N)
		}
	}), "order")
	if err != nil {
		t.Fatal(err)
	}
	pid := a.PID(b.Name(), "order")
	for _, m := range msgs {
		a.Root().Send(pid, m)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		t.Fatalf("only %d of %d messages arrived: %v", len(got), n, got)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		if v != i {
			t.Fatalf("arrival order %v", got)
		}
	}
	if len(bad) > 0 {
		t.Errorf("wrong bytes in %v", bad)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, x := range sent {
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatalf("%v: lease not released: %v", x, err)
		}
	}
}
