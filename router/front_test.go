package router

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// rawRoundTrip writes raw on a new connection and reads one response.
func rawRoundTrip(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The front door refuses what a reverse proxy must not pass on, each with
// an OpenAI-style JSON error, and the replica sees none of it; an
// absolute-form target reaches the replica as a path, its host dropped.
func TestStrictFront(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize = 1000
	})
	for _, tt := range []struct {
		name, raw string
		status    int
		typ       string
	}{
		{"CONNECT", "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n", 405, "method_not_allowed"},
		{"HTTP/9.9", "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
		{"HTTP/2.0 over HTTP/1 framing", "GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
		{"header name with spaces", "GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header Name: v\r\n\r\n", 400, "invalid_request_error"},
		{"header name with a slash", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX/Y: v\r\n\r\n", 400, "invalid_request_error"},
		{"authority-form target", "GET example.com:80 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request_error"},
		{"Expect with a body over the limit", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n", 413, "request_too_large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := rawRoundTrip(t, p.addr, tt.raw)
			if resp.StatusCode != tt.status || !strings.Contains(body, `"type":"`+tt.typ+`"`) {
				t.Fatalf("got %d %s, want %d with type %s", resp.StatusCode, body, tt.status, tt.typ)
			}
		})
	}
	if n := a.requests.Load(); n != 0 {
		t.Fatalf("the replica saw %d of the refused requests", n)
	}
	resp, body := rawRoundTrip(t, p.addr, "GET http://evil.example/v1/models?x=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	if resp.StatusCode != 200 || resp.Header.Get("X-Replica-Saw-Path") != "/v1/models?x=1" || resp.Header.Get("X-Replica-Saw-Host") != a.addr {
		t.Fatalf("absolute-form: %d, replica saw path %q host %q: %s", resp.StatusCode, resp.Header.Get("X-Replica-Saw-Path"), resp.Header.Get("X-Replica-Saw-Host"), body)
	}
	// Expect: 100-continue within the limit still gets its 100 and an answer.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("no 100 Continue: %q", line)
	}
	br.ReadString('\n')
	io.WriteString(c, "{}")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after 100 Continue: %v %v", resp, err)
	}
}

// A client that never reads a stream is cut after the write timeout, and
// its replica connection is closed with it: the replica stops generating
// and the in-flight count comes back.
func TestClientThatStopsReadingIsCut(t *testing.T) {
	closed := make(chan time.Time, 1)
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		event := "data: " + strings.Repeat("x", 1024) + "\n\n"
		deadline := time.Now().Add(20 * time.Second) // bounded, whatever the proxy does
		for time.Now().Before(deadline) {
			if _, err := io.WriteString(w, event); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			if r.Context().Err() != nil {
				break
			}
		}
		closed <- time.Now()
	})
	const writeTimeout = 300 * time.Millisecond
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.WriteTimeout = writeTimeout
	})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := chat(1, 1)
	start := time.Now()
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	// The client reads nothing from here on.
	select {
	case at := <-closed:
		t.Logf("the replica saw its connection closed %v after the request", at.Sub(start))
	case <-time.After(15 * time.Second):
		t.Fatal("the replica kept streaming to a client that reads nothing")
	}
	waitFor(t, "in-flight count back to 0", func() bool { return p.set.Replica(0).InFlight() == 0 })
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`); got != "1" {
		t.Errorf("client_gone sends = %q, want 1", got)
	}
}

// A stream that flows for longer than the write timeout is not cut: the
// timeout bounds each write, not the whole answer.
func TestLongStreamOutlivesTheWriteTimeout(t *testing.T) {
	a := startReplica(t, "a", sse(12, func(int) { time.Sleep(50 * time.Millisecond) }))
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.WriteTimeout = 200 * time.Millisecond
	})
	start := time.Now()
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.err != nil || r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("%v %d %q", r.err, r.status, r.body)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("the stream took %v: shorter than two write timeouts, so it tested nothing", d)
	}
}

// Profiles are served on the admin listener only with -pprof; /health there
// says 503 once the proxy drains.
func TestAdminExposure(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	for _, withPprof := range []bool{false, true} {
		srv := httptest.NewServer(p.h.Admin(withPprof))
		resp, err := http.Get(srv.URL + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{false: 404, true: 200}[withPprof]; resp.StatusCode != want {
			t.Errorf("pprof=%v: /debug/pprof/ answered %d, want %d", withPprof, resp.StatusCode, want)
		}
		srv.Close()
	}
	srv := httptest.NewServer(p.h.Admin(false))
	defer srv.Close()
	p.h.Drain()
	for _, url := range []string{srv.URL + "/health", p.url("/health")} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(b) != `{"status":"draining"}` {
			t.Errorf("%s while draining: %d %s", url, resp.StatusCode, b)
		}
	}
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
		t.Errorf("a request while draining: %d, want it served", r.status)
	}
}

// With API keys set, a request needs one of them, as a bearer token or an
// X-Api-Key header; /health does not. The Authorization header reaches
// the replica unless it is stripped.
func TestAPIKeys(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("strip=%v", strip), func(t *testing.T) {
			a := startReplica(t, "a", nil)
			p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				c.StripAuthorization = strip
			})
			p.h.SetKeys([][]byte{[]byte("sk-one"), []byte("sk-two-longer")})
			for _, tt := range []struct {
				hdr    []string
				status int
			}{
				{nil, 401},
				{[]string{"Authorization", "Bearer sk-wrong"}, 401},
				{[]string{"Authorization", "Bearer sk-on"}, 401},
				{[]string{"Authorization", "sk-one"}, 401},
				{[]string{"Authorization", "Bearer sk-one"}, 200},
				{[]string{"Authorization", "bearer sk-two-longer"}, 200},
				{[]string{"X-Api-Key", "sk-two-longer"}, 200},
			} {
				r := post(p, "/v1/chat/completions", chat(1, 1), tt.hdr...)
				if r.status != tt.status {
					t.Errorf("%q: %d, want %d", tt.hdr, r.status, tt.status)
				}
				if r.status == 401 && (!strings.Contains(r.body, `"type":"invalid_api_key"`) || r.header.Get("WWW-Authenticate") == "") {
					t.Errorf("%q: 401 without a JSON error or WWW-Authenticate: %s", tt.hdr, r.body)
				}
				if r.status == 200 && tt.hdr[0] == "Authorization" {
					if saw := r.header.Get("X-Replica-Saw-Auth"); (saw == "") != strip {
						t.Errorf("strip=%v: the replica saw Authorization %q", strip, saw)
					}
				}
			}
			if a.requests.Load() != 3 {
				t.Errorf("the replica saw %d requests, want the 3 with a key", a.requests.Load())
			}
			resp, err := http.Get(p.url("/health"))
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("/health with keys set: %v %v", resp, err)
			}
			resp.Body.Close()
			p.h.SetKeys(nil)
			if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
				t.Errorf("with the keys removed: %d", r.status)
			}
		})
	}
}

// The access log writes one line per request with what an operator needs;
// off, it writes none.
func TestAccessLog(t *testing.T) {
	for _, on := range []bool{false, true} {
		a := startReplica(t, "a", sse(2, nil))
		p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
			c.AccessLog = on
		})
		body := `{"stream":true,"model":"qwen-32b","messages":[{"role":"user","content":"hi"}]}`
		r := post(p, "/v1/chat/completions", body)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		waitFor(t, "the request to be counted", func() bool { return p.metric(t, "warmroute_request_duration_seconds_count") == "1" })
		n := p.logs.count("request")
		if !on {
			if n != 0 {
				t.Fatalf("access log off, %d lines", n)
			}
			continue
		}
		line := p.logs.String()
		for _, want := range []string{"msg=request ", "method=POST", "path=/v1/chat/completions", "model=qwen-32b", "replica=" + a.addr, "route=spread", "status=200", "ttfb=", "duration=", fmt.Sprintf("bytes=%d", len(r.body))} {
			if !strings.Contains(line, want) {
				t.Errorf("access log line lacks %q:\n%s", want, line)
			}
		}
	}
}

func TestModelOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m1","messages":[]}`:    "m1",
		`{"messages":[], "model" : "m2"}`: "m2",
		`{"model":"a\"b"}`:                "",
		`{"model":7}`:                     "",
		`{"messages":[]}`:                 "",
	} {
		if got := string(modelOf([]byte(body))); got != want {
			t.Errorf("modelOf(%s) = %q, want %q", body, got, want)
		}
	}
}

