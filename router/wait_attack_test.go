package router

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// Attacks on the relayed wait (RelayWaitingAbove 0, the harness's default):
// every request below waits for its first byte on a relay.

// settled checks that nothing of p's requests is left counted once the
// client connections are closed: no wait, no stream, nothing in flight or
// queued on a replica, and no connection held by a relay.
func settled(t *testing.T, p *proxy) {
	t.Helper()
	waitFor(t, "every count back to 0", func() bool {
		if p.h.waiting.Load() != 0 || p.h.streams.Load() != 0 || p.h.relays.n.Load() != 0 {
			return false
		}
		for _, r := range p.set.Replicas() {
			if r.InFlight() != 0 {
				return false
			}
			if w, q := r.Waiting(); w != 0 || q != 0 {
				return false
			}
		}
		return true
	})
}

// writeRequest writes a HEAD request, or for any other method a chat
// completion's POST, on c.
func writeRequest(c net.Conn, method string) {
	if method == "HEAD" {
		io.WriteString(c, "HEAD /v1/models/m HTTP/1.1\r\nHost: p\r\n\r\n")
	} else {
		io.WriteString(c, rawChat(chat(1, 1), ""))
	}
}

// onConns posts reqs chat bodies, body(g, i), on each of conns connections
// to p at once, checks each answer with check, and fails t with the first
// error.
func onConns(t *testing.T, p *proxy, conns, reqs int, body func(g, i int) string, check func(g, i int, body string, status int, got []byte) error) {
	t.Helper()
	errs := make(chan error, conns)
	for g := 0; g < conns; g++ {
		go func(g int) {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(c)
			for i := 0; i < reqs; i++ {
				b := body(g, i)
				io.WriteString(c, rawChat(b, ""))
				resp, err := http.ReadResponse(br, nil)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
				}
				if err == nil {
					err = check(g, i, b, resp.StatusCode, got)
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d, request %d: %w", g, i, err)
					return
				}
			}
			errs <- nil
		}(g)
	}
	for g := 0; g < conns; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// readAnswer reads one answer from br, its body whole.
func readAnswer(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a %d answer's body: %q %v", resp.StatusCode, b, err)
	}
	return resp, string(b)
}

// bodyDigest answers with the sha256 of the request's body and the Host it
// was sent to.
func bodyDigest(name string, sends *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sends.Add(1)
		sum := sha256.Sum256(b)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Replica-Saw-Host", r.Host)
		fmt.Fprintf(w, `{"replica":%q,"sha":%q,"len":%d}`, name, hex.EncodeToString(sum[:]), len(b))
	}
}

func digestOf(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

// A relayed wait that fails over twice on the relay: the first replica
// answers 503, the next one's listener is gone (a dial failure, no send),
// and the third answers. The body, larger than a kept body is pooled, and
// the Host spliced for the replica reach the third whole; every count
// comes back.
func TestAttackRelayFailsOverPastADialFailure(t *testing.T) {
	var sendsA, sendsB atomic.Int64
	var lnC net.Listener
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		sendsA.Add(1)
		lnC.Close() // C goes before the relay's second pick
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(503)
	})
	b := startReplica(t, "b", bodyDigest("b", &sendsB))
	var err error
	if lnC, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := lnC.Accept()
			if err != nil {
				return
			}
			go func() { // answers the probes; a request would hang
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						c.Close()
						return
					}
					io.Copy(io.Discard, req.Body)
					c.Write(rawProbeAnswer(req))
				}
			}()
		}
	}()
	// B by name: a Host of another length than A's to splice in.
	bURL := "http://localhost:" + strings.Split(b.addr, ":")[1]
	p := startProxy(t, RoundRobin, []string{a.url(), bURL, "http://" + lnC.Addr().String()},
		func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.MaxSends = 3 })
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100<<10) + `"}]}`
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(body, ""))
	resp, got := readAnswer(t, br, "POST")
	want := fmt.Sprintf(`{"replica":"b","sha":%q,"len":%d}`, digestOf(body), len(body))
	if resp.StatusCode != 200 || got != want {
		t.Fatalf("%d %q; want 200 %q", resp.StatusCode, got, want)
	}
	if h := resp.Header.Get("X-Replica-Saw-Host"); h != strings.TrimPrefix(bURL, "http://") {
		t.Fatalf("B saw Host %q, want %q", h, strings.TrimPrefix(bURL, "http://"))
	}
	if sendsA.Load() != 1 || sendsB.Load() != 1 {
		t.Fatalf("sends: A %d, B %d; want 1 and 1", sendsA.Load(), sendsB.Load())
	}
	if !strings.Contains(p.logs.String(), "phase=dial") {
		t.Fatalf("C's dial did not fail on the relay: the test did not test it")
	}
	// The connection serves a small request after it.
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || !strings.Contains(got, digestOf(chat(1, 1))) {
		t.Fatalf("next request: %d %q", resp.StatusCode, got)
	}
	c.Close()
	settled(t, p)
}

