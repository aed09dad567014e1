package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// waitKV waits until the proxy read replica i's KV capacity.
func waitKV(t *testing.T, p *proxy, i int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for p.set.Replica(i).KVTokens() == 0 {
		select {
		case <-deadline:
			t.Fatal("the replica's KV capacity was never read")
		default:
			runtime.Gosched()
		}
	}
}

func heldStatus(t *testing.T, p *proxy) []replicaStatus {
	t.Helper()
	rec := httptest.NewRecorder()
	p.h.Admin(false).ServeHTTP(rec, httptest.NewRequest("GET", "/replicas", nil))
	var status struct {
		Replicas []replicaStatus `json:"replicas"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &status); err != nil {
		t.Fatal(err)
	}
	return status.Replicas
}

// docChat is a one-message chat request: a long shared document, then a
// question.
func docChat(doc, question string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + doc + `\n\n` + question + `"}]}`
}

// A document shared inside one message finds the replica that prefilled
// it, which /replicas shows holding it; a replica that reports far less
// cached than that has its belief corrected, and its KV capacity, read
// from its metrics page, bounds what it is believed to hold.
func TestHeldFollowsTheReplica(t *testing.T) {
	doc := strings.Repeat("A long reference document, shared by every question. ", 200) // 10.8 KB
	var honest atomic.Bool
	honest.Store(true)
	cached := func(prompt int) int {
		if honest.Load() {
			return prompt * 9 / 10
		}
		return 0 // its cache was flushed
	}
	urls := []string{cacheReplica(t, "a", 1000, cached), cacheReplica(t, "b", 1000, cached)}
	p := startProxy(t, Cost, urls)
	waitKV(t, p, 0)
	waitKV(t, p, 1)
	first := post(p, "/v1/chat/completions", docChat(doc, "What is the first point?"))
	if first.err != nil || first.status != 200 {
		t.Fatalf("first: %v %d %s", first.err, first.status, first.body)
	}
	home := first.replica
	rows := heldStatus(t, p)
	for i, row := range rows {
		if row.KVTokens != 16000 || row.HeldLimitBytes != 16000*bytesPerToken*heldLifetimes {
			t.Fatalf("replica %s: capacity %d tokens, bound %d bytes; want 16000 and %d", row.Name, row.KVTokens, row.HeldLimitBytes, 16000*bytesPerToken*heldLifetimes)
		}
		if held := row.Held.Bytes; (row.Name == home) != (held > int64(len(doc))) {
			t.Fatalf("replica %d (%s; served the first: %s) holds %d bytes", i, row.Name, home, held)
		}
	}
	for q := range 4 {
		r := post(p, "/v1/chat/completions", docChat(doc, fmt.Sprintf("And question %d?", q)))
		if r.err != nil || r.status != 200 || r.replica != home || r.route != "pinned" {
			t.Fatalf("question %d went to %s (%s), want the document's replica %s: %v %d", q, r.replica, r.route, home, r.err, r.status)
		}
	}
	if v := p.metric(t, `warmroute_held_links_forgotten_total`); v != "0" {
		t.Fatalf("forgot %s links while the replica reported what was predicted", v)
	}
	// The replica loses its cache: the next question, sent there on the
	// proxy's belief, finds nothing cached, and the belief is corrected.
	honest.Store(false)
	r := post(p, "/v1/chat/completions", docChat(doc, "One more?"))
	if r.err != nil || r.status != 200 || r.replica != home {
		t.Fatalf("after the flush: %s, %v %d", r.replica, r.err, r.status)
	}
	if v := p.metric(t, `warmroute_held_links_forgotten_total`); v == "0" || v == "" {
		t.Fatalf("forgot %q links after the replica reported nothing cached", v)
	}
	// What it forgot was what the others sent: the questions but the last.
	var c prefixcache.Chains
	if err := c.Read([]byte(docChat(doc, "And question 0?")), prefixcache.DefaultPromptChunk); err != nil {
		t.Fatal(err)
	}
	idx := 0
	if home == rows[1].Name {
		idx = 1
	}
	if _, n := p.h.held.Longest(idx, c.Blocks); n == len(c.Blocks) {
		t.Fatal("an earlier question is still believed held after the flush")
	}
}

// A replica that publishes no capacity is bounded by Config.KVTokens: it
// is never believed to hold more than heldLifetimes times it.
func TestHeldBoundedByTheFlag(t *testing.T) {
	none := func(int) int { return 0 }
	urls := []string{cacheReplica(t, "a", 0, none)}
	const kv = 1000 // tokens
	const bound = kv * bytesPerToken * heldLifetimes
	p := startProxy(t, Cost, urls, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.KVTokens = kv })
	doc := strings.Repeat("x", bound*3/2)
	for q := range 3 {
		if r := post(p, "/v1/chat/completions", docChat(doc, fmt.Sprint(q))); r.err != nil || r.status != 200 {
			t.Fatalf("%v %d", r.err, r.status)
		}
	}
	row := heldStatus(t, p)[0]
	if row.KVTokens != 0 || row.HeldLimitBytes != bound {
		t.Fatalf("capacity %d tokens, bound %d bytes; want none published and %d for the flag's", row.KVTokens, row.HeldLimitBytes, bound)
	}
	if row.Held.Bytes <= 0 || row.Held.Bytes > bound || row.Held.Evictions == 0 {
		t.Fatalf("holds %d bytes with %d evictions, bound %d", row.Held.Bytes, row.Held.Evictions, bound)
	}
}

// A prompt that its replica refused (a 400: too long for its context) is
// not believed held there.
func TestHeldNotForARefusal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/chat/completions":
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"the prompt is longer than the context"}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	p := startProxy(t, Cost, []string{srv.URL})
	if r := post(p, "/v1/chat/completions", docChat(strings.Repeat("y", 5000), "?")); r.err != nil || r.status != 400 {
		t.Fatalf("%v %d", r.err, r.status)
	}
	if row := heldStatus(t, p)[0]; row.Held.Bytes != 0 || row.Held.Links != 0 {
		t.Fatalf("a refused prompt is held: %+v", row.Held)
	}
}
