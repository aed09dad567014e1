package router

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A request head whose lines end in a bare LF gets its 400 at once, not
// after -client-read-timeout (here longer than the test's own deadline),
// and never reaches a replica; a head that fasthttp reads whole, ended by
// CRLFCRLF, is served as before, on the same connection as the next.
func TestBareLFHeadGetsA400AtOnce(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.ReadTimeout = time.Minute
	})
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\nHost: x\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 2\n\n{}",
	} {
		c := dialProxy(t, p) // its deadline, 10 s, comes before the read timeout
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: no answer: %v", raw, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !resp.Close || !strings.Contains(string(body), "bare LF") {
			t.Errorf("%q: %d %s (close %v), want a 400 naming the bare LF, the connection closed", raw, resp.StatusCode, body, resp.Close)
		}
	}
	if n := a.requests.Load(); n != 0 {
		t.Errorf("the replica had %d requests", n)
	}
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /v1/models HTTP/1.1\nHost: x\r\n\r\n"+rawChat(chat(1, 1), ""))
	for _, method := range []string{"GET", "POST"} {
		if resp, body := readAnswer(t, br, method); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, body)
		}
	}
}
