package actor

import (
	"context"
	"fmt"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// pingActor is the id of the actor every node runs to answer Ping and
// PingTensor; it has inline delivery and refuses remote Stop and Poison.
const pingActor = "tensorferry.ping"

// ping asks a node's ping actor for a pong carrying the same payload.
type ping struct {
	Seq     uint64
	Payload []byte
}

// pong answers a ping (with its payload) or a tensorPing (with the number
// of bytes received).
type pong struct {
	Seq     uint64
	Payload []byte
	Node    string
	Bytes   int64
}

// tensorPing carries a tensor to a node's ping actor, which answers with a
// pong once the tensor was delivered.
type tensorPing struct {
	Seq uint64
	T   *tensor.Tensor
}

func init() {
	MustRegisterMessage("tensorferry.Ping", &ping{})
	MustRegisterMessage("tensorferry.Pong", &pong{})
	MustRegisterMessage("tensorferry.TensorPing", &tensorPing{})
}

func pingReceive(c pa.Context) {
	switch p := c.Message().(type) {
	case *ping:
		c.Respond(&pong{Seq: p.Seq, Payload: p.Payload, Node: c.Self().Address})
	case *tensorPing:
		var n int64
		if p.T != nil {
			n = p.T.ByteSize()
			_ = p.T.Free()
		}
		c.Respond(&pong{Seq: p.Seq, Node: c.Self().Address, Bytes: n})
	}
}

// Ping sends payload to the named node's built-in ping actor and waits for
// it to come back: a health check and a round-trip probe (`ferry ping`).
func (n *Node) Ping(ctx context.Context, node string, payload []byte) error {
	seq := n.pingSeq.Add(1)
	res, err := n.Request(ctx, n.PID(node, pingActor), &ping{Seq: seq, Payload: payload})
	if err != nil {
		return err
	}
	if p, ok := res.(*pong); !ok || p.Seq != seq || len(p.Payload) != len(payload) {
		return fmt.Errorf("actor: ping of %s: unexpected reply %T", node, res)
	}
	return nil
}

// PingTensor sends t (lent, as any tensor in a message) to the named node's
// built-in ping actor and waits until the node has fetched and delivered
// it (`ferry bench`); it returns the bytes the node received.
func (n *Node) PingTensor(ctx context.Context, node string, t *tensor.Tensor) (int64, error) {
	seq := n.pingSeq.Add(1)
	res, err := n.Request(ctx, n.PID(node, pingActor), &tensorPing{Seq: seq, T: t})
	if err != nil {
		return 0, err
	}
	p, ok := res.(*pong)
	if !ok || p.Seq != seq {
		return 0, fmt.Errorf("actor: tensor ping of %s: unexpected reply %T", node, res)
	}
	return p.Bytes, nil
}
