package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Span flags of OTLP (SpanFlags): whether the parent's remoteness is
// known, and whether it is remote.
const (
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

// tracesData converts spans to OTLP's TracesData, which has the encoding
// of the collector's ExportTraceServiceRequest: spans grouped by resource,
// then by instrumentation scope, in the order they come.
func tracesData(spans []sdktrace.ReadOnlySpan) *tracepb.TracesData {
	type scopeKey struct {
		res                   *resource.Resource
		name, version, schema string
	}
	var (
		out     tracepb.TracesData
		byRes   = map[*resource.Resource]*tracepb.ResourceSpans{}
		byScope = map[scopeKey]*tracepb.ScopeSpans{}
	)
	for _, s := range spans {
		if s == nil {
			continue
		}
		res := s.Resource()
		rs := byRes[res]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: resourceProto(res)}
			if res != nil {
				rs.SchemaUrl = res.SchemaURL()
			}
			byRes[res] = rs
			out.ResourceSpans = append(out.ResourceSpans, rs)
		}
		sc := s.InstrumentationScope()
		k := scopeKey{res, sc.Name, sc.Version, sc.SchemaURL}
		ss := byScope[k]
		if ss == nil {
			ss = &tracepb.ScopeSpans{
				Scope:     &commonpb.InstrumentationScope{Name: sc.Name, Version: sc.Version, Attributes: keyValues(sc.Attributes.ToSlice())},
				SchemaUrl: sc.SchemaURL,
			}
			byScope[k] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, spanProto(s))
	}
	return &out
}

func resourceProto(r *resource.Resource) *resourcepb.Resource {
	if r == nil {
		return &resourcepb.Resource{}
	}
	return &resourcepb.Resource{Attributes: keyValues(r.Attributes())}
}

func spanProto(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:                tid[:],
		SpanId:                 sid[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  uint32(sc.TraceFlags()) | flagHasIsRemote,
		Name:                   s.Name(),
		Kind:                   spanKind(s.SpanKind()),
		StartTimeUnixNano:      unixNano(s.StartTime().UnixNano()),
		EndTimeUnixNano:        unixNano(s.EndTime().UnixNano()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: clampUint32(s.DroppedAttributes()),
		DroppedEventsCount:     clampUint32(s.DroppedEvents()),
		DroppedLinksCount:      clampUint32(s.DroppedLinks()),
		Status:                 status(s.Status()),
	}
	if parent := s.Parent(); parent.SpanID().IsValid() {
		psid := parent.SpanID()
		p.ParentSpanId = psid[:]
		if parent.IsRemote() {
			p.Flags |= flagIsRemote
		}
	}
	for _, e := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{
			TimeUnixNano:           unixNano(e.Time.UnixNano()),
			Name:                   e.Name,
			Attributes:             keyValues(e.Attributes),
			DroppedAttributesCount: clampUint32(e.DroppedAttributeCount),
		})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		flags := uint32(l.SpanContext.TraceFlags()) | flagHasIsRemote
		if l.SpanContext.IsRemote() {
			flags |= flagIsRemote
		}
		p.Links = append(p.Links, &tracepb.Span_Link{
			TraceId:                ltid[:],
			SpanId:                 lsid[:],
			TraceState:             l.SpanContext.TraceState().String(),
			Attributes:             keyValues(l.Attributes),
			DroppedAttributesCount: clampUint32(l.DroppedAttributeCount),
			Flags:                  flags,
		})
	}
	return p
}

func unixNano(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

func clampUint32(n int) uint32 {
	if n < 0 {
		return 0
	}
	return uint32(min(int64(n), 1<<32-1))
}

func spanKind(k trace.SpanKind) tracepb.Span_SpanKind {
	switch k {
	case trace.SpanKindInternal:
		return tracepb.Span_SPAN_KIND_INTERNAL
	case trace.SpanKindServer:
		return tracepb.Span_SPAN_KIND_SERVER
	case trace.SpanKindClient:
		return tracepb.Span_SPAN_KIND_CLIENT
	case trace.SpanKindProducer:
		return tracepb.Span_SPAN_KIND_PRODUCER
	case trace.SpanKindConsumer:
		return tracepb.Span_SPAN_KIND_CONSUMER
	}
	return tracepb.Span_SPAN_KIND_UNSPECIFIED
}

func status(s sdktrace.Status) *tracepb.Status {
	out := &tracepb.Status{Message: s.Description}
	switch s.Code {
	case codes.Ok:
		out.Code = tracepb.Status_STATUS_CODE_OK
	case codes.Error:
		out.Code = tracepb.Status_STATUS_CODE_ERROR
	default:
		out.Code = tracepb.Status_STATUS_CODE_UNSET
	}
	return out
}

func keyValues(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BOOLSLICE:
		var vs []*commonpb.AnyValue
		for _, b := range v.AsBoolSlice() {
			vs = append(vs, &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: b}})
		}
		return arrayValue(vs)
	case attribute.INT64SLICE:
		var vs []*commonpb.AnyValue
		for _, n := range v.AsInt64Slice() {
			vs = append(vs, &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: n}})
		}
		return arrayValue(vs)
	case attribute.FLOAT64SLICE:
		var vs []*commonpb.AnyValue
		for _, f := range v.AsFloat64Slice() {
			vs = append(vs, &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: f}})
		}
		return arrayValue(vs)
	case attribute.STRINGSLICE:
		var vs []*commonpb.AnyValue
		for _, s := range v.AsStringSlice() {
			vs = append(vs, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}})
		}
		return arrayValue(vs)
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.String()}}
}

func arrayValue(vs []*commonpb.AnyValue) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vs}}}
}
