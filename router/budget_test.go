package router

import (
	"bufio"
	"crypto/sha256"
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

// A large body that is done with is kept for the next one, which is read
// into it: each replica still gets its own body, byte for byte, and the
// bodies after the first are not allocated again.
func TestLargeBodiesReuseTheirBuffers(t *testing.T) {
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		io.Copy(h, r.Body)
		if r.URL.Path == "/v1/models" {
			return
		}
		fmt.Fprintf(w, `{"sha256":"%x"}`, h.Sum(nil))
	})
	const kib = 1 << 10
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize, s.BodyBudget = 4<<20, 64<<20
	})
	bodies, wants := make([]string, 5), make([]string, 5)
	for i := range bodies {
		// Different contents, the later ones smaller, all over 64 KiB.
		bodies[i] = bodyOf(300*kib - i*kib)
		bodies[i] = strings.Replace(bodies[i], "xxxx", fmt.Sprintf("%04d", i), 1)
		wants[i] = fmt.Sprintf(`{"sha256":"%x"}`, sha256.Sum256([]byte(bodies[i])))
	}
	send := func(i int) {
		t.Helper()
		r := post(p, "/v1/chat/completions", bodies[i])
		if want := wants[i]; r.err != nil || r.status != 200 || r.body != want {
			t.Fatalf("body %d: %v %d %s, want %s", i, r.err, r.status, r.body, want)
		}
	}
	send(0)
	if p.h.budget.spare.held() == 0 {
		t.Fatal("the first large body's buffer was not kept")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i < len(bodies); i++ {
		send(i)
	}
	runtime.ReadMemStats(&after)
	d := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d KiB allocated for 4 bodies of 300 KiB", d/kib)
	if d > 2*300*kib {
		t.Errorf("%d KiB allocated for 4 bodies of 300 KiB, want under 600 KiB: they were not read into the kept buffer", d/kib)
	}

}

func TestSpareBodies(t *testing.T) {
	s := spareBodies{max: 1 << 20}
	big := func(n int) []byte { return make([]byte, n/2, n) }
	s.put(big(64 << 10)) // not large
	s.put(big(32 << 20)) // too large
	if s.held() != 0 {
		t.Fatalf("kept %d bytes of buffers it should not keep", s.held())
	}
	s.put(big(300 << 10))
	s.put(big(500 << 10))
	s.put(big(400 << 10)) // past max
	if s.held() != 800<<10 {
		t.Fatalf("kept %d bytes, want 800 KiB", s.held())
	}
	if b := s.get(600 << 10); b != nil {
		t.Fatalf("a %d-byte buffer for 600 KiB", cap(b))
	}
	// A small body does not take a far larger buffer, which the budget
	// would not count.
	if b := s.get(100 << 10); b != nil {
		t.Fatalf("a %d-byte buffer for 100 KiB", cap(b))
	}
	// The smallest that holds it.
	if b := s.get(250 << 10); cap(b) != 300<<10 || len(b) != 0 {
		t.Fatalf("got len %d cap %d, want the empty 300 KiB buffer", len(b), cap(b))
	}
	if b := s.get(260 << 10); cap(b) != 500<<10 {
		t.Fatalf("got cap %d, want the 500 KiB buffer", cap(b))
	}
	if s.held() != 0 || s.get(1) != nil {
		t.Fatalf("%d bytes held after both were taken", s.held())
	}
	s.put(big(300 << 10))
	s.drop()
	if s.held() != 0 || s.get(1) != nil {
		t.Fatal("drop kept a buffer")
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
	// The streamed request's handler returned before its first event was
	// relayed: its body's buffer is a spare one now.
	for p.h.budget.spare.held() == 0 {
		runtime.Gosched()
	}
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

// A request whose body the budget refuses, pipelined behind another,
// gets its 503 after that one's answer, which fasthttp's writer still
// holds: the lingering close waits for fasthttp to write and close (found
// by review: the 503, written straight to the connection, came first).
func TestOverBudgetAnswerAfterPipelinedOnes(t *testing.T) {
	for _, stream := range []bool{false, true} {
		answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		if stream {
			answer = oneChunk([]byte("data: a\n\n"))
		}
		replica := rawReplica(t, true, func() []byte { return answer })
		p := startProxy(t, RoundRobin, []string{replica}, func(u *upstream.Config, cfg *Config, s *ServerConfig) {
			throughFasthttp(u, cfg, s)
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
