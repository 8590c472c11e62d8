package actor_test

import (
	"context"
	"fmt"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// Weights is an example message: its tensor field travels out of band.
type Weights struct {
	Step int
	W    *tensor.Tensor
}

// Sum answers a Weights with the sum of its values.
type Sum struct{ Value float32 }

func init() {
	actor.MustRegisterMessage("example.Weights", &Weights{})
	actor.MustRegisterMessage("example.Sum", &Sum{})
}

// Two nodes of one loopback cluster, each attached to an ActorSystem of its
// own: a tensor of 1 MiB sent from a to an actor on b is fetched by b
// before delivery, and a can write it again once b released it.
func ExampleNewRemote() {
	cfg, _ := config.LocalConfig("example", 2)
	var nodes []*actor.Node
	for _, nc := range cfg.Nodes {
		system := pa.NewActorSystem()
		node, err := actor.NewRemote(system, cfg, nc.Name)
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := node.Start(); err != nil {
			fmt.Println(err)
			return
		}
		defer node.Stop()
		nodes = append(nodes, node)
	}
	a, b := nodes[0], nodes[1]
	fmt.Println(actor.GetNode(a.System()) == a)

	// On b: an actor that sums what it gets.
	_, _ = b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if m, ok := c.Message().(*Weights); ok {
			var s float32
			for _, v := range m.W.Float32s() {
				s += v
			}
			_ = m.W.Free()
			c.Respond(&Sum{Value: s})
		}
	}), "summer")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = a.WaitPeer(ctx, b.Name())
	w, _ := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{1 << 18}) // 1 MiB
	for i := range w.Float32s() {
		w.Float32s()[i] = 1
	}
	res, err := a.Request(ctx, a.PID(b.Name(), "summer"), &Weights{Step: 1, W: w})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.(*Sum).Value)
	<-w.Released() // b fetched w: it may be written again
	fmt.Println(w.Write(func(memory.Buffer) error { return nil }))
	_ = w.Free()
	// Output:
	// true
	// 262144
	// <nil>
}
