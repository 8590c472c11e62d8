// Package tracehook is where tensorferry's packages start and end their
// OpenTelemetry spans: a send and its export on the sending node, the
// receipt, each fetch over a data channel and the delivery on the
// receiving node. The trace context crosses nodes as a W3C traceparent in
// the message header (wire.Message.Header).
//
// A Tracer made from a nil provider is off: every hook then returns at
// once, allocating nothing (no span, no header map). Built with the tag
// notrace, the hooks are empty functions the compiler removes, which is
// what the remote benchmark compares "off" against.
//
//	tr := tracehook.New(tp, "github.com/tensorferry/tensorferry/actor", node)
//	ctx, sp := tr.Start(ctx, "tensorferry.export", tracehook.KindInternal)
//	sp.SetInt("tensorferry.bytes", n)
//	sp.End(err)
package tracehook
