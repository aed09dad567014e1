// Package otlptest is an OTLP/HTTP trace receiver on loopback, as a
// collector serves one, for the tests of what warmroute exports.
package otlptest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver decodes each ExportTraceServiceRequest and passes on its
// spans, with their resource and scope.
type Receiver struct {
	URL   string
	spans chan Received
	// Arrived gets a value as each export request comes in; hold, when
	// not nil, keeps each one waiting until it is closed.
	Arrived chan struct{}
	hold    chan struct{}
}

// Received is one span as the receiver got it.
type Received struct {
	Resource map[string]any
	Scope    string
	Span     *tracepb.Span
}

// New starts a receiver, closed when the test ends; a hold channel makes
// it a collector that hangs until the channel is closed.
func New(t testing.TB, hold chan struct{}) *Receiver {
	r := &Receiver{spans: make(chan Received, 1<<16), Arrived: make(chan struct{}, 1<<10), hold: hold}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("receiver: %s %s as %q, want POST /v1/traces as application/x-protobuf", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.Arrived <- struct{}{}
		if r.hold != nil {
			<-r.hold
		}
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &msg)
		}
		if err != nil {
			t.Errorf("receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range msg.ResourceSpans {
			res := Attrs(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans <- Received{res, ss.GetScope().GetName(), s}
				}
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// All returns the spans received so far. After Shutdown that is every
// span exported: the receiver passes a request's spans on before it
// answers, and Shutdown waits for the answer.
func (r *Receiver) All() []Received {
	var out []Received
	for {
		select {
		case s := <-r.spans:
			out = append(out, s)
		default:
			return out
		}
	}
}

// Attrs gives OTLP attributes as Go values: string, int64, float64 or
// bool.
func Attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.Key] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = v.BoolValue
		default:
			m[kv.Key] = v
		}
	}
	return m
}
