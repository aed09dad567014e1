package router

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A client's connection is served by fasthttp from one request to the
// next, whatever came before: these tests send a second request on the
// connection of each kind of answer, or pipeline it behind.

// A stream's connection serves the client's next request, whether it comes
// after the stream or was pipelined behind it.
func TestConnectionServesAgainAfterStreams(t *testing.T) {
	a := startReplica(t, "a", sse(3, nil))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		io.WriteString(c, streamRequest(""))
		readStream(t, br, 3)
	}
	c = dialProxy(t, p)
	br = bufio.NewReader(c)
	io.WriteString(c, streamRequest("")+streamRequest("")+streamRequest(""))
	for i := 0; i < 3; i++ {
		readStream(t, br, 3)
	}
	settled(t, p)
}

// A client that asks for its connection to close gets Connection: close on
// the stream's head, and the connection closes after the stream.
func TestStreamClosesWhenAsked(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, streamRequest("Connection: close\r\n"))
	if resp := readStream(t, br, 2); !resp.Close {
		t.Fatalf("head without Connection: close: %v", resp.Header)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
}

// A stream's connection then waits for its next request for IdleTimeout,
// and closes without a word when none comes.
func TestConnectionIdlesOutAfterAStream(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.IdleTimeout, s.ReadTimeout = 200*time.Millisecond, time.Minute
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, streamRequest(""))
	readStream(t, br, 2)
	start := time.Now()
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle connection after the stream: %q, %v; want it closed", b, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v, want about the idle timeout", d)
	}
}

// Trailers go only to the client of the answer that had them: the next
// answer on the same client connection, a stream that ends when its
// replica closes, comes with none.
func TestNoStaleTrailers(t *testing.T) {
	var n atomic.Int32
	url := rawReplica(t, false, func() []byte {
		if n.Add(1)%2 == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Secret\r\n\r\n" +
				"9\r\ndata: a\n\n\r\n0\r\nX-Secret: from-the-first\r\n\r\n")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: [DONE]\n\n")
	})
	p := startProxy(t, RoundRobin, []string{url})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	for i := 0; i < 6; i++ {
		io.WriteString(c, streamRequest(""))
		resp, got := readAnswer(t, br, "POST")
		secret := resp.Trailer.Get("X-Secret")
		if want := i%2 == 0; want != (secret == "from-the-first") || want != (got == "data: a\n\n") || resp.Header.Get("Trailer") != "" && !want {
			t.Fatalf("answer %d %q came with the trailer %q (Trailer: %q)", i, got, secret, resp.Header.Get("Trailer"))
		}
	}
}