// Requests that carry one session id go to one replica, whatever their
// messages; without it, fresh requests spread.
func TestSessionHeader(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.SessionHeader = "X-Session-ID"
	})
	first := post(p, "/v1/chat/completions", chat(100, 1), "X-Session-ID", "agent-7")
	for i := 0; i < 6; i++ {
		r := post(p, "/v1/chat/completions", chat(i, 1), "X-Session-ID", "agent-7")
		if r.status != 200 || r.replica != first.replica || r.route != "session" {
			t.Fatalf("request %d of the session: %d on %s (%s), want %s", i, r.status, r.replica, r.route, first.replica)
		}
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		seen[post(p, "/v1/chat/completions", chat(10+i, 1)).replica] = true
	}
	if len(seen) != 2 {
		t.Fatalf("without a session, fresh requests went to %v", seen)
	}
}

// Anthropic Messages requests (/v1/messages, as Claude Code sends them with
// ?beta=true) are chained like chat: the next turn lands on the replica of
// the one before.
func TestAnthropicMessagesArePinned(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	turn := func(conv, n int) string {
		var msgs []string
		for i := 0; i < n; i++ {
			role := []string{"user", "assistant"}[i%2]
			msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":[{"type":"text","text":"conversation %d turn %d"}]}`, role, conv, i))
		}
		return `{"model":"claude","system":"be brief","max_tokens":8,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	where := map[int]string{}
	for c := 0; c < 2; c++ {
		where[c] = post(p, "/v1/messages?beta=true", turn(c, 1)).replica
	}
	if where[0] == where[1] {
		t.Fatalf("two new conversations on one replica: %v", where)
	}
	for n := 3; n <= 7; n += 2 {
		for c := 0; c < 2; c++ {
			if r := post(p, "/v1/messages?beta=true", turn(c, n)); r.status != 200 || r.replica != where[c] || r.route != "pinned" {
				t.Fatalf("conversation %d, %d messages: %d on %s (%s), want %s pinned", c, n, r.status, r.replica, r.route, where[c])
			}
		}
	}
}

// stringOf never panics and returns a plain run of the body, or nothing.
func FuzzStringOf(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, `{"id" : "x\"y"}`, `{"id":`, `"id"`, `{"previous_response_id":"r","id":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, key := range [][]byte{strIDKey, strPrevKey, strModelKey} {
			v := stringOf(body, key)
			if len(v) > 0 && (!bytes.Contains(body, v) || bytes.ContainsAny(v, "\"\\\\")) {
				t.Fatalf("stringOf(%q, %s) = %q", body, key, v)
			}
		}
	})
}
