package actor

import (
	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// PingActor is the id of the actor every node runs to answer Ping requests
// (used by `ferry ping` and by health checks); it has inline delivery.
const PingActor = "tensorferry.ping"

// Ping asks a node's PingActor for a Pong carrying the same payload.
type Ping struct {
	Seq     uint64
	Payload []byte
}

// Pong answers a Ping (with its payload) or a TensorPing (with the number
// of bytes received).
type Pong struct {
	Seq     uint64
	Payload []byte
	Node    string
	Bytes   int64
}

// TensorPing carries a tensor to a node's PingActor, which answers with a
// Pong once the tensor was delivered (`ferry bench`).
type TensorPing struct {
	Seq uint64
	T   *tensor.Tensor
}

func init() {
	registry.MustRegister("tensorferry.Ping", &Ping{})
	registry.MustRegister("tensorferry.Pong", &Pong{})
	registry.MustRegister("tensorferry.TensorPing", &TensorPing{})
}

func pingReceive(c pa.Context) {
	switch p := c.Message().(type) {
	case *Ping:
		c.Respond(&Pong{Seq: p.Seq, Payload: p.Payload, Node: c.Self().Address})
	case *TensorPing:
		var n int64
		if p.T != nil {
			n = p.T.ByteSize()
			_ = p.T.Free()
		}
		c.Respond(&Pong{Seq: p.Seq, Node: c.Self().Address, Bytes: n})
	}
}
