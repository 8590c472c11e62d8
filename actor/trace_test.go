package actor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Traced carries a tensor to the header actor, which answers with the
// message header it got.
type Traced struct {
	W *tensor.Tensor
}

// SeenHeader is the header actor's answer.
type SeenHeader struct {
	Header map[string]string
}

func init() {
	actor.MustRegisterMessage("test.Traced", &Traced{})
	actor.MustRegisterMessage("test.SeenHeader", &SeenHeader{})
}

func headerProps() *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		if m, ok := c.Message().(*Traced); ok {
			var h map[string]string
			if mh := c.MessageHeader(); mh != nil && mh.Length() > 0 {
				h = mh.ToMap()
			}
			if m.W != nil {
				_ = m.W.Free()
			}
			c.Respond(&SeenHeader{Header: h})
		}
	})
}

// startTracedNodes starts the nodes of cfg, each tracing with its own
// provider (nil: that node does not trace).
func startTracedNodes(t testing.TB, cfg *config.Config, tps []trace.TracerProvider, opts ...actor.Option) []*actor.Node {
	t.Helper()
	nodes := make([]*actor.Node, len(cfg.Nodes))
	for i := range nodes {
		node, err := actor.NewNode(cfg, cfg.Nodes[i].Name, append([]actor.Option{testLogger(), actor.WithTracerProvider(tps[i])}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = node
		t.Cleanup(func() { _ = node.Stop() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					t.Fatalf("%s waiting for %s: %v", a.Name(), b.Name(), err)
				}
			}
		}
	}
	return nodes
}

func newSpanRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func spanNamed(spans tracetest.SpanStubs, name string, tid trace.TraceID) *tracetest.SpanStub {
	for i := range spans {
		if spans[i].Name == name && spans[i].SpanContext.TraceID() == tid {
			return &spans[i]
		}
	}
	return nil
}

func attr(s *tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestTraceJoinsSendFetchAndDelivery: one trace holds the sender's span,
// its export, and the receiving node's receipt, fetch (over staging, with
// its bytes) and delivery; the actor gets the delivery's trace context in
// its header.
func TestTraceJoinsSendFetchAndDelivery(t *testing.T) {
	if !tracehook.Compiled {
		t.Skip("built with notrace")
	}
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	tp0, exp0 := newSpanRecorder(t)
	tp1, exp1 := newSpanRecorder(t)
	nodes := startTracedNodes(t, cfg, []trace.TracerProvider{tp0, tp1})
	if _, err := nodes[1].Root().SpawnNamed(headerProps(), "header"); err != nil {
		t.Fatal(err)
	}
	const size = 1 << 21 // out of band: above the inline threshold
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{size})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx, root := tp0.Tracer("test").Start(ctx, "test.request")
	res, err := nodes[0].Request(ctx, nodes[0].PID(nodes[1].Name(), "header"), &Traced{W: x})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	seen, ok := res.(*SeenHeader)
	if !ok {
		t.Fatalf("reply %T", res)
	}
	tid := root.SpanContext().TraceID()

	var rcv, fetch, dlv *tracetest.SpanStub
	poll.Until(t, "the receiving node's spans", func() bool {
		spans := exp1.GetSpans()
		rcv = spanNamed(spans, "tensorferry.receive", tid)
		fetch = spanNamed(spans, "tensorferry.fetch", tid)
		dlv = spanNamed(spans, "tensorferry.deliver", tid)
		return rcv != nil && fetch != nil && dlv != nil
	})
	spans0 := exp0.GetSpans()
	send := spanNamed(spans0, "tensorferry.send", tid)
	export := spanNamed(spans0, "tensorferry.export", tid)
	if send == nil || export == nil {
		t.Fatalf("sender's spans missing from trace %s: %v", tid, names(spans0))
	}
	if send.Parent.SpanID() != root.SpanContext().SpanID() {
		t.Errorf("send's parent %s, want the request's span %s", send.Parent.SpanID(), root.SpanContext().SpanID())
	}
	if export.Parent.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("export's parent %s, want the send %s", export.Parent.SpanID(), send.SpanContext.SpanID())
	}
	if !rcv.Parent.IsRemote() || rcv.Parent.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("receipt's parent %v (remote %v), want the send %s", rcv.Parent.SpanID(), rcv.Parent.IsRemote(), send.SpanContext.SpanID())
	}
	for _, s := range []*tracetest.SpanStub{fetch, dlv} {
		if s.Parent.SpanID() != rcv.SpanContext.SpanID() {
			t.Errorf("%s's parent %s, want the receipt %s", s.Name, s.Parent.SpanID(), rcv.SpanContext.SpanID())
		}
	}
	if v, _ := attr(fetch, tracehook.AttrChannel); v.AsString() != "staging" {
		t.Errorf("fetch over %q, want staging", v.AsString())
	}
	if v, _ := attr(fetch, tracehook.AttrBytes); v.AsInt64() != size {
		t.Errorf("fetch of %d bytes, want %d", v.AsInt64(), size)
	}
	if v, ok := attr(fetch, tracehook.AttrStripes); !ok || v.AsInt64() < 1 {
		t.Errorf("fetch over staging without its stripes: %v", fetch.Attributes)
	}
	if v, _ := attr(export, tracehook.AttrTensors); v.AsInt64() != 1 {
		t.Errorf("export of %d tensors, want 1", v.AsInt64())
	}
	if v, _ := attr(send, tracehook.AttrPeer); v.AsString() != nodes[1].Name() {
		t.Errorf("send to %q, want %s", v.AsString(), nodes[1].Name())
	}
	tp := seen.Header["traceparent"]
	if !strings.Contains(tp, tid.String()) || !strings.Contains(tp, dlv.SpanContext.SpanID().String()) {
		t.Errorf("actor's traceparent %q, want trace %s span %s", tp, tid, dlv.SpanContext.SpanID())
	}
}

