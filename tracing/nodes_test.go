package tracing_test

import (
	"context"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/tracing"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
)

// Grad carries a tensor; the sink actor answers with Done once it has it,
// after starting a span of its own from the message's header.
type Grad struct{ W *tensor.Tensor }

// Done is the sink's answer.
type Done struct{}

func init() {
	actor.MustRegisterMessage("tracing_test.Grad", &Grad{})
	actor.MustRegisterMessage("tracing_test.Done", &Done{})
}

// TestTwoNodesExportOneTrace: two nodes configured by FromEnv (the
// OTEL_* variables of one collector) send the spans of one message - the
// send and export, the receipt, fetch and delivery, and a span the actor
// starts from its header - to the collector, all in one trace.
func TestTwoNodesExportOneTrace(t *testing.T) {
	if !tracehook.Compiled {
		t.Skip("built with notrace")
	}
	r := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.URL+"/v1/traces")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	cfg, err := config.LocalConfig("tracing", 2)
	if err != nil {
		t.Fatal(err)
	}
	var shutdowns []func(context.Context) error
	nodes := make([]*actor.Node, 2)
	tps := make([]trace.TracerProvider, 2)
	for i := range nodes {
		tp, shutdown, err := tracing.FromEnv(context.Background())
		if err != nil || tp == nil {
			t.Fatalf("FromEnv: %v %v", tp, err)
		}
		tps[i] = tp
		shutdowns = append(shutdowns, shutdown)
		n, err := actor.NewNode(cfg, cfg.Nodes[i].Name, actor.WithLogger(zap.NewNop()), actor.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	defer func() {
		for _, n := range nodes {
			_ = n.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nodes[0].WaitPeer(ctx, nodes[1].Name()); err != nil {
		t.Fatal(err)
	}
	sinkTracer := tps[1].Tracer("sink")
	_, err = nodes[1].Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_, s := sinkTracer.Start(tracing.ContextFromHeader(context.Background(), c.MessageHeader()), "sink.apply")
			_ = g.W.Free()
			s.End()
			c.Respond(&Done{})
		}
	}), "sink")
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{1 << 18})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	if _, err := nodes[0].Request(ctx, nodes[0].PID(nodes[1].Name(), "sink"), &Grad{W: x}); err != nil {
		t.Fatal(err)
	}
	// Stopping the nodes first ends their last spans; shutting the
	// providers down flushes them.
	for _, n := range nodes {
		_ = n.Stop()
	}
	for _, s := range shutdowns {
		if err := s(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	spans, _, _ := r.snapshot()
	var send *tracepb.Span
	for _, s := range spans {
		if s.Name == "tensorferry.send" && len(s.ParentSpanId) == 0 {
			for _, a := range s.Attributes {
				if a.Key == "tensorferry.target" && a.Value.GetStringValue() == "sink" {
					send = s
				}
			}
		}
	}
	if send == nil {
		t.Fatalf("no send to the sink among %d spans", len(spans))
	}
	byID := map[string]*tracepb.Span{}
	got := map[string]bool{}
	for _, s := range spans {
		if string(s.TraceId) == string(send.TraceId) {
			byID[string(s.SpanId)] = s
			got[s.Name] = true
		}
	}
	for _, name := range []string{"tensorferry.send", "tensorferry.export", "tensorferry.receive", "tensorferry.fetch", "tensorferry.deliver", "sink.apply"} {
		if !got[name] {
			t.Errorf("trace lacks %s: %v", name, got)
		}
	}
	// sink.apply -> deliver -> receive -> send.
	for _, s := range byID {
		if s.Name != "sink.apply" {
			continue
		}
		chain := []string{s.Name}
		for p := byID[string(s.ParentSpanId)]; p != nil; p = byID[string(p.ParentSpanId)] {
			chain = append(chain, p.Name)
		}
		want := []string{"sink.apply", "tensorferry.deliver", "tensorferry.receive", "tensorferry.send"}
		if len(chain) != len(want) {
			t.Fatalf("parents of the actor's span: %v, want %v", chain, want)
		}
		for i := range want {
			if chain[i] != want[i] {
				t.Fatalf("parents of the actor's span: %v, want %v", chain, want)
			}
		}
	}
}
