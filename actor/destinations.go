package actor

import (
	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/transfer"
)

// WithDestinations is a props option for actors spawned on n: the tensor
// fields of the messages they receive from other nodes are fetched into
// the tensors f gives, instead of tensors the node allocates, so that an
// actor that receives same-shaped tensors again and again (a worker
// pulling its weights every step) allocates nothing for them. f gets the
// decoded message (its other fields set) and the tensor's descriptor
// (dtype, shape, bytes), and returns nil to have the node allocate the
// destination as usual (on the actor's device, WithDevice).
//
// The actor keeps owning the tensors f gives: the message's field is a
// view of the one given (same memory; its Free does nothing). From f's
// call until the message reaches the actor (or a DeliveryFailed does) the
// node writes the tensor, so the actor must give a tensor only for a
// message it expects and not use it meanwhile: typically the answer to its
// own request, with one destination per outstanding request, reused once
// the answer is handled. f runs on the node's goroutines, not the actor's:
// it must not block, and must read only what is safe to read there.
// A tensor of the wrong dtype or shape fails the message (an error wrapping
// tensor.ErrDestination, reported to the sender). Messages between actors
// of one node are passed by pointer and never use f.
//
//	props := pa.PropsFromProducer(newWorker, node.WithDestinations(func(msg any, d *tensor.Descriptor) *tensor.Tensor {
//		if m, ok := msg.(*Weights); ok {
//			return buffers[m.Shard] // preallocated, one per shard
//		}
//		return nil
//	}))
func (n *Node) WithDestinations(f func(msg any, d *tensor.Descriptor) *tensor.Tensor) pa.PropsOption {
	return func(p *pa.Props) {
		pa.WithOnInit(func(ctx pa.Context) { n.dests.Store(ctx.Self().Id, transfer.Destinations(f)) })(p)
		pa.WithReceiverMiddleware(func(next pa.ReceiverFunc) pa.ReceiverFunc {
			return func(ctx pa.ReceiverContext, env *pa.MessageEnvelope) {
				next(ctx, env)
				if _, ok := env.Message.(*pa.Stopped); ok {
					n.dests.Delete(ctx.Self().Id)
				}
			}
		})(p)
	}
}

// destinationsOf returns the destinations of actor id's tensors, nil when
// it gave none.
func (n *Node) destinationsOf(id string) transfer.Destinations {
	if f, ok := n.dests.Load(id); ok {
		return f.(transfer.Destinations)
	}
	return nil
}
