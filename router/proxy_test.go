package router

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

func TestFreshRequestsAlternate(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	var got []string
	for i := 0; i < 4; i++ {
		r := post(p, "/v1/chat/completions", chat(i, 1))
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d: %v %d %s", i, r.err, r.status, r.body)
		}
		if r.route != "spread" {
			t.Errorf("request %d: route %q, want spread", i, r.route)
		}
		got = append(got, r.replica)
	}
	if got[0] == got[1] || got[0] != got[2] || got[1] != got[3] {
		t.Fatalf("fresh requests went to %v, want alternating", got)
	}
	if a.requests.Load() != 2 || b.requests.Load() != 2 {
		t.Fatalf("replicas saw %d and %d requests, want 2 and 2", a.requests.Load(), b.requests.Load())
	}
}

func TestContinuationsFollowTheirPrefix(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	const convs = 6
	where := map[int]string{}
	for c := 0; c < convs; c++ {
		r := post(p, "/v1/chat/completions", chat(c, 2))
		if r.status != 200 {
			t.Fatalf("turn 1 of %d: %d %v", c, r.status, r.err)
		}
		where[c] = r.replica
	}
	if where[0] == where[1] {
		t.Fatalf("the first turns did not spread: %v", where)
	}
	// Later turns, out of order and interleaved, from many goroutines.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for _, c := range []int{5, 2, 0, 3, 1, 4} {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for turn := 4; turn <= 10; turn += 2 {
				r := post(p, "/v1/chat/completions", chat(c, turn))
				mu.Lock()
				if r.status != 200 || r.replica != where[c] || r.route != "pinned" {
					errs = append(errs, fmt.Sprintf("conversation %d, %d messages: %d on %s (%s), want %s pinned", c, turn, r.status, r.replica, r.route, where[c]))
				}
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n"))
	}
	if p.h.Pins().Stats().Size < convs*4 {
		t.Fatalf("pin map holds %d entries, want at least %d", p.h.Pins().Stats().Size, convs*4)
	}
}

func TestMalformedJSONIsSpreadAndCounted(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	seen := map[string]bool{}
	for _, body := range []string{`{"messages":[`, `not json`, `{"messages":[{"role":"user","content":"\x"}]}`, `[1,2]`} {
		r := post(p, "/v1/chat/completions", body)
		if r.status != 200 || r.route != "spread" {
			t.Fatalf("malformed body %q: %d %s", body, r.status, r.route)
		}
		seen[r.replica] = true
	}
	if len(seen) != 2 {
		t.Errorf("malformed requests all went to %v", seen)
	}
	if got := p.metric(t, "warmroute_requests_malformed_total"); got != "4" {
		t.Errorf("malformed counter = %q, want 4", got)
	}
}

func TestBodyTooLarge(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize = 1000
	})
	r := post(p, "/v1/chat/completions", `{"messages":[{"role":"user","content":"`+strings.Repeat("x", 2000)+`"}]}`)
	if r.status != 413 || !strings.Contains(r.body, `"type":"request_too_large"`) {
		t.Fatalf("oversized body: %d %s", r.status, r.body)
	}
	if a.requests.Load() != 0 {
		t.Fatal("the oversized body reached the replica")
	}
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
		t.Fatalf("the proxy did not stay up: %d %v", r.status, r.err)
	}
}

func TestLocalHealth(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	resp, err := client.Get(p.url("/health"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", err, resp)
	}
	resp.Body.Close()
	if a.requests.Load() != 0 {
		t.Fatal("/health touched the replica")
	}
	p.set.Replica(0).Demote(fmt.Errorf("test"), time.Now())
	resp, err = client.Get(p.url("/health"))
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("health with no live replica: %v %v", err, resp)
	}
	resp.Body.Close()
}

func TestUnframedAndLargeBodies(t *testing.T) {
	big := strings.Repeat("0123456789", 300_000) // 3 MB: over the buffer limit
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			fmt.Fprint(w, big)
			return
		}
		// No Content-Length, no chunking: the body ends at close.
		conn, bw, _ := w.(http.Hijacker).Hijack()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close")
		bw.Flush()
		conn.Close()
	})
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.ForwardPaths = []string{"/big", "/eof"} })
	for path, want := range map[string]string{"/big": big, "/eof": "until close"} {
		resp, err := client.Get(p.url(path))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, err = b.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil || b.String() != want {
			t.Errorf("%s: %d bytes, err %v", path, b.Len(), err)
		}
	}
}

// A non-streamed body that arrives well after its head is waited for, not
// cut at the client-poll interval.
func TestSlowBodyAfterHead(t *testing.T) {
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "13")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(400 * time.Millisecond)
		fmt.Fprint(w, `{"late":true}`)
	})
	p := startProxy(t, Adaptive, []string{a.url()})
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 || r.body != `{"late":true}` {
		t.Fatalf("got %d %q", r.status, r.body)
	}
}

// A response head that arrives in pieces, the second well after the first,
// is waited for as well.
func TestSlowHead(t *testing.T) {
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		conn, bw, _ := w.(http.Hijacker).Hijack()
		defer conn.Close()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
		bw.Flush()
		time.Sleep(400 * time.Millisecond)
		bw.WriteString("Content-Length: 2\r\n\r\n{}")
		bw.Flush()
	})
	p := startProxy(t, Adaptive, []string{a.url()})
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 || r.body != "{}" {
		t.Fatalf("got %d %q", r.status, r.body)
	}
}
