//go:build notrace

package tracehook

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Compiled reports whether the hooks are compiled in (false with the
// build tag notrace).
const Compiled = false

// Kind is a span's kind.
type Kind int

// Kinds of spans.
const (
	KindInternal Kind = iota
	KindProducer
	KindConsumer
	KindClient
)

// Attribute keys tensorferry's spans carry.
const (
	AttrNode    = "tensorferry.node"
	AttrPeer    = "tensorferry.peer"
	AttrTarget  = "tensorferry.target"
	AttrType    = "tensorferry.message"
	AttrChannel = "tensorferry.channel"
	AttrBytes   = "tensorferry.bytes"
	AttrTensors = "tensorferry.tensors"
	AttrInline  = "tensorferry.inline"
	AttrSrc     = "tensorferry.src_device"
	AttrDst     = "tensorferry.dst_device"
	AttrCache   = "tensorferry.cache"
	AttrStripes = "tensorferry.stripes"
	AttrError   = "tensorferry.error"
)

// Attr is an attribute of a span (nothing in a notrace build).
type Attr struct{}

// String returns the empty Attr.
func String(string, string) Attr { return Attr{} }

// Int returns the empty Attr.
func Int(string, int64) Attr { return Attr{} }

// Tracer is always off in a notrace build.
type Tracer struct{}

// New returns the (off) Tracer.
func New(trace.TracerProvider, string, string) Tracer { return Tracer{} }

// On reports false.
func (Tracer) On() bool { return false }

// Span is always the zero Span.
type Span struct{}

// Start returns ctx.
func (Tracer) Start(ctx context.Context, _ string, _ Kind, _ ...Attr) (context.Context, Span) {
	return ctx, Span{}
}

// StartAt returns the zero Span.
func (Tracer) StartAt(context.Context, time.Time, string, Kind, ...Attr) Span { return Span{} }

// Getter reads a message header.
type Getter interface{ Get(key string) string }

// StartFrom returns the zero Span.
func (Tracer) StartFrom(context.Context, Getter, string, Kind, ...Attr) Span { return Span{} }

// StartFromMap returns the zero Span.
func (Tracer) StartFromMap(context.Context, map[string]string, string, Kind, ...Attr) Span {
	return Span{}
}

// On reports false.
func (Span) On() bool { return false }

// Context returns context.Background().
func (Span) Context() context.Context { return context.Background() }

// Child returns the zero Span.
func (Span) Child(Tracer, string, Kind) Span { return Span{} }

// Inject returns h.
func (Span) Inject(h map[string]string) map[string]string { return h }

// SetString does nothing.
func (Span) SetString(string, string) {}

// SetInt does nothing.
func (Span) SetInt(string, int64) {}

// End does nothing.
func (Span) End(error) {}

// Fail does nothing.
func (Span) Fail(string) {}

// Parent continues nothing.
type Parent struct{}

// ParentOf returns the zero Parent.
func (Tracer) ParentOf(context.Context) Parent { return Parent{} }

// With returns ctx.
func (Parent) With(ctx context.Context) context.Context { return ctx }

// CacheHit does nothing.
func CacheHit(context.Context, bool) {}

// Stripes does nothing.
func Stripes(context.Context, int) {}
