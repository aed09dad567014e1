package router

import (
	"net/http"
	"sync/atomic"
	"testing"
)

// When every replica answers 429 with a Retry-After, the client gets a
// replica's own 429 and its Retry-After, never the proxy's 503 "no live
// replica": each request goes to at most MaxSends replicas, also once all
// of them asked to be left alone (a skip is a back-off, not a demotion).
func TestEveryReplicaRejects(t *testing.T) {
	var sends atomic.Int64
	reject := func(w http.ResponseWriter, r *http.Request) {
		sends.Add(1)
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		w.Write([]byte(`{"error":"slow down"}`))
	}
	a, b, c := startReplica(t, "a", reject), startReplica(t, "b", reject), startReplica(t, "c", reject)
	p := startProxy(t, RoundRobin, []string{a.url(), b.url(), c.url()})
	for i := 0; i < 4; i++ {
		before := sends.Load()
		r := post(p, "/v1/chat/completions", chat(i, 1))
		if r.err != nil || r.status != 429 || r.body != `{"error":"slow down"}` || r.header.Get("Retry-After") != "7" {
			t.Fatalf("request %d: %d %q Retry-After %q %v; want the replica's 429", i, r.status, r.body, r.header.Get("Retry-After"), r.err)
		}
		if n := sends.Load() - before; n < 1 || n > 2 {
			t.Fatalf("request %d went to %d replicas, want 1 or 2 (MaxSends 2)", i, n)
		}
	}
	settled(t, p)
}
