package tracing

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/warmroute/warmroute/benchmarks/otlptest"
)

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
)

// start makes a tracer that exports to a new receiver, and stops it when
// the test ends.
func start(t *testing.T, opts Options) (*Tracer, *otlptest.Receiver) {
	t.Helper()
	r := otlptest.New(t, nil)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	tr, err := New(r.URL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return tr, r
}

// exported stops tr and returns the spans r received, failing unless
// there are n.
func exported(t *testing.T, tr *Tracer, r *otlptest.Receiver, n int) []otlptest.Received {
	t.Helper()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := r.All()
	if len(spans) != n {
		t.Fatalf("%d spans exported, want %d", len(spans), n)
	}
	return spans
}

// traceparent splits a traceparent value, failing unless it is version
// 00's form.
func traceparent(t *testing.T, v []byte) (trace, span, flags string) {
	t.Helper()
	parts := strings.Split(string(v), "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		t.Fatalf("traceparent %q is not 00-<32 hex>-<16 hex>-<2 hex>", v)
	}
	return parts[1], parts[2], parts[3]
}

func TestSpanIsTheChildOfTheIncomingTraceparent(t *testing.T) {
	tr, r := start(t, Options{ServiceVersion: "v1.2.3"})
	in := time.Unix(1_700_000_000, 123_456_789)
	out := in.Add(1500 * time.Millisecond)

	s := tr.Start([]byte("POST"), []byte("/v1/chat/completions"),
		[]byte("00-"+parentTrace+"-"+parentSpan+"-01"), []byte("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"), in)
	header := s.AppendTraceparent([]byte("kept:"))
	s.End(Attrs{
		Replica: "http://10.0.0.7:8000", Route: "pinned", Policy: "cost", Model: "qwen3-32b",
		PredictedCachedBytes: 48_000, CachedTokens: 11_264, PromptTokens: 12_000,
		TTFT: 250 * time.Millisecond, Sends: 2, Status: 200,
	}, out)

	got := exported(t, tr, r, 1)[0]
	sp := got.Span
	if !bytes.HasPrefix(header, []byte("kept:")) {
		t.Fatalf("AppendTraceparent did not append: %q", header)
	}
	tid, sid, flags := traceparent(t, header[len("kept:"):])
	for _, c := range []struct{ what, got, want string }{
		{"trace id", hex.EncodeToString(sp.TraceId), parentTrace},
		{"parent span id", hex.EncodeToString(sp.ParentSpanId), parentSpan},
		{"the replica's traceparent: trace id", tid, parentTrace},
		{"the replica's traceparent: parent id", sid, hex.EncodeToString(sp.SpanId)},
		{"the replica's traceparent: flags", flags, "01"},
		{"name", sp.Name, "POST /v1/chat/completions"},
		{"tracestate", sp.TraceState, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		{"kind", sp.Kind.String(), tracepb.Span_SPAN_KIND_SERVER.String()},
		{"status", sp.GetStatus().GetCode().String(), tracepb.Status_STATUS_CODE_UNSET.String()},
		{"scope", got.Scope, scope},
		{"start", time.Unix(0, int64(sp.StartTimeUnixNano)).String(), in.String()},
		{"end", time.Unix(0, int64(sp.EndTimeUnixNano)).String(), out.String()},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
		}
	}
	if sid == parentSpan {
		t.Errorf("the replica's parent is the client's span, not warmroute's")
	}
	want := map[string]any{
		"http.request.method":                  "POST",
		"url.path":                             "/v1/chat/completions",
		"http.response.status_code":            int64(200),
		"gen_ai.request.model":                 "qwen3-32b",
		"gen_ai.usage.input_tokens":            int64(12_000),
		"gen_ai.usage.cache_read.input_tokens": int64(11_264),
		"warmroute.replica":                    "http://10.0.0.7:8000",
		"warmroute.route":                      "pinned",
		"warmroute.policy":                     "cost",
		"warmroute.predicted_cached_bytes":     int64(48_000),
		"warmroute.sends":                      int64(2),
		"warmroute.ttft_seconds":               0.25,
	}
	if a := otlptest.Attrs(sp.Attributes); !maps.Equal(a, want) {
		t.Errorf("attributes\n %v\nwant\n %v", a, want)
	}
	if got.Resource["service.name"] != "warmroute" || got.Resource["service.version"] != "v1.2.3" {
		t.Errorf("resource %v, want service.name warmroute and service.version v1.2.3", got.Resource)
	}
}

// A request without a usable traceparent starts a trace of its own, and
// what is not known is left off its span.
func TestSpanWithoutAParentIsARoot(t *testing.T) {
	tr, r := start(t, Options{})
	bad := []string{
		"",
		"00-" + strings.ToUpper(parentTrace) + "-" + parentSpan + "-01", // upper-case hex
		"ff-" + parentTrace + "-" + parentSpan + "-01",                  // version ff
		"00-00000000000000000000000000000000-" + parentSpan + "-01",     // zero trace id
		"00-" + parentTrace + "-0000000000000000-01",                    // zero parent id
		"00-" + parentTrace + "-" + parentSpan + "-01-extra",            // version 00 with more
		"00-" + parentTrace + "-" + parentSpan,                          // no flags
	}
	sent := map[string]string{} // trace id -> the traceparent it came with
	for _, tp := range bad {
		s := tr.Start([]byte("POST"), []byte("/v1/completions"), []byte(tp), []byte("congo=t61rcWkgMzE"), time.Now())
		tid, _, flags := traceparent(t, s.AppendTraceparent(nil))
		if tid == parentTrace || flags != "01" {
			t.Errorf("traceparent %q: the replica gets trace %s flags %s, want a new sampled trace", tp, tid, flags)
		}
		sent[tid] = tp
		s.End(Attrs{PredictedCachedBytes: -1, CachedTokens: -1, PromptTokens: -1}, time.Now())
	}
	for _, got := range exported(t, tr, r, len(bad)) {
		sp := got.Span
		tp, ok := sent[hex.EncodeToString(sp.TraceId)]
		if !ok {
			t.Errorf("span of trace %x: no replica was told that trace", sp.TraceId)
		}
		if len(sp.ParentSpanId) != 0 || sp.TraceState != "" {
			t.Errorf("traceparent %q: span has parent %x and tracestate %q, want a root without either", tp, sp.ParentSpanId, sp.TraceState)
		}
		want := map[string]any{"http.request.method": "POST", "url.path": "/v1/completions", "warmroute.sends": int64(0)}
		if a := otlptest.Attrs(sp.Attributes); !maps.Equal(a, want) {
			t.Errorf("traceparent %q: attributes %v, want only %v", tp, a, want)
		}
	}
}

// A client that did not sample its trace is followed: the replica learns
// the trace with the flag off, and nothing is exported.
func TestUnsampledParentIsNotExported(t *testing.T) {
	tr, r := start(t, Options{})
	s := tr.Start([]byte("POST"), []byte("/v1/messages"), []byte("00-"+parentTrace+"-"+parentSpan+"-00"), nil, time.Now())
	tid, sid, flags := traceparent(t, s.AppendTraceparent(nil))
	if tid != parentTrace || sid == parentSpan || flags != "00" {
		t.Errorf("the replica gets trace %s parent %s flags %s, want trace %s, a span of its own, 00", tid, sid, flags, parentTrace)
	}
	s.End(Attrs{}, time.Now())
	sampled := tr.Start([]byte("POST"), []byte("/v1/messages"), []byte("00-"+parentTrace+"-"+parentSpan+"-01"), nil, time.Now())
	sampled.End(Attrs{}, time.Now())
	if sp := exported(t, tr, r, 1)[0].Span; hex.EncodeToString(sp.ParentSpanId) != parentSpan || sp.Flags&0xff != 1 {
		t.Errorf("exported span has parent %x, flags %#x: want the sampled one", sp.ParentSpanId, sp.Flags)
	}
}

// A failed request's span is an error, with what failed as error.type.
func TestFailedRequestIsAnError(t *testing.T) {
	tr, r := start(t, Options{})
	for _, a := range []Attrs{
		{Verdict: "maybe running", Status: 504, Sends: 1},
		{Status: 502, Sends: 1},
		{Status: 429, Sends: 2}, // the client's to retry: not the server's error
	} {
		s := tr.Start([]byte("POST"), []byte(fmt.Sprintf("/%d", a.Status)), nil, nil, time.Now())
		s.End(a, time.Now())
	}
	want := map[string]struct {
		code    tracepb.Status_StatusCode
		message string
		errType any
	}{
		"POST /504": {tracepb.Status_STATUS_CODE_ERROR, "maybe running", "maybe running"},
		"POST /502": {tracepb.Status_STATUS_CODE_ERROR, "", "502"},
		"POST /429": {tracepb.Status_STATUS_CODE_UNSET, "", nil},
	}
	for _, got := range exported(t, tr, r, len(want)) {
		sp, w := got.Span, want[got.Span.Name]
		if sp.GetStatus().GetCode() != w.code || sp.GetStatus().GetMessage() != w.message || otlptest.Attrs(sp.Attributes)["error.type"] != w.errType {
			t.Errorf("%s: status %v %q, error.type %v; want %v %q, %v", sp.Name, sp.GetStatus().GetCode(), sp.GetStatus().GetMessage(),
				otlptest.Attrs(sp.Attributes)["error.type"], w.code, w.message, w.errType)
		}
	}
}

// Paths beyond the name table's bound, or too long for it, name their
// spans by method alone, and their url.path is still whole.
func TestSpanNamesStayFew(t *testing.T) {
	tr, r := start(t, Options{})
	long := "/v1/responses/" + strings.Repeat("x", maxNameLen)
	paths := []string{long}
	for i := range maxNames + 2 {
		paths = append(paths, fmt.Sprintf("/v1/responses/resp_%d", i))
	}
	for _, p := range paths {
		tr.Start([]byte("GET"), []byte(p), nil, nil, time.Now()).End(Attrs{}, time.Now())
	}
	named := 0
	for _, got := range exported(t, tr, r, len(paths)) {
		path := otlptest.Attrs(got.Span.Attributes)["url.path"].(string)
		switch got.Span.Name {
		case "GET " + path:
			named++
		case "GET":
			if path == long {
				continue
			}
			if n, _ := fmt.Sscanf(path, "/v1/responses/resp_%d", new(int)); n != 1 {
				t.Errorf("span named GET has url.path %q", path)
			}
		default:
			t.Errorf("span %q has url.path %q", got.Span.Name, path)
		}
	}
	if named != maxNames {
		t.Errorf("%d spans named after their path, want %d", named, maxNames)
	}
}

// The replica's traceparent is written into the router's buffer, with no
// allocation.
func TestAppendTraceparentAllocatesNothing(t *testing.T) {
	tr, _ := start(t, Options{})
	s := tr.Start([]byte("POST"), []byte("/v1/chat/completions"), nil, nil, time.Now())
	defer s.End(Attrs{}, time.Now())
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = s.AppendTraceparent(buf[:0]) }); n != 0 {
		t.Errorf("AppendTraceparent allocates %.0f times, want 0", n)
	}
}