// The drain begins (StopStreams) while a wait is relayed: its answer, made
// after that, says Connection: close, as fasthttp's answers do then (Serve),
// since the connection closes after it.
func TestAttackRelayedWaitAnswerDuringDrainSaysClose(t *testing.T) {
	for _, above := range []int{-1, 0} {
		t.Run(fmt.Sprintf("relay waiting above %d", above), func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
				close(started)
				<-release
				chatReply("a")(w, r)
			})
			p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				c.RelayWaitingAbove = above
			})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), ""))
			<-started
			if above == 0 {
				// keepForRelay has read stopping: the wait is the relay's.
				waitFor(t, "the wait relayed", func() bool { return p.h.relays.n.Load() == 1 })
			}
			p.h.StopStreams()
			close(release)
			resp, _ := readAnswer(t, br, "POST")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			closed := false
			if _, err := br.ReadByte(); err != nil {
				closed = true
			}
			if closed && !resp.Close {
				t.Fatalf("the connection closed after an answer without Connection: close (%v)", resp.Header)
			}
		})
	}
}

// A client that leaves while its wait is relayed: the replica's request is
// cancelled, the exchange is counted as client_gone and logged as 499, and
// every count comes back.
func TestAttackClientLeavesARelayedWait(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		close(arrived)
		<-r.Context().Done()
		close(gone)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.AccessLog = true })
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	<-arrived
	// The relay takes the connection just after the replica has the
	// request.
	waitFor(t, "the wait relayed", func() bool { return p.h.relays.n.Load() == 1 })
	c.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica's request was not cancelled")
	}
	settled(t, p)
	waitFor(t, "client_gone counted", func() bool {
		return p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`) == "1"
	})
	if !strings.Contains(p.logs.String(), "status=499") || !strings.Contains(p.logs.String(), "path=/v1/chat/completions") {
		t.Fatalf("no 499 access log line with the path:\n%s", p.logs)
	}
}

// Answers without a body, framed by the relay: a HEAD whose replica gave
// no length, a 204, a 304; each leaves the connection serving the next
// request.
func TestAttackRelayFramesBodilessAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, method, answer string
	}{
		{"HEAD unframed", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"},
		{"HEAD chunked", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"HEAD sized", "HEAD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1234\r\n\r\n"},
		{"204", "POST", "HTTP/1.1 204 No Content\r\n\r\n"},
		{"304", "POST", "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			url := rawReplica(t, true, func() []byte {
				if n.Add(1) == 1 {
					return []byte(tc.answer)
				}
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			})
			p := startProxy(t, RoundRobin, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			writeRequest(c, tc.method)
			resp, got := readAnswer(t, br, tc.method)
			if got != "" {
				t.Fatalf("a body %q", got)
			}
			if resp.Close {
				t.Fatalf("Connection: close after %s", tc.name)
			}
			io.WriteString(c, rawChat(chat(2, 1), ""))
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("next request: %d %q", resp.StatusCode, got)
			}
			c.Close()
			settled(t, p)
		})
	}
}

// A replica that sends part of a head and closes: 502 (it had the request),
// no second send, and the connection serves the next request; a request
// pipelined behind the failed one is answered too.
func TestAttackReplicaClosesMidHeadOnTheRelay(t *testing.T) {
	var n atomic.Int64
	url := rawReplica(t, false, func() []byte {
		if n.Add(1) == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Ty")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.MaxSends = 3 })
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
	resp, got := readAnswer(t, br, "POST")
	if resp.StatusCode != 502 || resp.Close {
		t.Fatalf("%d %q close %v; want a 502, the connection kept", resp.StatusCode, got, resp.Close)
	}
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
		t.Fatalf("pipelined request: %d %q", resp.StatusCode, got)
	}
	if n.Load() != 2 {
		t.Fatalf("the replica had %d requests, want 2: none sent twice", n.Load())
	}
	c.Close()
	settled(t, p)
}

// A 103 forwarded by the relay, then a 503 with another replica live: the
// request goes there, and the client gets the 103 and then that answer.
func TestAttackEarlyHintsThenRejectedOnTheRelay(t *testing.T) {
	var sendsB atomic.Int64
	a := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
	})
	b := startReplica(t, "b", bodyDigest("b", &sendsB))
	p := startProxy(t, RoundRobin, []string{a, b.url()})
	rc := dialRaw(t, p.addr)
	interim, resp, body := rc.do(chat(1, 1))
	if resp.StatusCode != 200 || !strings.Contains(body, digestOf(chat(1, 1))) || len(interim) != 1 {
		t.Fatalf("%d %q, interim %q", resp.StatusCode, body, interim)
	}
	// And the next one, on the same connection.
	_, resp, body = rc.do(chat(2, 1))
	if resp.StatusCode != 200 || !strings.Contains(body, digestOf(chat(2, 1))) {
		t.Fatalf("next: %d %q", resp.StatusCode, body)
	}
	rc.c.Close()
	settled(t, p)
}

// Bodies kept by relays go back to a pool and to other requests' contexts:
// requests of many sizes, half of them sent again after a 503, each reach
// their replica whole and unmixed.
func TestAttackKeptBodiesStayWhole(t *testing.T) {
	var sendsB atomic.Int64
	a := startReplica(t, "a", rejectEvery(2, bodyDigest("a", &sendsB)))
	b := startReplica(t, "b", bodyDigest("b", &sendsB))
	p := startProxy(t, RoundRobin, []string{a.url(), b.url()})
	onConns(t, p, 4, 40, func(g, i int) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(string(rune('a'+g)), (i*977)%(80<<10)) + fmt.Sprint(g, i) + `"}]}`
	}, func(_, _ int, body string, status int, got []byte) error {
		if status != 200 || !strings.Contains(string(got), digestOf(body)) {
			return fmt.Errorf("%d %q", status, got)
		}
		return nil
	})
	settled(t, p)
}

