package tracing

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Span is one request's span, from Start to End. The zero Span does
// nothing.
type Span struct {
	span         trace.Span
	t            *Tracer
	method, path string
}

// Start begins the span of a request that came in at start with method and
// path (the path without its query). traceparent and tracestate are the
// request's W3C trace context headers, nil when absent: a valid
// traceparent makes the span its child, sampled as the parent says, and
// otherwise the span is the root of a new trace. On a nil *Tracer it
// returns the zero Span, but the router checks for nil first, so that
// tracing off costs nothing, not even the arguments.
func (t *Tracer) Start(method, path, traceparent, tracestate []byte, start time.Time) Span {
	if t == nil {
		return Span{}
	}
	ctx := context.Background()
	if len(traceparent) > 0 {
		ctx = propagation.TraceContext{}.Extract(ctx, &incoming{traceparent, tracestate})
	}
	s := Span{t: t}
	name, ok := t.names.get(method, path)
	if ok {
		s.method, s.path = name[:len(method)], name[len(method)+1:]
	} else {
		name = methodName(method)
		s.method, s.path = string(method), string(path)
	}
	_, s.span = t.tracer.Start(ctx, name, t.server, trace.WithTimestamp(start))
	return s
}

// AppendTraceparent appends the traceparent header's value for the
// request sent to the replica: this span's trace id, its own id as the
// parent, and its sampled flag. The request's tracestate goes to the
// replica as it came. The zero Span appends nothing.
func (s Span) AppendTraceparent(dst []byte) []byte {
	if s.span == nil {
		return dst
	}
	sc := s.span.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	dst = append(dst, "00-"...)
	dst = appendHex(dst, tid[:])
	dst = append(dst, '-')
	dst = appendHex(dst, sid[:])
	dst = append(dst, '-')
	return appendHex(dst, []byte{byte(sc.TraceFlags())})
}

func appendHex(dst, b []byte) []byte {
	const digits = "0123456789abcdef"
	for _, c := range b {
		dst = append(dst, digits[c>>4], digits[c&0xf])
	}
	return dst
}

// End ends the span at end with the request's attributes and queues it for
// export; it never waits for the collector. The zero Span does nothing.
func (s Span) End(a Attrs, end time.Time) {
	if s.span == nil {
		return
	}
	if s.span.SpanContext().IsSampled() {
		s.t.ended.Add(1) // before End, which may hand it to the exporter at once
	}
	buf := attrBufs.Get().(*[maxAttrs]attribute.KeyValue)
	defer func() {
		clear(buf[:]) // let the strings go
		attrBufs.Put(buf)
	}()
	kv := append(buf[:0],
		semconv.HTTPRequestMethodKey.String(s.method),
		semconv.URLPath(s.path),
		sendsKey.Int(a.Sends),
	)
	if a.Status > 0 {
		kv = append(kv, semconv.HTTPResponseStatusCode(a.Status))
	}
	for _, f := range [...]struct {
		key attribute.Key
		v   string
	}{{replicaKey, a.Replica}, {routeKey, a.Route}, {policyKey, a.Policy}, {genAIRequestModel, a.Model}, {verdictKey, a.Verdict}} {
		if f.v != "" {
			kv = append(kv, f.key.String(f.v))
		}
	}
	if a.PredictedCachedBytes >= 0 {
		kv = append(kv, predictedCachedKey.Int64(a.PredictedCachedBytes))
	}
	if a.PromptTokens >= 0 {
		kv = append(kv, genAIInputTokens.Int(a.PromptTokens))
	}
	if a.CachedTokens >= 0 {
		kv = append(kv, genAICacheReadTokens.Int(a.CachedTokens))
	}
	if a.TTFT > 0 {
		kv = append(kv, ttftKey.Float64(a.TTFT.Seconds()))
	}
	// The HTTP conventions make a server span an error at a 5xx, and
	// error.type says what failed: warmroute's verdict when it has one.
	switch {
	case a.Verdict != "":
		kv = append(kv, semconv.ErrorTypeKey.String(a.Verdict))
		s.span.SetStatus(codes.Error, a.Verdict)
	case a.Status >= 500:
		kv = append(kv, semconv.ErrorTypeKey.String(strconv.Itoa(a.Status)))
		s.span.SetStatus(codes.Error, "")
	}
	s.span.SetAttributes(kv...)
	s.span.End(trace.WithTimestamp(end))
}

// maxAttrs bounds the attributes End sets.
const maxAttrs = 16

// attrBufs hold End's attributes on their way to the span, which copies
// them: an array on End's stack would escape through the interface call
// and cost a KiB a request.
var attrBufs = sync.Pool{New: func() any { return new([maxAttrs]attribute.KeyValue) }}

// incoming is the request's trace context headers as the W3C propagator
// reads them. The values are copied to strings because a tracestate the
// span keeps must outlive the request's buffers.
type incoming struct{ traceparent, tracestate []byte }

func (h *incoming) Get(key string) string {
	switch key {
	case "traceparent":
		return string(h.traceparent)
	case "tracestate":
		return string(h.tracestate)
	}
	return ""
}

func (*incoming) Set(string, string) {}
func (*incoming) Keys() []string     { return []string{"traceparent", "tracestate"} }
