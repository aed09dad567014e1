package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/otlptest"
)

// bound is how long a test lets requests take before it calls them
// slowed. A request's span costs microseconds; a request that waited for
// a collector would wait for its timeouts, a minute here.
const bound = 10 * time.Second

// requests runs n requests' Start and End, failing the test unless they
// are all done within bound.
func requests(t *testing.T, tr *Tracer, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			s := tr.Start([]byte("POST"), []byte("/v1/chat/completions"), nil, nil, time.Now())
			s.AppendTraceparent(nil)
			s.End(Attrs{Sends: 1, Status: 200}, time.Now())
		}
	}()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%d requests not done in %v: a span waited for the collector", n, bound)
	}
}

func TestCollectorDownCostsRequestsNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	// Read only after Shutdown, which waits for the export goroutine
	// that writes it.
	var log bytes.Buffer
	tr, err := New("http://"+addr, Options{Logger: slog.New(slog.NewTextHandler(&log, nil)), queue: 16, batch: 4, export: time.Minute, send: time.Minute})
	if err != nil {
		t.Fatalf("New with a collector down: %v; want it to start", err)
	}
	const n = 1000
	requests(t, tr, n)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	exported, failed, ended := tr.exporter.exported.Load(), tr.exporter.failed.Load(), tr.ended.Load()
	if ended != n || exported != 0 || failed == 0 {
		t.Errorf("%d spans ended, %d exported, %d failed; want %d, 0, some", ended, exported, failed, n)
	}
	lines := log.String()
	if c := strings.Count(lines, "tracing: export failed"); c != 1 || !strings.Contains(lines, "connection refused") {
		t.Errorf("log has %d export failures, want 1 that says the connection was refused:\n%s", c, lines)
	}
	if !strings.Contains(lines, "tracing: stopped") || !strings.Contains(lines, "exported=0") {
		t.Errorf("log does not say at shutdown that nothing was exported:\n%s", lines)
	}
}

// A collector that takes an export and never answers holds one batch;
// the queue behind it fills, and the spans past it are dropped while the
// requests go on.
func TestHangingCollectorCostsRequestsNothing(t *testing.T) {
	hold := make(chan struct{})
	r := otlptest.New(t, hold)
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	t.Cleanup(release) // before the receiver's Close, which waits for its handlers
	const queue, batch = 16, 4
	tr, err := New(r.URL, Options{Logger: slog.New(slog.DiscardHandler), queue: queue, batch: batch, export: time.Minute, send: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		release() // first, so that a failed test stops at once
		tr.Shutdown(context.Background())
	}()

	requests(t, tr, batch) // a whole batch: exported at once
	select {
	case <-r.Arrived:
	case <-time.After(bound):
		t.Fatalf("no export in %v after a whole batch ended", bound)
	}
	const n = 1000
	requests(t, tr, n) // while the collector holds that export

	release()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := len(r.All())
	exported, failed := tr.exporter.exported.Load(), tr.exporter.failed.Load()
	if got != batch+queue || exported != uint64(got) || failed != 0 {
		t.Errorf("collector received %d spans, exporter counted %d exported and %d failed; want %d (the held batch and a full queue), %[1]d, 0",
			got, exported, failed, batch+queue)
	}
	if dropped := tr.ended.Load() - exported; dropped != n-queue {
		t.Errorf("%d spans dropped, want %d", dropped, n-queue)
	}
}
