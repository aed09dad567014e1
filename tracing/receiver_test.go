package tracing

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

// receiver is an OTLP/HTTP trace receiver on loopback, as a collector
// serves one: it decodes each ExportTraceServiceRequest and passes on its
// spans, with their resource and scope.
type receiver struct {
	url   string
	spans chan received
	// arrived gets a value as each export request comes in; hold, when
	// not nil, keeps each one waiting until it is closed.
	arrived chan struct{}
	hold    chan struct{}
}

type received struct {
	resource map[string]any
	scope    string
	span     *tracepb.Span
}

// newReceiver starts a receiver; a hold channel makes it a collector that
// hangs until the channel is closed.
func newReceiver(t testing.TB, hold chan struct{}) *receiver {
	r := &receiver{spans: make(chan received, 1<<16), arrived: make(chan struct{}, 1<<10), hold: hold}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("receiver: %s %s as %q, want POST /v1/traces as application/x-protobuf", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.arrived <- struct{}{}
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
			res := attrMap(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans <- received{res, ss.GetScope().GetName(), s}
				}
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// all returns the spans received so far. After Shutdown that is every
// span exported: the receiver passes a request's spans on before it
// answers, and Shutdown waits for the answer.
func (r *receiver) all() []received {
	var out []received
	for {
		select {
		case s := <-r.spans:
			out = append(out, s)
		default:
			return out
		}
	}
}

// attrMap gives OTLP attributes as Go values: string, int64, float64 or
// bool.
func attrMap(kvs []*commonpb.KeyValue) map[string]any {
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
