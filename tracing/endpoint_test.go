package tracing

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestEndpoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		want endpoint
	}{
		{"http://otel-collector:4318", endpoint{"otel-collector:4318", "/v1/traces", false}},
		{"http://otel-collector:4318/", endpoint{"otel-collector:4318", "/v1/traces", false}},
		{"https://otlp.example.com", endpoint{"otlp.example.com", "/v1/traces", true}},
		{"https://otlp.example.com/api/v2/otlp/v1/traces", endpoint{"otlp.example.com", "/api/v2/otlp/v1/traces", true}},
		{"HTTP://[::1]:4318", endpoint{"[::1]:4318", "/v1/traces", false}},
	} {
		got, err := parseEndpoint(c.in)
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

// A bad endpoint fails at start, saying what is wrong with it.
func TestBadEndpointFailsNew(t *testing.T) {
	for in, why := range map[string]string{
		"otel-collector:4318":                      "no http:// or https://",
		"127.0.0.1:4318":                           "no http:// or https://",
		"/v1/traces":                               "no http:// or https://",
		"grpc://otel-collector:4317":               `the scheme "grpc" is neither http nor https`,
		"http://":                                  "no host",
		"http:///v1/traces":                        "no host",
		"http://otel-collector:43a8":               "invalid port",
		"https://user:secret@otlp.example.com":     "credentials in the URL are not sent",
		"http://otel-collector:4318/v1/traces?x=1": "a query is not sent",
		"http://otel-collector:4318/#x":            "a fragment is not sent",
	} {
		tr, err := New(in, Options{})
		if err == nil {
			tr.Shutdown(context.Background())
			t.Errorf("%q: started, want an error that says %s", in, why)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, why) || !strings.Contains(msg, in) {
			t.Errorf("%q: error %q, want one that names it and says %s", in, msg, why)
		}
	}
}

// No endpoint is tracing off: a nil *Tracer, on which every call is
// harmless.
func TestNoEndpointIsOff(t *testing.T) {
	tr, err := New("", Options{})
	if tr != nil || err != nil {
		t.Fatalf("New(\"\") = %v, %v; want nil, nil", tr, err)
	}
	s := tr.Start([]byte("POST"), []byte("/v1/chat/completions"), []byte("00-"+parentTrace+"-"+parentSpan+"-01"), nil, time.Now())
	if s != (Span{}) {
		t.Errorf("a nil Tracer started %+v, want the zero Span", s)
	}
	if got := s.AppendTraceparent([]byte("x")); string(got) != "x" {
		t.Errorf("the zero Span appended %q", got[1:])
	}
	s.End(Attrs{}, time.Now())
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
	buf, now := make([]byte, 0, 64), time.Now()
	if n := testing.AllocsPerRun(100, func() {
		s := tr.Start([]byte("POST"), []byte("/v1/chat/completions"), nil, nil, now)
		buf = s.AppendTraceparent(buf[:0])
		s.End(Attrs{}, now)
	}); n != 0 {
		t.Errorf("a nil Tracer allocates %.0f times a request, want 0", n)
	}
}
