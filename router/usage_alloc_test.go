//go:build !race

package router

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// The usage of every answer is counted, and counting it allocates nothing:
// fastReplica's completion and stream both report 96 prompt tokens, 80 of
// them cached.
func TestUsageCountedWithoutAllocating(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	url := fastReplica(t)
	set, err := upstream.NewSet([]string{url}, upstream.Config{Logger: log, HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pins := prefixcache.NewPinMap(1<<12, 1)
	m := NewMetrics(set, pins)
	h := New(Config{Policy: RoundRobin, Logger: log, ForwardPaths: []string{"/sse"}}, set, pins, m)
	ln := fasthttputil.NewInmemoryListener()
	scfg := ServerConfig{MaxBodySize: 1 << 20, ReadTimeout: time.Minute, IdleTimeout: time.Minute}
	go h.Server(scfg).Serve(ln)
	t.Cleanup(func() { ln.Close() })
	c := &fasthttp.HostClient{Addr: "proxy", Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConns: 64}
	sent := learnStreams(t, c, set)
	resp := fasthttp.AcquireResponse()
	for _, path := range []string{"/v1/chat/completions", "/sse"} {
		req := chatRequest(path)
		for i := 0; i < 100; i++ {
			doChat(t, c, req, resp)
		}
		if n := testing.AllocsPerRun(200, func() { doChat(t, c, req, resp) }); n != 0 {
			t.Errorf("%s: %.1f allocations per request, want 0", path, n)
		}
		sent += 100 + 201 // AllocsPerRun runs once more to warm up
	}
	// The last stream is counted when fasthttp closes it, after the
	// client has its last byte.
	want := uint64(sent * 96)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		prompt, cached := m.replicaTokens(0)
		if prompt == want && cached == uint64(sent*80) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompt tokens %d, cached %d; want %d, %d after %d requests", prompt, cached, want, sent*80, sent)
		}
	}
}
