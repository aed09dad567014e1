package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
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

// A streamed answer outlives its request's body, whose buffer the next
// large body is read into: the stream's access log line still names its
// own model.
func TestStreamOutlivesItsBodyBuffer(t *testing.T) {
	firstSent := make(chan struct{})
	finish := make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/models" {
			return
		}
		if r.URL.RawQuery != "stream" {
			fmt.Fprint(w, "{}")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		close(firstSent)
		<-finish
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, s *ServerConfig) {
		s.MaxBodySize, s.BodyBudget = 4<<20, 64<<20
		c.AccessLog = true
	})
	withModel := func(model string) string {
		return strings.Replace(bodyOf(300<<10), `"model":"m"`, `"model":"`+model+`"`, 1)
	}
	streamed := make(chan result, 1)
	go func() { streamed <- post(p, "/v1/chat/completions?stream", withModel("streamed-model")) }()
	<-firstSent
	if r := post(p, "/v1/chat/completions", withModel("second-model-xx")); r.err != nil || r.status != 200 {
		t.Fatalf("second: %v %d %s", r.err, r.status, r.body)
	}
	close(finish)
	if r := <-streamed; r.err != nil || r.status != 200 {
		t.Fatalf("streamed: %v %d %s", r.err, r.status, r.body)
	}
	for p.logs.count("request") < 2 { // the stream's line is written as it ends
		runtime.Gosched()
	}
	logs := p.logs.String()
	if !strings.Contains(logs, "model=streamed-model ") || strings.Count(logs, "model=second-model-xx ") != 1 {
		t.Errorf("the stream's access log line does not name its own model:\n%s", logs)
	}
}

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

// A request whose body the budget refuses, pipelined behind another,
// gets its 503 after that one's answer, which fasthttp's writer still
// holds: the lingering close waits for fasthttp to write and close (the
// 503, written straight to the connection, must not come first).
func TestOverBudgetAnswerAfterPipelinedOnes(t *testing.T) {
	for _, stream := range []bool{false, true} {
		answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		if stream {
			answer = oneChunk([]byte("data: a\n\n"))
		}
		replica := rawReplica(t, true, func() []byte { return answer })
		p := startProxy(t, RoundRobin, []string{replica}, func(u *upstream.Config, cfg *Config, s *ServerConfig) {
			s.MaxBodySize, s.BodyBudget = 4<<20, 100<<10
		})
		c := dialProxy(t, p)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		first := rawChat("hello", "")
		if stream {
			first = streamRequest("")
		}
		go io.WriteString(c, first+rawChat(strings.Repeat("x", 200<<10), ""))
		br := bufio.NewReader(c)
		for i, want := range []int{200, 503} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("stream %v, answer %d: %v", stream, i, err)
			}
			if _, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != want {
				t.Fatalf("stream %v, answer %d: %d, %v; want %d", stream, i, resp.StatusCode, err, want)
			}
		}
	}
}
