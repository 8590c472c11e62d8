//go:build !notrace

package tracehook

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Compiled reports whether the hooks are compiled in (false with the
// build tag notrace).
const Compiled = true

// Kind is a span's kind.
type Kind = trace.SpanKind

// Kinds of spans.
const (
	KindInternal = trace.SpanKindInternal
	KindProducer = trace.SpanKindProducer
	KindConsumer = trace.SpanKindConsumer
	KindClient   = trace.SpanKindClient
)

// Attribute keys tensorferry's spans carry.
const (
	AttrNode     = "tensorferry.node"       // the node that made the span
	AttrPeer     = "tensorferry.peer"       // the other node
	AttrTarget   = "tensorferry.target"     // the target actor's id
	AttrType     = "tensorferry.message"    // the message's registered type
	AttrChannel  = "tensorferry.channel"    // the data channel of a fetch
	AttrBytes    = "tensorferry.bytes"      // bytes fetched or exported
	AttrTensors  = "tensorferry.tensors"    // tensors exported (lent)
	AttrInline   = "tensorferry.inline"     // tensors copied into the message
	AttrSrc      = "tensorferry.src_device" // the owner's device
	AttrDst      = "tensorferry.dst_device" // the destination's device
	AttrCache    = "tensorferry.cache"      // "hit" or "miss": the channel's registration (or mapping) cache
	AttrStripes  = "tensorferry.stripes"    // staging: data connections a fetch was split over
	AttrError    = "tensorferry.error"      // why a message was not delivered
	traceparent  = "traceparent"
	tracestateKy = "tracestate"
)

// propagator writes and reads the W3C trace context.
var propagator = propagation.TraceContext{}

// enabled is set once any Tracer is on: the channels' annotations
// (CacheHit, Stripes) look no further while it is not.
var enabled atomic.Bool

// Attr is an attribute of a span.
type Attr = attribute.KeyValue

// String returns a string attribute.
func String(k, v string) Attr { return attribute.String(k, v) }

// Int returns an integer attribute.
func Int(k string, v int64) Attr { return attribute.Int64(k, v) }

// kindOpts are the span kinds as start options, boxed once.
var kindOpts = [...]trace.SpanStartOption{
	KindInternal: trace.WithSpanKind(KindInternal),
	KindProducer: trace.WithSpanKind(KindProducer),
	KindConsumer: trace.WithSpanKind(KindConsumer),
	KindClient:   trace.WithSpanKind(KindClient),
}

// Tracer starts the spans of one package of one node; the zero Tracer is
// off. It is one pointer: checking it costs a load and a compare.
type Tracer struct{ p *tracer }

type tracer struct {
	t    trace.Tracer
	node attribute.KeyValue
}

// New returns the tracer named scope of the node named node from tp; off
// (the zero Tracer) when tp is nil.
func New(tp trace.TracerProvider, scope, node string) Tracer {
	if tp == nil {
		return Tracer{}
	}
	enabled.Store(true)
	return Tracer{&tracer{t: tp.Tracer(scope), node: attribute.String(AttrNode, node)}}
}

// On reports whether t makes spans.
func (t Tracer) On() bool { return t.p != nil }

// Span is a span being recorded, with the context that holds it; the zero
// Span (what an off Tracer returns) ignores every call.
type Span struct {
	s   trace.Span
	ctx context.Context
}

// Start starts a span named name with attributes attrs as a child of the
// span in ctx (a root without one). It returns ctx with the span, and the
// span; ctx and the zero Span when t is off. (Attributes are given at the
// start, in one slice: each later SetString costs the span a lock and an
// append. Callers build attrs only when t.On(): a slice passed here
// escapes.)
func (t Tracer) Start(ctx context.Context, name string, kind Kind, attrs ...Attr) (context.Context, Span) {
	if t.p == nil {
		return ctx, Span{}
	}
	return t.start(ctx, name, kind, attrs)
}

//go:noinline
func (t Tracer) start(ctx context.Context, name string, kind Kind, attrs []Attr) (context.Context, Span) {
	if ctx == nil {
		ctx = context.Background()
	}
	kvs := make([]attribute.KeyValue, 0, len(attrs)+1)
	kvs = append(append(kvs, t.p.node), attrs...)
	ctx, s := t.p.t.Start(ctx, name, kindOpts[kind], trace.WithAttributes(kvs...))
	return ctx, Span{s: s, ctx: ctx}
}

// StartAt is Start for a span that began at start, in the past: the work
// it records ran before the caller knew it would make a span of it. It
// returns the span alone (what ran did not see it in its context).
func (t Tracer) StartAt(ctx context.Context, start time.Time, name string, kind Kind, attrs ...Attr) Span {
	if t.p == nil {
		return Span{}
	}
	return t.startAt(ctx, start, name, kind, attrs)
}

//go:noinline
func (t Tracer) startAt(ctx context.Context, start time.Time, name string, kind Kind, attrs []Attr) Span {
	if ctx == nil {
		ctx = context.Background()
	}
	kvs := make([]attribute.KeyValue, 0, len(attrs)+1)
	kvs = append(append(kvs, t.p.node), attrs...)
	ctx, s := t.p.t.Start(ctx, name, kindOpts[kind], trace.WithAttributes(kvs...), trace.WithTimestamp(start))
	return Span{s: s, ctx: ctx}
}

// Getter reads a message header (protoactor's ReadonlyMessageHeader is
// one).
type Getter interface{ Get(key string) string }

// StartFrom starts a span named name whose parent is the span in ctx, or,
// when ctx holds none, the trace context in header h (a W3C traceparent,
// as Inject writes it); a root span without either.
func (t Tracer) StartFrom(ctx context.Context, h Getter, name string, kind Kind, attrs ...Attr) Span {
	if t.p == nil {
		return Span{}
	}
	return t.startFrom(ctx, h, name, kind, attrs)
}

//go:noinline
func (t Tracer) startFrom(ctx context.Context, h Getter, name string, kind Kind, attrs []Attr) Span {
	if ctx == nil {
		ctx = context.Background()
	}
	if !trace.SpanContextFromContext(ctx).IsValid() && h != nil && h.Get(traceparent) != "" {
		ctx = propagator.Extract(ctx, getter{h})
	}
	_, s := t.start(ctx, name, kind, attrs)
	return s
}

// StartFromMap is StartFrom for a header map (nil: no header).
func (t Tracer) StartFromMap(ctx context.Context, h map[string]string, name string, kind Kind, attrs ...Attr) Span {
	if t.p == nil {
		return Span{}
	}
	return t.startFromMap(ctx, h, name, kind, attrs)
}

//go:noinline
func (t Tracer) startFromMap(ctx context.Context, h map[string]string, name string, kind Kind, attrs []Attr) Span {
	if h == nil {
		return t.startFrom(ctx, nil, name, kind, attrs)
	}
	return t.startFrom(ctx, mapGetter(h), name, kind, attrs)
}

// getter adapts a Getter to propagation.TextMapCarrier (read only).
type getter struct{ h Getter }

func (g getter) Get(k string) string { return g.h.Get(k) }
func (getter) Set(string, string)    {}
func (getter) Keys() []string        { return nil }

type mapGetter map[string]string

func (m mapGetter) Get(k string) string { return m[k] }

// On reports whether s is recorded.
func (s Span) On() bool { return s.s != nil }

// Context returns the context holding s; context.Background() for the
// zero Span.
func (s Span) Context() context.Context {
	if s.ctx == nil {
		return context.Background()
	}
	return s.ctx
}

// Child starts a span named name under s: the zero Span when s is zero.
func (s Span) Child(t Tracer, name string, kind Kind) Span {
	if s.s == nil || t.p == nil {
		return Span{}
	}
	_, c := t.start(s.ctx, name, kind, nil)
	return c
}

// Inject writes s's trace context into header h (made when nil) and
// returns it; h itself for the zero Span.
func (s Span) Inject(h map[string]string) map[string]string {
	if s.s == nil {
		return h
	}
	return s.inject(h)
}

//go:noinline
func (s Span) inject(h map[string]string) map[string]string {
	if h == nil {
		h = make(map[string]string, 2)
	}
	propagator.Inject(s.ctx, propagation.MapCarrier(h))
	return h
}

// SetString sets a string attribute.
func (s Span) SetString(k, v string) {
	if s.s != nil {
		s.set(attribute.String(k, v))
	}
}

// SetInt sets an integer attribute.
func (s Span) SetInt(k string, v int64) {
	if s.s != nil {
		s.set(attribute.Int64(k, v))
	}
}

//go:noinline
func (s Span) set(kv attribute.KeyValue) { s.s.SetAttributes(kv) }

// End ends s, recording err (nil: success).
func (s Span) End(err error) {
	if s.s != nil {
		s.end(err)
	}
}

//go:noinline
func (s Span) end(err error) {
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// Fail ends s as failed for the reason why.
func (s Span) Fail(why string) {
	if s.s != nil {
		s.fail(why)
	}
}

//go:noinline
func (s Span) fail(why string) {
	s.s.SetAttributes(attribute.String(AttrError, why))
	s.s.SetStatus(codes.Error, why)
	s.s.End()
}

// Parent is the span context a later span continues (the zero Parent
// continues none).
type Parent struct{ sc trace.SpanContext }

// ParentOf returns the span context of the span in ctx, when t is on.
func (t Tracer) ParentOf(ctx context.Context) Parent {
	if t.p == nil || ctx == nil {
		return Parent{}
	}
	return Parent{trace.SpanContextFromContext(ctx)}
}

// With returns ctx carrying p as the parent of the spans started in it;
// ctx itself for the zero Parent.
func (p Parent) With(ctx context.Context) context.Context {
	if !p.sc.IsValid() {
		return ctx
	}
	return p.with(ctx)
}

//go:noinline
func (p Parent) with(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(ctx, p.sc)
}

// CacheHit records on the span in ctx, if any, whether the channel found
// what it needed (a registration, an opened mapping) in its cache.
func CacheHit(ctx context.Context, hit bool) {
	if !enabled.Load() {
		return
	}
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return
	}
	v := "miss"
	if hit {
		v = "hit"
	}
	s.SetAttributes(attribute.String(AttrCache, v))
}

// Stripes records on the span in ctx, if any, over how many data
// connections a fetch was split.
func Stripes(ctx context.Context, n int) {
	if !enabled.Load() {
		return
	}
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		s.SetAttributes(attribute.Int(AttrStripes, n))
	}
}