// rejectEvery answers every nth request with a 503 and Retry-After 0,
// after reading its body, and the others with next: a replica that turns
// requests away now and then, which the proxy sends to another.
func rejectEvery(n int64, next http.HandlerFunc) http.HandlerFunc {
	var seen atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1)%n == 0 {
			io.ReadAll(r.Body)
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(503)
			return
		}
		next(w, r)
	}
}

// A hung replica on the relay: 504 after FirstByteTimeout, never sent
// again, and the connection serves on.
func TestAttackHungReplicaOnTheRelay(t *testing.T) {
	var n atomic.Int64
	release := make(chan struct{})
	defer close(release)
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			<-release
			return
		}
		chatReply("a")(w, r)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.FirstByteTimeout = 300 * time.Millisecond
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	resp, _ := readAnswer(t, br, "POST")
	if resp.StatusCode != 504 || resp.Close {
		t.Fatalf("%d close %v", resp.StatusCode, resp.Close)
	}
	io.WriteString(c, rawChat(chat(2, 1), ""))
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 200 {
		t.Fatalf("next: %d", resp.StatusCode)
	}
	if n.Load() != 2 {
		t.Fatalf("%d sends, want 2", n.Load())
	}
	c.Close()
	settled(t, p)
}

// StreamsDone waits for a relayed wait, and returns once it is answered.
func TestAttackStreamsDoneWaitsForARelayedWait(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		chatReply("a")(w, r)
	})
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	<-started
	beginDrain(t, p, "a relayed wait")
	close(release)
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	drainEnds(t, p)
}