// TestTraceOfMessageWithoutTensors: a message without tensors is traced
// too: the send, and the receipt and delivery on the other node.
func TestTraceOfMessageWithoutTensors(t *testing.T) {
	if !tracehook.Compiled {
		t.Skip("built with notrace")
	}
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	tp0, exp0 := newSpanRecorder(t)
	tp1, exp1 := newSpanRecorder(t)
	nodes := startTracedNodes(t, cfg, []trace.TracerProvider{tp0, tp1})
	if _, err := nodes[1].Root().SpawnNamed(headerProps(), "header"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := nodes[0].Request(ctx, nodes[0].PID(nodes[1].Name(), "header"), &Traced{}); err != nil {
		t.Fatal(err)
	}
	send := exp0.GetSpans()
	var tid trace.TraceID
	for _, s := range send {
		if s.Name == "tensorferry.send" {
			tid = s.SpanContext.TraceID()
		}
	}
	if !tid.IsValid() {
		t.Fatalf("no send span: %v", names(send))
	}
	poll.Until(t, "the receipt and delivery", func() bool {
		spans := exp1.GetSpans()
		return spanNamed(spans, "tensorferry.receive", tid) != nil && spanNamed(spans, "tensorferry.deliver", tid) != nil
	})
}

// TestTracedStreamUnderFewCredits: messages that wait in the outbox for
// credits (one in flight) are traced too: each send span ends once its
// message leaves, and each has its receipt, fetch and delivery on the
// other node, in order.
func TestTracedStreamUnderFewCredits(t *testing.T) {
	if !tracehook.Compiled {
		t.Skip("built with notrace")
	}
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	tp0, exp0 := newSpanRecorder(t)
	tp1, exp1 := newSpanRecorder(t)
	nodes := startTracedNodes(t, cfg, []trace.TracerProvider{tp0, tp1}, actor.WithMaxInFlight(1, 0))
	const n = 30
	got := make(chan int, n)
	if _, err := nodes[1].Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_ = g.W.Free()
			got <- g.Step
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	pid := nodes[0].PID(nodes[1].Name(), "sink")
	for i := range n {
		nodes[0].Root().Send(pid, &Grad{Step: i, W: x})
	}
	for i := range n {
		select {
		case s := <-got:
			if s != i {
				t.Fatalf("message %d arrived as %d", s, i)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d messages arrived", i, n)
		}
	}
	count := func(spans tracetest.SpanStubs, name string) map[trace.TraceID]tracetest.SpanStub {
		m := map[trace.TraceID]tracetest.SpanStub{}
		for _, s := range spans {
			if s.Name == name {
				m[s.SpanContext.TraceID()] = s
			}
		}
		return m
	}
	// A delivery ends its deliver span before its receive span: wait for
	// every one of each.
	poll.Until(t, "every message's spans", func() bool {
		s1 := exp1.GetSpans()
		return len(count(exp0.GetSpans(), "tensorferry.send")) == n && len(count(s1, "tensorferry.deliver")) == n &&
			len(count(s1, "tensorferry.receive")) == n && len(count(s1, "tensorferry.fetch")) == n
	})
	sends := count(exp0.GetSpans(), "tensorferry.send")
	spans1 := exp1.GetSpans()
	rcvs, fetches := count(spans1, "tensorferry.receive"), count(spans1, "tensorferry.fetch")
	for tid, s := range sends {
		r, ok := rcvs[tid]
		if !ok || r.Parent.SpanID() != s.SpanContext.SpanID() {
			t.Fatalf("trace %s: send without its receipt", tid)
		}
		if f, ok := fetches[tid]; !ok || f.Parent.SpanID() != r.SpanContext.SpanID() {
			t.Fatalf("trace %s: receipt without its fetch", tid)
		}
	}
}

// TestNoTracerProviderAddsNoHeader: without a provider nothing is added
// to the messages.
func TestNoTracerProviderAddsNoHeader(t *testing.T) {
	cfg, err := config.LocalConfig("test", 2)
	if err != nil {
		t.Fatal(err)
	}
	nodes := startTracedNodes(t, cfg, []trace.TracerProvider{nil, nil})
	if _, err := nodes[1].Root().SpawnNamed(headerProps(), "header"); err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := nodes[0].Request(ctx, nodes[0].PID(nodes[1].Name(), "header"), &Traced{W: x})
	if err != nil {
		t.Fatal(err)
	}
	if h := res.(*SeenHeader).Header; len(h) != 0 {
		t.Fatalf("header %v, want none", h)
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// discard is an exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkRequestTraced is BenchmarkRequestInline with both nodes
// without a tracer provider ("off") and with an SDK provider sampling
// every message, whose batch processor drops the spans ("on"): what a
// traced round trip costs (six spans: the request's send, receipt and
// delivery, and the reply's).
func BenchmarkRequestTraced(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		var tps []trace.TracerProvider
		if on {
			name = "on"
			for range 2 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				tps = append(tps, tp)
			}
		} else {
			tps = []trace.TracerProvider{nil, nil}
		}
		b.Run(name, func(b *testing.B) {
			cfg, err := config.LocalConfig("test", 2)
			if err != nil {
				b.Fatal(err)
			}
			nodes := startTracedNodes(b, cfg, tps)
			a, c := nodes[0], nodes[1]
			if _, err := c.Root().SpawnNamed(echoProps(c.Name()).Configure(c.WithInlineDelivery()), "echo"); err != nil {
				b.Fatal(err)
			}
			pid := a.PID(c.Name(), "echo")
			msg := &Ping{Text: strings.Repeat("x", 64)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := a.Request(ctx, pid, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
