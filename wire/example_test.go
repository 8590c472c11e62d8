package wire_test

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/tensorferry/tensorferry/wire"
)

type Grad struct {
	Step int
	Norm float64
}

// Two nodes authenticate each other over an in-memory connection, then one
// sends a registered message to an actor on the other.
func Example() {
	secret := []byte("an example secret of 32 bytes!!!")
	registry := wire.NewRegistry()
	registry.MustRegister("example.Grad", Grad{})

	dialer, listener := net.Pipe()
	ctx := context.Background()

	var wg sync.WaitGroup
	var accepted wire.Remote
	var acceptErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		accepted, acceptErr = wire.Handshake(ctx, listener, wire.HandshakeConfig{
			Cluster: "lab", Node: "ps-node", Incarnation: 2, Secret: secret}, false)
	}()
	peer, err := wire.Handshake(ctx, dialer, wire.HandshakeConfig{
		Cluster: "lab", Node: "worker", Incarnation: 1, Secret: secret, Expect: "ps-node"}, true)
	wg.Wait()
	if err != nil || acceptErr != nil {
		fmt.Println(err, acceptErr)
		return
	}
	fmt.Println("worker reached", peer.Node, "incarnation", peer.Incarnation)
	fmt.Println("ps-node accepted", accepted.Node, "for", accepted.Purpose)

	got := make(chan string, 1)
	server := wire.NewConn(listener, accepted, wire.ConnOptions{Handler: func(f wire.Frame) {
		m, ok := f.(*wire.MessageFrame)
		if !ok {
			return
		}
		v, err := registry.Decode(m.Message.Type, m.Message.Ser, m.Message.Body)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- fmt.Sprintf("%s got %+v from %s", m.Message.Target, *v.(*Grad), m.Message.SenderNode)
	}})
	client := wire.NewConn(dialer, peer, wire.ConnOptions{})
	server.Start()
	client.Start()

	name, ser, body, err := registry.AppendEncode(nil, &Grad{Step: 7, Norm: 0.5})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = client.Send(ctx, wire.FrameMessage, 0, 0, &wire.Message{
		Target: "ps", SenderNode: "worker", Type: name, Ser: ser, Body: body})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got)
	client.Close(nil)
	server.Close(nil)
	// Output:
	// worker reached ps-node incarnation 2
	// ps-node accepted worker for control
	// ps got {Step:7 Norm:0.5} from worker
}
