package router

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/benchmarks/otlptest"
	"github.com/warmroute/warmroute/tracing"
	"github.com/warmroute/warmroute/upstream"
)

const (
	incomingTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpan  = "00f067aa0ba902b7"
)

// tracedReplica answers a chat request with usage, and passes on the trace
// context headers that it got.
func tracedReplica(saw chan<- [2]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			probeAnswer(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		saw <- [2]string{r.Header.Get("Traceparent"), r.Header.Get("Tracestate")}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","usage":{"prompt_tokens":120,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}`)
	}
}

// TestTraceSpanPerRequest sends a chat request with a W3C trace context
// through a proxy that exports to an OTLP/HTTP receiver on loopback: the
// replica gets the proxy's span as its parent, under the client's trace,
// and the span carries what the request came to.
func TestTraceSpanPerRequest(t *testing.T) {
	saw := make(chan [2]string, 4)
	rep := startReplica(t, "traced", tracedReplica(saw))
	recv := otlptest.New(t, nil)
	tr, err := tracing.New(recv.URL, tracing.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, Cost, []string{rep.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.Tracer = tr })
	parent := "00-" + incomingTrace + "-" + incomingSpan + "-01"
	res := post(p, "/v1/chat/completions", chat(1, 3), "Traceparent", parent, "Tracestate", "vendor=abc")
	if res.err != nil || res.status != 200 {
		t.Fatalf("%d %v", res.status, res.err)
	}
	got := <-saw
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := recv.All()
	if len(spans) != 1 {
		t.Fatalf("%d spans exported; want 1", len(spans))
	}
	sp := spans[0].Span
	if hex.EncodeToString(sp.TraceId) != incomingTrace || hex.EncodeToString(sp.ParentSpanId) != incomingSpan {
		t.Errorf("span in trace %x under %x; want the client's trace %s under its span %s", sp.TraceId, sp.ParentSpanId, incomingTrace, incomingSpan)
	}
	if want := "00-" + incomingTrace + "-" + hex.EncodeToString(sp.SpanId) + "-01"; got[0] != want || got[1] != "vendor=abc" {
		t.Errorf("replica got traceparent %q, tracestate %q; want %q (the proxy's span as its parent) and vendor=abc", got[0], got[1], want)
	}
	a := otlptest.Attrs(sp.Attributes)
	for k, want := range map[string]any{
		"warmroute.replica": rep.addr, "warmroute.policy": "cost", "warmroute.route": "spread",
		"warmroute.sends": int64(1), "http.response.status_code": int64(200), "gen_ai.request.model": "m",
		"gen_ai.usage.input_tokens": int64(120), "gen_ai.usage.cache_read.input_tokens": int64(64),
	} {
		if a[k] != want {
			t.Errorf("span attribute %s = %v (%T); want %v (%T); all: %v", k, a[k], a[k], want, want, a)
		}
	}
	if _, ok := a["warmroute.verdict"]; ok {
		t.Errorf("a request answered whole has verdict %v", a["warmroute.verdict"])
	}
}

// TestTraceContextPassesUntouchedWhenOff: with tracing off, the replica
// gets the client's own trace context.
func TestTraceContextPassesUntouchedWhenOff(t *testing.T) {
	saw := make(chan [2]string, 4)
	rep := startReplica(t, "untraced", tracedReplica(saw))
	p := startProxy(t, Cost, []string{rep.url()})
	parent := "00-" + incomingTrace + "-" + incomingSpan + "-01"
	if res := post(p, "/v1/chat/completions", chat(1, 3), "Traceparent", parent, "Tracestate", "vendor=abc"); res.err != nil || res.status != 200 {
		t.Fatalf("%d %v", res.status, res.err)
	}
	if got := <-saw; got != [2]string{parent, "vendor=abc"} {
		t.Errorf("replica got %q; want the client's %q, vendor=abc", got, parent)
	}
	if strings.Contains(p.logs.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", p.logs.String())
	}
}
