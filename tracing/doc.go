// Package tracing exports tensorferry's OpenTelemetry traces: FromEnv
// builds a tracer provider from the standard OTEL_* environment variables,
// exporting over OTLP/HTTP in protobuf (Exporter, without gRPC), and
// ContextFromHeader lets an actor continue the trace of the message it
// received.
//
// A node traces when given a provider (actor.WithTracerProvider); one
// trace then shows a message from its send to its delivery on the other
// node: tensorferry.send and tensorferry.export on the sender,
// tensorferry.receive, tensorferry.fetch (channel, bytes, cache hit or
// miss, stripes) and tensorferry.deliver on the receiver. The trace
// context travels in the message header as a W3C traceparent. Without a
// provider nothing is traced and nothing is allocated for it.
//
//	tp, shutdown, err := tracing.FromEnv(ctx) // nil tp: the variables ask for no tracing
//	if err != nil { ... }
//	defer shutdown(context.Background())      // flushes the last spans
//	node, err := actor.NewNode(cfg, name, actor.WithTracerProvider(tp))
//
// With OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 set, ferry node,
// ferry bench and the samples send their spans there.
package tracing
