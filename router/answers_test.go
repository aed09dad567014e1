package router

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Trailers of a chunked answer reach the client after the last chunk.
func TestTrailersAreRelayed(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n" +
			"6\r\ndata: \r\n3\r\nok\n\r\n0\r\nX-Checksum: abc123\r\n\r\n")
	})
	p := startProxy(t, Adaptive, []string{url})
	for i := 0; i < 2; i++ { // the second on a pooled connection: nothing of the first is left over
		resp, err := client.Post(p.url("/v1/chat/completions"), "application/json", strings.NewReader(chat(i, 1)))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "data: ok\n" {
			t.Fatalf("body %q %v", b, err)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "abc123" {
			t.Fatalf("trailer X-Checksum = %q, want abc123 (trailers %v)", got, resp.Trailer)
		}
	}
}

// Headers that a response's Connection header names are hop-by-hop, like
// the fixed list: they do not reach the client.
func TestResponseConnectionHeadersAreDropped(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, Adaptive, []string{url})
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.status != 200 || r.body != "{}" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	for k, want := range map[string]string{"X-Hop": "", "Keep-Alive": "", "X-Kept": "yes"} {
		if got := r.header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if c := r.header.Get("Connection"); strings.Contains(strings.ToLower(c), "x-hop") {
		t.Errorf("Connection %q reached the client", c)
	}
}

// Answers that once broke the relay: an SSE answer of Content-Length 0, a
// Connection header that names Content-Length, malformed trailers, and an
// HTTP/1.0 client of a chunked answer. Each is answered whole, at once, and
// the next request on the same client connection gets its own answer.
func TestAwkwardAnswers(t *testing.T) {
	for _, tt := range []struct {
		name, answer, body string
	}{
		{"empty SSE", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n", ""},
		{"Connection names Content-Length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: Content-Length, Transfer-Encoding\r\nContent-Length: 2\r\n\r\n{}", "{}"},
		{"malformed trailers", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\nContent-Length: 5\r\nBad Name: x\r\n\r\n", "ok\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := rawReplica(t, true, func() []byte { return []byte(tt.answer) })
			p := startProxy(t, Adaptive, []string{url})
			rc := dialRaw(t, p.addr)
			for i := 0; i < 2; i++ {
				start := time.Now()
				_, resp, body := rc.do(chat(i, 1))
				if resp.StatusCode != 200 || body != tt.body {
					t.Fatalf("request %d: %d %q, want 200 %q", i, resp.StatusCode, body, tt.body)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Fatalf("request %d took %v: the relay waited for bytes that were never due", i, d)
				}
			}
		})
	}
}

// An HTTP/1.0 client cannot read chunks: a chunked answer reaches it whole,
// framed by its length or by the end of the connection, never chunked.
func TestHTTP10ClientGetsNoChunks(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n6\r\ndata: \r\n3\r\nok\n\r\n0\r\nX-Sum: 1\r\n\r\n")
	})
	p := startProxy(t, Adaptive, []string{url})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := chat(1, 1)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	got := string(raw)
	if strings.Contains(strings.ToLower(got), "transfer-encoding") || !strings.HasSuffix(got, "\r\n\r\ndata: ok\n") {
		t.Fatalf("HTTP/1.0 answer:\n%s", got)
	}
}
