//go:build !race

package router

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

func TestPickAllocatesNothing(t *testing.T) {
	body := workload.Conversation(1, 40, 360_000)
	pins := prefixcache.NewPinMap(1<<12, 4)
	held := prefixcache.NewHoldings(4, 1<<20)
	var counter atomic.Uint64
	var c prefixcache.Chains
	if err := c.Read(body, prefixcache.DefaultPromptChunk); err != nil {
		t.Fatal(err)
	}
	pins.Put(c.Messages[30], 2)
	held.Insert(3, c.Blocks[:len(c.Blocks)*9/10], 0) // more than the pin: a move pays
	var loads Loads
	for _, p := range []struct {
		policy Policy
		want   int
	}{{Adaptive, 2}, {Cost, 3}} {
		n := testing.AllocsPerRun(50, func() {
			if err := c.Read(body, prefixcache.DefaultPromptChunk); err != nil {
				t.Fatal(err)
			}
			req := Request{Chain: c.Messages, Blocks: c.Blocks, Held: held, Load: &loads, Size: ChainSize(c.Blocks, len(body)), Avail: upstream.Mask{0b1111}}
			if r, reason := Pick(p.policy, req, pins, &counter); r != p.want || reason != Pinned && reason != Balanced {
				t.Fatalf("%v: Pick = %d %v, want %d", p.policy, r, reason, p.want)
			}
		})
		if n != 0 {
			t.Fatalf("%v: canonicalize+hash+pick allocates %.1f times per request, want 0", p.policy, n)
		}
	}
}

// A whole proxied request, through the real handler and a real pooled
// connection to a replica, allocates nothing in steady state: a chat
// completion read whole, and an SSE answer relayed as a stream. The test
// client and the replica allocate nothing themselves, so what is counted is
// the proxy's.
func TestProxiedRequestAllocatesNothing(t *testing.T) {
	replicas := []string{fastReplica(t), fastReplica(t)}
	for _, cfg := range []struct {
		name string
		cfg  Config
		hdr  []string
	}{
		{"adaptive", Config{Policy: Adaptive}, nil},
		{"cost", Config{Policy: Cost}, nil},
		// The same request again (its newest link pinned here) asks the
		// store nothing.
		{"rendezvous and a pin store", Config{Policy: Adaptive, Rendezvous: true, PinStore: openStore(t)}, nil},
		// A Claude Code subagent's request: every default header looked
		// up, two found and hashed.
		{"cost with the agents' session headers", Config{Policy: Cost, SessionHeaders: DefaultSessionHeaders},
			[]string{"X-Claude-Code-Session-Id", "9f1c2a7e-5d4b-4c3a-8e2f-1a2b3c4d5e6f", "X-Claude-Code-Agent-Id", "a7"}},
	} {
		c := inmemoryProxyWith(t, cfg.cfg, replicas...)
		for _, path := range []string{"/v1/chat/completions", "/sse"} {
			req, resp := chatRequest(path), fasthttp.AcquireResponse()
			for i := 0; i+1 < len(cfg.hdr); i += 2 {
				req.Header.Set(cfg.hdr[i], cfg.hdr[i+1])
			}
			for i := 0; i < 200; i++ { // warm the pools and the connections
				doChat(t, c, req, resp)
			}
			if n := testing.AllocsPerRun(500, func() { doChat(t, c, req, resp) }); n != 0 {
				t.Errorf("%s, %s: %.1f allocations per proxied request, want 0", cfg.name, path, n)
			}
		}
	}
}

// The usage of every answer is counted, and counting it allocates nothing:
// fastReplica's completion and stream both report 96 prompt tokens, 80 of
// them cached.
func TestUsageCountedWithoutAllocating(t *testing.T) {
	c, h, sent := inmemoryHandler(t, Config{Policy: RoundRobin}, benchTLS{}, fastReplica(t))
	m := h.m
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

// TestWaitingRequestsHoldNoLoadTable holds 40 requests at their replica
// under the cost policy, which reads the load table: a table is taken for
// the pick alone, so the requests that wait made a few, not one each
// (10 KiB a request in flight).
//
// Under the race detector sync.Pool drops a quarter of what is put back,
// so the count of tables made says nothing there.
func TestWaitingRequestsHoldNoLoadTable(t *testing.T) {
	var made atomic.Int64
	was := loadsPool.New
	loadsPool.New = func() any { made.Add(1); return new(Loads) }
	t.Cleanup(func() { loadsPool.New = was })
	const n = 40
	arrived, release := make(chan struct{}, n), make(chan struct{})
	hold := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-release
		w.Write([]byte(`{"id":"x"}`))
	}
	a, b := startReplica(t, "a", hold), startReplica(t, "b", hold)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the replicas close, which waits for their handlers
	p := startProxy(t, Cost, []string{a.url(), b.url()})
	done := make(chan result, n)
	for i := range n {
		go func() { done <- post(p, "/v1/chat/completions", chat(i, 2)) }()
	}
	for range n {
		<-arrived
	}
	if m := made.Load(); m > n/4 {
		t.Errorf("%d load tables made for %d requests waiting at once; want a few, taken for the pick alone", m, n)
	}
	free()
	for range n {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request: status %d, %v", r.status, r.err)
		}
	}
}
