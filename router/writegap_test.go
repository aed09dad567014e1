package router

import (
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A stream whose replica is silent for longer than the write timeout, and
// less than the stream idle timeout (a long prefill after the head, which
// vLLM sends first), is not cut when its next event comes: the write
// timeout bounds a write to a client that stopped reading, not the
// replica's silence.
func TestStreamSilentPastTheWriteTimeout(t *testing.T) {
	const gap = 600 * time.Millisecond // the replica's silence, three write timeouts
	a := startReplica(t, "a", sse(3, func(i int) {
		if i == 1 {
			time.Sleep(gap) // the replica's behaviour under test, not a synchronisation
		}
	}))
	p := startProxy(t, Adaptive, []string{a.url()}, func(u *upstream.Config, _ *Config, s *ServerConfig) {
		s.WriteTimeout = 200 * time.Millisecond
		u.StreamIdleTimeout = 5 * time.Second
	})
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.err != nil || r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("%v %d %q: the stream was cut after the replica's silence", r.err, r.status, r.body)
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`); got != "" && got != "0" {
		t.Fatalf("client_gone sends = %q: a client that read was taken for one that stopped", got)
	}
}
