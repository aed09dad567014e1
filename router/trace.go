package router

import (
	"time"

	"github.com/warmroute/warmroute/tracing"
)

var strTraceparent = []byte("traceparent")

// startSpan begins x's trace span (-otlp-endpoint), the child of the
// request's own W3C trace context if it has one, and makes the span the
// parent of the request that the replica gets; the tracestate goes on as
// it came.
func (x *exchange) startSpan() {
	hd := &x.ctx.Request.Header
	x.span = x.h.cfg.Tracer.Start(hd.Method(), x.ctx.Path(), hd.PeekBytes(strTraceparent), hd.Peek("tracestate"), x.start)
	x.traceparent = x.span.AppendTraceparent(x.traceparent[:0])
	hd.SetBytesKV(strTraceparent, x.traceparent)
}

// endSpan ends x's trace span with what the request came to: answered
// with status by replica (named "none" when no replica answered).
func (x *exchange) endSpan(replica string, status int, now time.Time) {
	a := tracing.Attrs{Route: x.reason.String(), Policy: x.h.policy().String(), Model: string(x.modelName),
		PredictedCachedBytes: -1, CachedTokens: int(x.cachedTokens), PromptTokens: int(x.promptTokens),
		Sends: x.sends, Status: status, Verdict: x.verdict}
	if replica != "none" {
		a.Replica = replica
	}
	if x.predictedCached >= 0 {
		a.PredictedCachedBytes = int64(x.predictedCached) * bytesPerToken
	}
	if !x.firstByte.IsZero() {
		a.TTFT = x.firstByte.Sub(x.start)
	}
	x.span.End(a, now)
}