// Answer bodies of every framing, relayed: a known length larger than a
// relay buffer, one past BufferLimit, one until the replica closes, a
// chunked one; each whole, and the connection serves on (the last one
// pipelined behind the first).
func TestAttackRelayFramesEveryBody(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1500) // 24000 bytes
	for _, tc := range []struct {
		name, answer string
		keepAlive    bool
	}{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24000\r\n\r\n" + big, true},
		{"past BufferLimit", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24000\r\n\r\n" + big, true},
		{"until EOF", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + big, false},
		{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5dc0\r\n" + big + "\r\n0\r\n\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := rawReplica(t, tc.keepAlive, func() []byte { return []byte(tc.answer) })
			p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				if tc.name == "past BufferLimit" {
					c.BufferLimit = 1000
				}
			})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
			for i := 0; i < 2; i++ {
				resp, got := readAnswer(t, br, "POST")
				if resp.StatusCode != 200 || got != big || resp.Close {
					t.Fatalf("answer %d: %d, %d bytes, close %v", i, resp.StatusCode, len(got), resp.Close)
				}
			}
			c.Close()
			settled(t, p)
		})
	}
}

// A panic on the relay, after the replica's answer came: a 500 with
// Connection: close, and every count comes back.
func TestAttackPanicOnTheRelay(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	p.h.pins = nil // Served panics, on the relay (respond)
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	resp, got := readAnswer(t, br, "POST")
	if resp.StatusCode != 500 || !resp.Close || !strings.Contains(got, "internal_error") {
		t.Fatalf("%d %q close %v", resp.StatusCode, got, resp.Close)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection was not closed")
	}
	if !strings.Contains(p.logs.String(), "panic relaying") {
		t.Fatal("the panic was not on the relay")
	}
	settled(t, p)
}

// The access log of relayed waits: method, path and status of an answer,
// a proxy error, and a HEAD.
func TestAttackAccessLogOfRelayedWaits(t *testing.T) {
	var n atomic.Int64
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			io.ReadAll(r.Body) // read whole: a close, not a reset
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		chatReply("a")(w, r)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.AccessLog = true })
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, "HEAD /v1/x HTTP/1.1\r\nHost: p\r\n\r\n")
	readAnswer(t, br, "HEAD")
	io.WriteString(c, rawChat(chat(2, 1), ""))
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 502 {
		t.Fatalf("%d", resp.StatusCode)
	}
	c.Close()
	settled(t, p)
	logs := p.logs.String()
	for _, want := range []string{"method=POST path=/v1/chat/completions model=m replica=" + a.addr + " route=spread status=502",
		"method=HEAD path=/v1/x model=\"\" replica=" + a.addr + " route=spread status=200"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no access log line with %q", want)
		}
	}
}

// A client that asks Connection: close gets it on a relayed proxy error,
// and the connection closes after it.
func TestAttackClientCloseOnARelayedError(t *testing.T) {
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	})
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "Connection: close\r\n")+rawChat(chat(2, 1), ""))
	resp, _ := readAnswer(t, br, "POST")
	if resp.StatusCode != 502 || !resp.Close {
		t.Fatalf("%d close %v", resp.StatusCode, resp.Close)
	}
	if b, err := br.ReadByte(); err == nil {
		t.Fatalf("more after a Connection: close answer: %q", b)
	}
	settled(t, p)
}

// The relay writes the replica's head as fasthttp writes it (the server's
// NoDefaultContentType and NoDefaultDate): no Content-Type that the replica
// did not send, its own Date, none added.
func TestAttackRelayAddsNoHeaders(t *testing.T) {
	for _, tc := range []struct{ name, answer, method string }{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\n\r\n{}", "POST"},
		{"stream", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "POST"},
		{"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "HEAD"},
	} {
		for _, above := range []int{-1, 0} {
			t.Run(fmt.Sprintf("%s relay waiting above %d", tc.name, above), func(t *testing.T) {
				url := rawReplica(t, true, func() []byte { return []byte(tc.answer) })
				p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
					c.RelayWaitingAbove = above
				})
				c := dialProxy(t, p)
				br := bufio.NewReader(c)
				writeRequest(c, tc.method)
				resp, _ := readAnswer(t, br, tc.method)
				if ct := resp.Header.Get("Content-Type"); ct != "" {
					t.Errorf("Content-Type %q added", ct)
				}
				if d := resp.Header.Values("Date"); strings.Contains(tc.answer, "Date:") && (len(d) != 1 || d[0] != "Mon, 01 Jan 2001 00:00:00 GMT") ||
					!strings.Contains(tc.answer, "Date:") && len(d) != 0 {
					t.Errorf("Date %q; the replica sent %v", d, strings.Contains(tc.answer, "Date:"))
				}
			})
		}
	}
}
