package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ErrUnsupported: the OTEL_* variables ask for an exporter or protocol
// this package does not provide (grpc, http/json, an exporter other than
// otlp).
var ErrUnsupported = errors.New("tracing: not supported")

// DefaultEndpoint is where spans go when OTEL_TRACES_EXPORTER=otlp names
// no endpoint: a collector's OTLP/HTTP port on this host.
const DefaultEndpoint = "http://localhost:4318"

// FromEnv returns a tracer provider that exports spans over OTLP/HTTP as
// the standard OpenTelemetry environment variables say, and the function
// that flushes and stops it (call it before the program exits). Tracing
// is on when OTEL_TRACES_EXPORTER is otlp, or when it is unset and an
// endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT, to which /v1/traces is
// appended, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, used as is); off (a nil
// provider and a shutdown that does nothing) otherwise, with
// OTEL_TRACES_EXPORTER=none, or OTEL_SDK_DISABLED=true.
//
// Also read, each with its OTEL_EXPORTER_OTLP_TRACES_* form first:
// OTEL_EXPORTER_OTLP_HEADERS (key=value,...; values URL-encoded),
// OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds, default 10000),
// OTEL_EXPORTER_OTLP_COMPRESSION (gzip or none),
// OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf only: grpc and http/json give
// ErrUnsupported), OTEL_EXPORTER_OTLP_CERTIFICATE (a PEM file of roots to
// trust), OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY (PEM
// files). The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// (the resource), OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, and
// OTEL_BSP_* (the batch span processor).
func FromEnv(ctx context.Context) (trace.TracerProvider, func(context.Context) error, error) {
	return fromEnv(ctx, os.Getenv)
}

func noShutdown(context.Context) error { return nil }

func fromEnv(ctx context.Context, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
	cfg, on, err := exporterConfig(getenv)
	if err != nil || !on {
		return nil, noShutdown, err
	}
	exp, err := NewExporter(cfg)
	if err != nil {
		return nil, noShutdown, err
	}
	res, err := resource.Merge(resource.Default(), resource.Environment())
	if err != nil {
		return nil, noShutdown, fmt.Errorf("tracing: resource: %w", err)
	}
	if hr, err := resource.New(ctx, resource.WithHost()); err == nil {
		if m, err := resource.Merge(res, hr); err == nil {
			res = m
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// exporterConfig reads the exporter's configuration from the environment;
// on reports whether the variables ask for tracing.
func exporterConfig(getenv func(string) string) (cfg ExporterConfig, on bool, err error) {
	env := func(name string) string {
		if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_" + name)); v != "" {
			return v
		}
		return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + name))
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return cfg, false, nil
	}
	tracesURL := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	base := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	switch exporters := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exporters {
	case "":
		on = tracesURL != "" || base != ""
	case "none":
		on = false
	case "otlp":
		on = true
	default:
		return cfg, false, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%s (this build has otlp and none)", ErrUnsupported, exporters)
	}
	if !on {
		return cfg, false, nil
	}
	switch p := env("PROTOCOL"); p {
	case "", "http/protobuf":
	case "grpc":
		return cfg, false, fmt.Errorf("%w: OTLP protocol grpc (tensorferry has no gRPC: use http/protobuf, port 4318)", ErrUnsupported)
	default:
		return cfg, false, fmt.Errorf("%w: OTLP protocol %q (http/protobuf only)", ErrUnsupported, p)
	}
	switch {
	case tracesURL != "":
		cfg.URL = tracesURL
	case base != "":
		cfg.URL = strings.TrimSuffix(base, "/") + "/v1/traces"
	default:
		cfg.URL = DefaultEndpoint + "/v1/traces"
	}
	if cfg.Headers, err = parseHeaders(getenv("OTEL_EXPORTER_OTLP_HEADERS"), nil); err != nil {
		return cfg, false, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_HEADERS: %w", err)
	}
	if cfg.Headers, err = parseHeaders(getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS"), cfg.Headers); err != nil {
		return cfg, false, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_TRACES_HEADERS: %w", err)
	}
	if t := env("TIMEOUT"); t != "" {
		ms, err := strconv.Atoi(t)
		if err != nil || ms <= 0 {
			return cfg, false, fmt.Errorf("tracing: OTLP timeout %q: want a positive number of milliseconds", t)
		}
		cfg.Timeout = time.Duration(ms) * time.Millisecond
	}
	switch c := env("COMPRESSION"); c {
	case "", "none":
	case "gzip":
		cfg.Gzip = true
	default:
		return cfg, false, fmt.Errorf("%w: OTLP compression %q (gzip or none)", ErrUnsupported, c)
	}
	if cfg.TLS, err = tlsConfig(env("CERTIFICATE"), env("CLIENT_CERTIFICATE"), env("CLIENT_KEY")); err != nil {
		return cfg, false, err
	}
	return cfg, true, nil
}

// parseHeaders adds the headers of s (key=value,...; values URL-encoded)
// to h.
func parseHeaders(s string, h map[string]string) (map[string]string, error) {
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		v, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("value of %s: %w", k, err)
		}
		if h == nil {
			h = map[string]string{}
		}
		h[k] = v
	}
	return h, nil
}

// tlsConfig returns the TLS settings the files name; nil without any.
func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP certificate: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tracing: OTLP certificate %s: no PEM certificate in it", caFile)
		}
	}
	if certFile != "" || keyFile != "" {
		if certFile == "" || keyFile == "" {
			return nil, errors.New("tracing: OTLP client certificate and key go together")
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
