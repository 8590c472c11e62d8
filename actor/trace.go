package actor

import (
	"context"
	"reflect"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"go.opentelemetry.io/otel/trace"
)

// WithTracerProvider makes the node trace its messages with tp
// (OpenTelemetry): a send to another node is a span "tensorferry.send"
// whose context travels in the message header (W3C traceparent); the
// export of its tensors a child span "tensorferry.export"; on the
// receiving node (if it traces too) the receipt a span
// "tensorferry.receive" continuing the sender's trace, with a child
// "tensorferry.fetch" per tensor fetched (channel, bytes, cache hit or
// miss, stripes) and "tensorferry.deliver" when the message is handed to
// the actor, whose header then holds the delivery's trace context (see
// tracing.ContextFromHeader). A send continues the trace of Request's
// context, or of a traceparent in the header of the envelope sent.
//
// Default nil: no spans, and nothing is allocated or added to headers
// for tracing. Pass otel.GetTracerProvider() to use the global provider,
// or tracing.FromEnv's to export as the OTEL_* variables say.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.engine.TracerProvider = tp }
}

// startSend starts the span of a send to target (the zero Span when the
// node does not trace).
func (n *Node) startSend(ctx context.Context, header pa.ReadonlyMessageHeader, target *pa.PID, msg any) tracehook.Span {
	if !n.tr.On() {
		return tracehook.Span{}
	}
	return n.startSendSpan(ctx, header, target, msg)
}

func (n *Node) startSendSpan(ctx context.Context, header pa.ReadonlyMessageHeader, target *pa.PID, msg any) tracehook.Span {
	var h tracehook.Getter
	if header != nil {
		h = header
	}
	typ := ""
	if msg != nil {
		typ = reflect.TypeOf(msg).String()
	}
	return n.tr.StartFrom(ctx, h, "tensorferry.send", tracehook.KindProducer,
		tracehook.String(tracehook.AttrPeer, target.Address),
		tracehook.String(tracehook.AttrTarget, target.Id),
		tracehook.String(tracehook.AttrType, typ))
}

// startReceive starts the span of the receipt of a message from peer,
// continuing the trace in its header (the zero Span when the node does
// not trace).
func (n *Node) startReceive(peer string, header map[string]string, target, typ string) tracehook.Span {
	if !n.tr.On() {
		return tracehook.Span{}
	}
	return n.startReceiveSpan(peer, header, target, typ)
}

func (n *Node) startReceiveSpan(peer string, header map[string]string, target, typ string) tracehook.Span {
	return n.tr.StartFromMap(context.Background(), header, "tensorferry.receive", tracehook.KindConsumer,
		tracehook.String(tracehook.AttrPeer, peer),
		tracehook.String(tracehook.AttrTarget, target),
		tracehook.String(tracehook.AttrType, typ))
}

// delivery is the span of a message's hand-over to its actor, under the
// span of its receipt.
type delivery struct{ rcv, dlv tracehook.Span }

// startDelivery starts the delivery span under rcv and writes its trace
// context into *header, which the actor gets (the zero delivery, header
// untouched, when rcv is zero).
func (n *Node) startDelivery(rcv tracehook.Span, header *map[string]string) delivery {
	if !rcv.On() {
		return delivery{}
	}
	return n.startDeliverySpan(rcv, header)
}

func (n *Node) startDeliverySpan(rcv tracehook.Span, header *map[string]string) delivery {
	d := delivery{rcv: rcv, dlv: rcv.Child(n.tr, "tensorferry.deliver", tracehook.KindInternal)}
	*header = d.dlv.Inject(*header)
	return d
}

// end ends the delivery and the receipt.
func (d delivery) end() {
	d.dlv.End(nil)
	d.rcv.End(nil)
}
