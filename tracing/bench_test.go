//go:build unix

package tracing

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// sink is an OTLP/HTTP receiver on loopback that reads every export
// without decoding it: a collector's work is done on another machine and
// is not warmroute's cost. With hold, it answers none until hold is
// closed.
func sink(b *testing.B, hold chan struct{}) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold != nil {
			<-hold
		}
		io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// BenchmarkSpan is what tracing costs a request when it is on: Start, the
// replica's traceparent, and End with every attribute.
//
// "request" is the cost on the request's own goroutine: the receiver
// holds the first export, so that nothing else is exported while the
// clock runs (the spans past the full queue are dropped, which costs what
// queuing them does). "exported" has every span sent, flushing each
// batch, so that the export's work on the processor's goroutine (the
// protobuf encoding and the POST) is counted too: what tracing costs the
// machine per request. B/op and allocs/op count every goroutine's, and
// so does cpu-ns/op: the process's CPU time a request, which a machine
// busy with other work inflates less than ns/op.
func BenchmarkSpan(b *testing.B) {
	for _, bc := range []struct {
		name    string
		holding bool
	}{{"request", true}, {"exported", false}} {
		b.Run(bc.name, func(b *testing.B) {
			var hold chan struct{}
			if bc.holding {
				hold = make(chan struct{})
			}
			tr, err := New(sink(b, hold), Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			method, path := []byte("POST"), []byte("/v1/chat/completions")
			parent := []byte("00-" + parentTrace + "-" + parentSpan + "-01")
			state := []byte("congo=t61rcWkgMzE")
			attrs := Attrs{
				Replica: "http://10.0.0.7:8000", Route: "pinned", Policy: "cost", Model: "qwen3-32b",
				PredictedCachedBytes: 48_000, CachedTokens: 11_264, PromptTokens: 12_000,
				TTFT: 250 * time.Millisecond, Sends: 1, Status: 200,
			}
			header := make([]byte, 0, 64)
			now := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			for i := range b.N {
				s := tr.Start(method, path, parent, state, now)
				header = s.AppendTraceparent(header[:0])
				s.End(attrs, now)
				if !bc.holding && (i%batchSize == batchSize-1 || i == b.N-1) {
					if err := tr.provider.ForceFlush(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
			if hold != nil {
				close(hold)
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				b.Fatal(err)
			}
			if exported := tr.exporter.exported.Load(); !bc.holding && exported != uint64(b.N) {
				b.Fatalf("%d of %d spans exported", exported, b.N)
			}
		})
	}
}

// cpuTime is the CPU time the process has used, in all its threads.
func cpuTime(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