// Every answer is framed so that the client's next request on the
// connection, pipelined behind it, is served: answers without a body (to a
// HEAD, whatever its replica's framing; 204; 304), answers of every
// framing, an HTTP/1.0 replica's, and one whose replica closes its own
// connection after it, which does not close the client's.
func TestEveryAnswerIsFramed(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1500) // 24000 bytes
	whole := `{"text":"` + big + `"}`               // a JSON answer that ends at close must be whole
	for _, tt := range []struct {
		name, method, answer string
		keepAlive            bool
		status               int
		body                 string
		length               int64 // the Content-Length a HEAD's answer gives
	}{
		{"HEAD unframed", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", true, 200, "", -1},
		{"HEAD chunked", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", true, 200, "", -1},
		{"HEAD sized", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1234\r\n\r\n", true, 200, "", 1234},
		{"204", "POST", "HTTP/1.1 204 No Content\r\n\r\n", true, 204, "", 0},
		{"204 with a length", "POST", "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", true, 204, "", 0},
		{"304 with a length", "POST", "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", true, 304, "", 0},
		{"304 chunked", "POST", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", true, 304, "", 0},
		{"length 0", "POST", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true, 200, "", 0},
		{"HTTP/1.0 replica", "POST", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", false, 200, "{}", 0},
		{"a reason of its own", "POST", "HTTP/1.1 400 Nope Nope\r\nContent-Length: 2\r\n\r\n{}", true, 400, "{}", 0},
		{"replica's Connection: close", "POST", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", false, 200, "{}", 0},
		{"sized", "POST", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24000\r\n\r\n" + big, true, 200, big, 0},
		{"past BufferLimit", "POST", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24000\r\n\r\n" + big, true, 200, big, 0},
		{"until the replica closes", "POST", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + whole, false, 200, whole, 0},
		{"text until the replica closes", "POST", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + big, false, 200, big, 0},
		{"chunked", "POST", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5dc0\r\n" + big + "\r\n0\r\n\r\n", true, 200, big, 0},
		{"a stream whose replica closes its connection", "POST", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n", false, 200, "data: a\n\n", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := rawReplica(t, tt.keepAlive, func() []byte {
				if n.Add(1) == 1 {
					return []byte(tt.answer)
				}
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			})
			p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				if tt.name == "past BufferLimit" {
					c.BufferLimit = 1000
				}
			})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			first := rawChat(chat(1, 1), "")
			if tt.method == "HEAD" {
				first = rawHead("")
			}
			io.WriteString(c, first+rawChat(chat(2, 1), ""))
			resp, got := readAnswer(t, br, tt.method)
			if resp.StatusCode != tt.status || got != tt.body || resp.Close {
				t.Fatalf("%d, %d bytes, close %v; want %d, %d bytes, the connection kept", resp.StatusCode, len(got), resp.Close, tt.status, len(tt.body))
			}
			if tt.method == "HEAD" && resp.ContentLength != tt.length {
				t.Fatalf("HEAD's Content-Length %d, want the replica's %d", resp.ContentLength, tt.length)
			}
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, got)
			}
			settled(t, p)
		})
	}
}

// An answer with both Content-Length and Transfer-Encoding: chunked is
// framed by its chunks (RFC 9112 6.3), and relayed without the
// Content-Length that contradicts them: a client that trusted the length
// would take the chunks' framing for body and misread the next answer on
// the connection, pipelined here behind it.
func TestLengthAndChunkedAnswerIsFramedByItsChunks(t *testing.T) {
	var n atomic.Int64
	url := rawReplica(t, true, func() []byte {
		if n.Add(1) == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n[{}]")
	})
	p := startProxy(t, RoundRobin, []string{url})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("head %q: %v", head.String(), err)
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	h := strings.ToLower(head.String())
	if !strings.HasPrefix(h, "http/1.1 200") || strings.Contains(h, "content-length:") || !strings.Contains(h, "transfer-encoding: chunked") {
		t.Fatalf("head %q: want a 200 framed by chunks alone", head.String())
	}
	// The head was read above; the body and the next answer are read
	// through one reader, behind a head that says what the client saw.
	rest := bufio.NewReader(io.MultiReader(strings.NewReader("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), br))
	if _, got := readAnswer(t, rest, "POST"); got != "{}" {
		t.Fatalf("body %q, want {}", got)
	}
	if resp, got := readAnswer(t, rest, "POST"); resp.StatusCode != 200 || got != "[{}]" {
		t.Fatalf("the next answer: %d %q", resp.StatusCode, got)
	}
	settled(t, p)
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

// The proxy's own answers are framed too, and keep the connection: a 502
// when the replica took the request and closed its connection, then a 503
// while that replica is demoted; and a 504 when a replica sent nothing in
// time. Each is a JSON error, none is sent twice, and the next request on
// the connection gets its own answer.
func TestProxyErrorsAreFramed(t *testing.T) {
	var n atomic.Int64
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		// Read whole: a close on unread bytes would be a reset, which
		// says that the request was never read.
		io.ReadAll(r.Body)
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.Cooldown, u.MaxCooldown = time.Hour, time.Hour
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	for _, want := range []struct {
		status int
		header string
	}{{502, "X-Warmroute-Replica"}, {503, "Retry-After"}} {
		io.WriteString(c, rawChat(chat(1, 1), ""))
		resp, got := readAnswer(t, br, "POST")
		if resp.StatusCode != want.status || !strings.Contains(got, `"type":`) || resp.Header.Get(want.header) == "" || resp.Close {
			t.Fatalf("%d %q %v (close %v); want a %d with a JSON error and %s, the connection kept", resp.StatusCode, got, resp.Header, resp.Close, want.status, want.header)
		}
	}
	if n.Load() != 1 {
		t.Fatalf("the replica had %d requests, want 1: none sent twice", n.Load())
	}

	var m atomic.Int64
	release := make(chan struct{})
	defer close(release)
	b := startReplica(t, "b", func(w http.ResponseWriter, r *http.Request) {
		if m.Add(1) == 1 {
			<-release
			return
		}
		chatReply("b")(w, r)
	})
	p = startProxy(t, RoundRobin, []string{b.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.FirstByteTimeout = 300 * time.Millisecond
	})
	c = dialProxy(t, p)
	br = bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 504 || !strings.Contains(got, `"type":`) || resp.Close {
		t.Fatalf("%d %q (close %v); want a 504, the connection kept", resp.StatusCode, got, resp.Close)
	}
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || !strings.Contains(got, `"replica":"b"`) {
		t.Fatalf("the next request: %d %q", resp.StatusCode, got)
	}
	if m.Load() != 2 {
		t.Fatalf("the replica had %d requests, want 2: none sent twice", m.Load())
	}
	settled(t, p)
}

// Trailers that are malformed (a field name with a space) or forbidden in
// a trailer (Content-Length) do not reach the client: the body ends
// cleanly without them, and the next request on the connection is served.
func TestMalformedTrailersAreNotRelayed(t *testing.T) {
	for _, trailer := range []string{"Content-Length: 5\r\n", "Bad Name: x\r\n"} {
		t.Run(trailer, func(t *testing.T) {
			url := rawReplica(t, true, func() []byte {
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n" + trailer + "\r\n")
			})
			p := startProxy(t, RoundRobin, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			for i := 0; i < 2; i++ {
				io.WriteString(c, rawChat(chat(i, 1), ""))
				var raw strings.Builder
				resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(br, &raw)), nil)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil || string(got) != "ok\n" {
					t.Fatalf("answer %d: %q, %v", i, got, err)
				}
				if strings.Contains(raw.String(), trailer) {
					t.Fatalf("answer %d relayed the trailer %q:\n%q", i, trailer, raw.String())
				}
			}
		})
	}
}

// A request that stalls in its head on a keep-alive connection is cut at
// the read timeout, not at the far longer idle timeout that the wait for
// it began under.
func TestSlowRequestStillTimesOut(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.ReadTimeout, s.IdleTimeout = 300*time.Millisecond, 20*time.Second
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	start := time.Now()
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("a request stalled in its head was never cut: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the stalled request was cut after %v, want about the read timeout (300ms)", d)
	}
}
