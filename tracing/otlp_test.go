package tracing_test

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP traces endpoint: it decodes each request
// (an ExportTraceServiceRequest, whose encoding TracesData shares) and
// keeps its spans.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request
	spans    []*tracepb.Span
	res      [][]*commonpb.KeyValue
	arrived  chan struct{}
	// status answers the next requests while not empty (then 200).
	status []int
	answer []byte
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{arrived: make(chan struct{}, 64)}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces application/x-protobuf", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	if len(r.status) > 0 {
		st := r.status[0]
		r.status = r.status[1:]
		r.mu.Unlock()
		w.WriteHeader(st)
		return
	}
	var td tracepb.TracesData
	if err := proto.Unmarshal(b, &td); err != nil {
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.requests = append(r.requests, req)
	for _, rs := range td.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
			for range ss.Spans {
				r.res = append(r.res, rs.GetResource().GetAttributes())
			}
		}
	}
	answer := r.answer
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(answer)
	r.arrived <- struct{}{}
}

func (r *receiver) snapshot() ([]*tracepb.Span, [][]*commonpb.KeyValue, []*http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([][]*commonpb.KeyValue(nil), r.res...), append([]*http.Request(nil), r.requests...)
}

func kv(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, x := range kvs {
		if x.Key == key {
			return x.Value
		}
	}
	return nil
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestFromEnvSpansArriveAtTheCollector: with OTEL_EXPORTER_OTLP_ENDPOINT
// and headers set, the spans of a provider from FromEnv arrive at the
// receiver, compressed as asked, with their attributes, parent, status
// and the resource of OTEL_SERVICE_NAME.
func TestFromEnvSpansArriveAtTheCollector(t *testing.T) {
	r := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.URL+"/")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20secret,x-tenant=a")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
	t.Setenv("OTEL_SERVICE_NAME", "ferry-test")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	tp, shutdown, err := tracing.FromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tp == nil {
		t.Fatal("no provider with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	tr := tp.Tracer("test")
	ctx, parent := tr.Start(context.Background(), "parent")
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int64("tensorferry.bytes", 1<<20), attribute.StringSlice("l", []string{"a", "b"})))
	child.SetStatus(codes.Error, "it broke")
	child.End()
	parent.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, res, reqs := r.snapshot()
	if len(spans) != 2 {
		t.Fatalf("%d spans arrived, want 2", len(spans))
	}
	if h := reqs[0].Header; h.Get("Authorization") != "Bearer secret" || h.Get("X-Tenant") != "a" || h.Get("Content-Encoding") != "gzip" {
		t.Errorf("request headers %v", h)
	}
	var c, p *tracepb.Span
	for _, s := range spans {
		switch s.Name {
		case "child":
			c = s
		case "parent":
			p = s
		}
	}
	if c == nil || p == nil {
		t.Fatalf("spans %v", spans)
	}
	pid := parent.SpanContext().SpanID()
	tid := parent.SpanContext().TraceID()
	if string(c.ParentSpanId) != string(pid[:]) || string(c.TraceId) != string(tid[:]) || string(p.SpanId) != string(pid[:]) {
		t.Errorf("child %x/%x parent %x, want trace %x parent %x", c.TraceId, c.ParentSpanId, p.SpanId, tid, pid)
	}
	if c.Kind != tracepb.Span_SPAN_KIND_CLIENT || c.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || c.Status.GetMessage() != "it broke" {
		t.Errorf("child kind %v status %v", c.Kind, c.Status)
	}
	if v := kv(c.Attributes, "tensorferry.bytes"); v.GetIntValue() != 1<<20 {
		t.Errorf("bytes attribute %v", v)
	}
	if v := kv(c.Attributes, "l"); len(v.GetArrayValue().GetValues()) != 2 {
		t.Errorf("slice attribute %v", v)
	}
	if c.EndTimeUnixNano < c.StartTimeUnixNano || c.StartTimeUnixNano == 0 {
		t.Errorf("child times %d..%d", c.StartTimeUnixNano, c.EndTimeUnixNano)
	}
	if v := kv(res[0], "service.name"); v.GetStringValue() != "ferry-test" {
		t.Errorf("service.name %v", v)
	}
}

func TestExporterConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		url  string
		err  error
	}{
		{name: "nothing set", env: nil},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, on: true, url: "http://c:4318/v1/traces"},
		{name: "endpoint with path", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c/otlp/"}, on: true, url: "https://c/otlp/v1/traces"},
		{name: "traces endpoint as is", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b/x"}, on: true, url: "http://b/x"},
		{name: "otlp default endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true, url: "http://localhost:4318/v1/traces"},
		{name: "none wins", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, err: tracing.ErrUnsupported},
		{name: "zipkin", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: tracing.ErrUnsupported},
		{name: "bad compression", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, err: tracing.ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, on, err := tracing.ExporterConfigFromEnv(env(tc.env))
			if !errors.Is(err, tc.err) || (tc.err != nil && err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if on != tc.on || (on && cfg.URL != tc.url) {
				t.Fatalf("on %v url %q, want %v %q", on, cfg.URL, tc.on, tc.url)
			}
		})
	}
	for _, bad := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "novalue"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/nonexistent/key.pem"},
	} {
		if _, _, err := tracing.ExporterConfigFromEnv(env(bad)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	if tp, shutdown, err := tracing.FromEnvFunc(context.Background(), env(nil)); tp != nil || err != nil || shutdown(context.Background()) != nil {
		t.Errorf("no variables: provider %v, err %v", tp, err)
	}
}

func exportOne(t *testing.T, exp *tracing.Exporter) error {
	t.Helper()
	rec := &recorder{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec))
	_, s := tp.Tracer("test").Start(context.Background(), "one")
	s.End()
	_ = tp.Shutdown(context.Background())
	return exp.ExportSpans(context.Background(), rec.spans)
}

// recorder keeps the spans it is given.
type recorder struct{ spans []sdktrace.ReadOnlySpan }

func (r *recorder) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	r.spans = append(r.spans, s...)
	return nil
}
func (r *recorder) Shutdown(context.Context) error { return nil }

// TestExporterRetriesUnavailable: 503 and 429 are retried; 400 is not.
func TestExporterRetriesUnavailable(t *testing.T) {
	r := newReceiver(t)
	r.status = []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}
	cfg := tracing.ExporterConfig{URL: r.URL + "/v1/traces"}
	cfg.SetRetryBase(time.Millisecond)
	exp, err := tracing.NewExporter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(context.Background())
	if err := exportOne(t, exp); err != nil {
		t.Fatal(err)
	}
	if spans, _, _ := r.snapshot(); len(spans) != 1 {
		t.Fatalf("%d spans after the retries, want 1", len(spans))
	}
	r.mu.Lock()
	r.status = []int{http.StatusBadRequest}
	r.mu.Unlock()
	if err := exportOne(t, exp); !errors.Is(err, tracing.ErrRejected) || !strings.Contains(err.Error(), "400") {
		t.Fatalf("after 400: %v, want ErrRejected", err)
	}
	_ = exp.Shutdown(context.Background())
	if err := exportOne(t, exp); !errors.Is(err, tracing.ErrExporterClosed) {
		t.Fatalf("after Shutdown: %v", err)
	}
}

// TestExporterReportsPartialSuccess: a collector that rejects some spans
// says so in its answer, which the export returns.
func TestExporterReportsPartialSuccess(t *testing.T) {
	r := newReceiver(t)
	var ps []byte
	ps = protowire.AppendTag(ps, 1, protowire.VarintType)
	ps = protowire.AppendVarint(ps, 1)
	ps = protowire.AppendTag(ps, 2, protowire.BytesType)
	ps = protowire.AppendString(ps, "too old")
	r.answer = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ps)
	exp, err := tracing.NewExporter(tracing.ExporterConfig{URL: r.URL + "/v1/traces"})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(context.Background())
	if err := exportOne(t, exp); !errors.Is(err, tracing.ErrRejected) || !strings.Contains(err.Error(), "too old") {
		t.Fatalf("%v, want the rejection", err)
	}
}

func TestNewExporterRefusesBadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:4318", "ftp://c/v1/traces", "http://"} {
		if _, err := tracing.NewExporter(tracing.ExporterConfig{URL: u}); err == nil {
			t.Errorf("%q: no error", u)
		}
	}
}

func FuzzDecodePartialSuccess(f *testing.F) {
	var ps []byte
	ps = protowire.AppendTag(ps, 1, protowire.VarintType)
	ps = protowire.AppendVarint(ps, 3)
	ps = protowire.AppendTag(ps, 2, protowire.BytesType)
	ps = protowire.AppendString(ps, "x")
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ps))
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rejected, msg, err := tracing.DecodePartialSuccess(b)
		if err != nil && (rejected != 0 || msg != "") {
			t.Fatalf("error %v with results %d %q", err, rejected, msg)
		}
		if len(msg) > len(b) {
			t.Fatalf("message of %d bytes from %d", len(msg), len(b))
		}
	})
}
