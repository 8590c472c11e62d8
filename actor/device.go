package actor

import (
	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/memory"
)

// WithDevice is a props option for actors spawned on n: tensors sent to
// them are materialized on dev (default: the node's first device in the
// config). Like WithInlineDelivery, it is a method of the node the actor
// runs on.
//
//	props := pa.PropsFromProducer(newWorker, node.WithDevice(memory.CUDA(1)))
func (n *Node) WithDevice(dev memory.Device) pa.PropsOption {
	return func(p *pa.Props) {
		pa.WithOnInit(func(ctx pa.Context) { n.setDevice(ctx.Self().Id, dev) })(p)
		pa.WithReceiverMiddleware(func(next pa.ReceiverFunc) pa.ReceiverFunc {
			return func(ctx pa.ReceiverContext, env *pa.MessageEnvelope) {
				next(ctx, env)
				if _, ok := env.Message.(*pa.Stopped); ok {
					n.clearDevice(ctx.Self().Id)
				}
			}
		})(p)
	}
}

func (n *Node) setDevice(id string, dev memory.Device) {
	n.mu.Lock()
	n.devices[id] = dev
	n.mu.Unlock()
}

func (n *Node) clearDevice(id string) {
	n.mu.Lock()
	delete(n.devices, id)
	n.mu.Unlock()
}

// deviceOf returns the device tensors for actor id are materialized on.
func (n *Node) deviceOf(id string) memory.Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := n.devices[id]; ok {
		return d
	}
	return n.eng.Device()
}
