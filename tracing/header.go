package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// Header reads a message header: protoactor's ReadonlyMessageHeader (an
// actor's c.MessageHeader()) is one.
type Header interface {
	Get(key string) string
}

// ContextFromHeader returns ctx carrying the trace context of a message
// header (the W3C traceparent a tracing node writes there), so that the
// spans an actor starts in it join the message's trace; ctx itself when h
// is nil or holds none.
//
//	ctx := tracing.ContextFromHeader(context.Background(), c.MessageHeader())
//	ctx, span := tracer.Start(ctx, "apply gradient")
func ContextFromHeader(ctx context.Context, h Header) context.Context {
	if h == nil || h.Get("traceparent") == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, headerCarrier{h})
}

// headerCarrier reads a Header as a propagation.TextMapCarrier.
type headerCarrier struct{ h Header }

func (c headerCarrier) Get(k string) string { return c.h.Get(k) }
func (headerCarrier) Set(string, string)    {}
func (headerCarrier) Keys() []string        { return nil }
