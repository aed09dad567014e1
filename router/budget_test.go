package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// bodyOf returns a chat request body of exactly n bytes.
func bodyOf(n int) string {
	head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// Large bodies in flight are bounded in sum: past the budget a request gets
// 503 with Retry-After before its body is read, and the budget comes back
// when the requests holding it are done.
func TestBodyBudget(t *testing.T) {
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		if r.URL.Path == "/v1/models" {
			return
		}
		arrived <- struct{}{}
		<-release
		fmt.Fprint(w, "{}")
	})
	const mib = 1 << 20
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize, s.BodyBudget = 4*mib, 3*mib
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	body := bodyOf(mib)
	results := make(chan result, 6)
	for i := 0; i < 3; i++ {
		go func() { results <- post(p, "/v1/chat/completions", body) }()
	}
	for i := 0; i < 3; i++ { // three bodies, 3 MiB, are held
		<-arrived
	}
	if got := p.metric(t, "warmroute_request_body_bytes_held"); got != fmt.Sprint(3*mib) {
		t.Fatalf("bytes held = %s, want %d", got, 3*mib)
	}
	for i := 0; i < 3; i++ {
		r := post(p, "/v1/chat/completions", body)
		if r.status != 503 || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, `"type":"overloaded"`) {
			t.Fatalf("a body over the budget: %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	// Asking for 100 Continue, it gets the 503 instead of the 100.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", mib)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 503 {
		t.Fatalf("Expect over the budget: %v %v", resp, err)
	}
	// Small bodies are not counted.
	if r := post(p, "/v1/models", ""); r.status != 200 {
		t.Fatalf("a small request while the budget is spent: %d", r.status)
	}
	close(release)
	for i := 0; i < 3; i++ {
		if r := <-results; r.status != 200 {
			t.Fatalf("a request within the budget: %d %s", r.status, r.body)
		}
	}
	waitFor(t, "the budget to come back", func() bool { return p.metric(t, "warmroute_request_body_bytes_held") == "0" })
	go func() { <-arrived }()
	if r := post(p, "/v1/chat/completions", body); r.status != 200 {
		t.Fatalf("after the burst: %d %s", r.status, r.body)
	}
	if got := p.metric(t, "warmroute_requests_over_body_budget_total"); got != "4" {
		t.Errorf("requests over the budget = %s, want 4", got)
	}
	if n := a.requests.Load(); n != 5 {
		t.Errorf("the replica saw %d requests, want the 4 within the budget and /v1/models", n)
	}
}
