package router

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A stale keep-alive connection met by a body larger than the socket's
// buffers fails in the write, not in the wait for the answer: it is
// resent once on a fresh connection as the small one is, and blames
// nobody.
func TestStaleKeepAliveMetByALargeBody(t *testing.T) {
	var served atomic.Int64
	url := rawReplica(t, false, func() []byte {
		served.Add(1)
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, s *ServerConfig) {
		u.TrustIdle = time.Hour // the stale connections are met by requests, not by a peek
		s.MaxBodySize = 16 << 20
	})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 8<<20) + `"}]}`
	const n = 4
	for i := 0; i < n; i++ {
		if r := post(p, "/v1/chat/completions", body); r.status != 200 || r.body != "{}" {
			t.Fatalf("request %d: %d %q %v", i, r.status, r.body, r.err)
		}
	}
	if got := served.Load(); got != n {
		t.Fatalf("the replica served %d requests, want %d: each exactly once", got, n)
	}
	if r := p.set.Replica(0); r.State() != upstream.Live || r.Demotions() != 0 {
		t.Fatal("stale keep-alive connections demoted the replica")
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="not_sent"}`); got == "0" || got == "" {
		t.Fatalf("no stale connection was met (not_sent = %q): the test did not test the resend", got)
	}
	settled(t, p)
}
