package router

import (
	"bufio"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A large request's body is given back once the request was sent
// (dropBody): a stream that goes on for minutes after it must not keep
// the body's memory alive, uncounted by the body budget, which released
// it. Here six streams stay open after bodies of 8 MiB each, 48 MiB in
// all against a budget of 24 MiB.
func TestStreamHoldsNoRequestBody(t *testing.T) {
	const streams, size = 6, 8 << 20
	started := make(chan struct{}, streams)
	finish := make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		started <- struct{}{}
		select {
		case <-finish:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	defer close(finish)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize, s.BodyBudget = 16<<20, 24<<20
	})
	req := rawChat(`{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("x", size)+`"}]}`, "")
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < streams; i++ {
		c := dialProxy(t, p)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %v %v", i, resp, err)
		}
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d did not reach the replica", i)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > streams*size/2 {
		t.Fatalf("the heap grew by %d MiB with %d streams open after their %d MiB bodies: the bodies are still held", grown>>20, streams, size>>20)
	}
}
