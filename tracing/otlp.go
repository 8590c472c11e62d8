package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Errors of the exporter.
var (
	// ErrExporterClosed is returned by ExportSpans after Shutdown.
	ErrExporterClosed = errors.New("tracing: exporter shut down")
	// ErrRejected: the collector refused the spans (an HTTP status that is
	// not retried, or every retry failed) or rejected some of them.
	ErrRejected = errors.New("tracing: spans rejected by the collector")
)

// DefaultTimeout bounds one export, retries included, when
// ExporterConfig.Timeout is zero (OTEL_EXPORTER_OTLP_TIMEOUT's default).
const DefaultTimeout = 10 * time.Second

// maxResponse is the most bytes of a collector's answer that are read.
const maxResponse = 64 << 10

// ExporterConfig configures an Exporter.
type ExporterConfig struct {
	// URL receives the spans: an OTLP/HTTP traces endpoint, for example
	// http://localhost:4318/v1/traces.
	URL string
	// Headers are added to every request (authentication, tenant...).
	Headers map[string]string
	// Timeout bounds one export, retries included (default
	// DefaultTimeout).
	Timeout time.Duration
	// Gzip compresses request bodies.
	Gzip bool
	// TLS configures https URLs (nil: the system's roots).
	TLS *tls.Config
	// retryBase is the first wait before a retry (default 100 ms; tests
	// shorten it).
	retryBase time.Duration
}

// Exporter sends spans to an OpenTelemetry collector over OTLP/HTTP in
// protobuf (the encoding of ExportTraceServiceRequest), the protocol
// "http/protobuf" of the OTLP specification. It is an
// sdktrace.SpanExporter; it imports no gRPC (the OpenTelemetry project's
// otlptracehttp does, through its generated service code). Requests
// answered 429, 502, 503 or 504 are retried with exponential backoff (or
// after the Retry-After the collector gives) until the export's timeout.
type Exporter struct {
	cfg    ExporterConfig
	client *http.Client

	mu     sync.Mutex
	closed bool
}

var _ sdktrace.SpanExporter = (*Exporter)(nil)

// NewExporter returns an exporter posting to cfg.URL, which must be an
// http or https URL.
func NewExporter(cfg ExporterConfig) (*Exporter, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing: OTLP endpoint %q: want an http:// or https:// URL", cfg.URL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.retryBase <= 0 {
		cfg.retryBase = 100 * time.Millisecond
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS != nil {
		tr.TLSClientConfig = cfg.TLS
	}
	return &Exporter{cfg: cfg, client: &http.Client{Transport: tr}}, nil
}

// ExportSpans sends spans in one request (retried as the type's doc
// says), within the exporter's timeout and ctx.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return ErrExporterClosed
	}
	if len(spans) == 0 {
		return nil
	}
	body, err := proto.Marshal(tracesData(spans))
	if err != nil {
		return fmt.Errorf("tracing: encoding %d spans: %w", len(spans), err)
	}
	if e.cfg.Gzip {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		if err := zw.Close(); err != nil {
			return fmt.Errorf("tracing: compressing spans: %w", err)
		}
		body = b.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	wait := e.cfg.retryBase
	for {
		retry, after, err := e.post(ctx, body)
		if !retry {
			return err
		}
		if after > 0 {
			wait = after
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w (last: %w)", ErrRejected, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// post sends one request. It reports whether to retry (and after how long
// the collector asked, 0 if it did not say).
func (e *Exporter) post(ctx context.Context, body []byte) (retry bool, after time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return false, 0, fmt.Errorf("tracing: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", "tensorferry")
	if e.cfg.Gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	for k, v := range e.cfg.Headers {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		// The collector could not be reached: worth retrying while the
		// export's time lasts.
		return ctx.Err() == nil, 0, fmt.Errorf("tracing: posting spans to %s: %w", e.cfg.URL, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		rejected, msg, err := decodePartialSuccess(answer)
		if err != nil {
			return false, 0, fmt.Errorf("tracing: answer of %s: %w", e.cfg.URL, err)
		}
		if rejected > 0 || msg != "" {
			return false, 0, fmt.Errorf("%w: %d spans: %q", ErrRejected, rejected, msg)
		}
		return false, 0, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			after = time.Duration(min(s, 60)) * time.Second
		}
		return true, after, fmt.Errorf("%w: %s answered %s", ErrRejected, e.cfg.URL, resp.Status)
	}
	return false, 0, fmt.Errorf("%w: %s answered %s", ErrRejected, e.cfg.URL, resp.Status)
}

// decodePartialSuccess reads the partial_success (field 1) of an
// ExportTraceServiceResponse: rejected_spans (1) and error_message (2).
// An empty answer is a full success.
func decodePartialSuccess(b []byte) (rejected int64, msg string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, "", fmt.Errorf("bad response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			ps, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, "", fmt.Errorf("bad response: %w", protowire.ParseError(n))
			}
			b = b[n:]
			if rejected, msg, err = decodePartial(ps); err != nil {
				return 0, "", err
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, "", fmt.Errorf("bad response: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return rejected, msg, nil
}

func decodePartial(b []byte) (rejected int64, msg string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, "", fmt.Errorf("bad partial success: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, "", fmt.Errorf("bad partial success: %w", protowire.ParseError(n))
			}
			rejected, b = int64(v), b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, "", fmt.Errorf("bad partial success: %w", protowire.ParseError(n))
			}
			msg, b = string(v), b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, "", fmt.Errorf("bad partial success: %w", protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return rejected, msg, nil
}

// Shutdown stops the exporter: later exports fail with
// ErrExporterClosed. Idle connections are closed.
func (e *Exporter) Shutdown(context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.client.CloseIdleConnections()
	return nil
}
