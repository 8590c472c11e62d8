//go:build !notrace

package tracehook

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type header map[string]string

func (h header) Get(k string) string { return h[k] }

// TestOffAllocatesNothing: every hook of an off Tracer returns at once
// without allocating (no span, no header map).
func TestOffAllocatesNothing(t *testing.T) {
	var tr Tracer
	ctx := context.Background()
	h := header{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	err := errors.New("x")
	allocs := testing.AllocsPerRun(100, func() {
		sp := tr.StartFrom(ctx, h, "send", KindProducer)
		_, ex := tr.Start(sp.Context(), "export", KindInternal)
		ex.SetInt(AttrBytes, 1)
		ex.SetString(AttrPeer, "b")
		ex.End(nil)
		if m := sp.Inject(nil); m != nil {
			t.Fatal("header made")
		}
		rs := tr.StartFromMap(ctx, h, "receive", KindConsumer)
		p := tr.ParentOf(rs.Context())
		_ = p.With(ctx)
		CacheHit(ctx, true)
		Stripes(ctx, 2)
		rs.Child(tr, "deliver", KindInternal).End(nil)
		rs.Fail("no")
		sp.End(err)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per message with tracing off", allocs)
	}
}

// TestOnJoinsTheHeadersTrace: a span started from a header continues its
// trace, and Inject writes the span's own context for the next node.
func TestOnJoinsTheHeadersTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := New(tp, "test", "a")
	h := header{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	sp := tr.StartFrom(context.Background(), h, "send", KindProducer)
	out := sp.Inject(nil)
	sp.End(nil)
	s := exp.GetSpans()[0]
	if s.SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || s.Parent.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("span %v parent %v", s.SpanContext, s.Parent)
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + s.SpanContext.SpanID().String() + "-01"
	if out["traceparent"] != want {
		t.Fatalf("injected %q, want %q", out["traceparent"], want)
	}
}
