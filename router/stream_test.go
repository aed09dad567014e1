package router

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A streamed answer's relay (startStream, Read and CloseWithError in
// request.go, with stream.go): chunk by chunk as the replica sends it, its
// head and its end written when they should be, its trailers passed on,
// and the bounds on a client that stops reading and on a replica that
// trickles.

func TestStreamArrivesChunkByChunk(t *testing.T) {
	firstSeen := make(chan struct{})
	buffered := make(chan struct{})
	a := startReplica(t, "a", sse(3, func(i int) {
		if i == 2 {
			// The last chunk waits until the client has the first; a
			// relay that buffers the stream never delivers it.
			select {
			case <-firstSeen:
			case <-time.After(5 * time.Second):
				close(buffered)
			}
		}
	}))
	p := startProxy(t, Adaptive, []string{a.url()})
	req, _ := http.NewRequest("POST", p.url("/v1/chat/completions"), strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Warmroute-Replica") != a.addr {
		t.Fatalf("headers %v", resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	select {
	case <-buffered:
		t.Fatal("the first chunk reached the client only after the replica gave up waiting: the relay buffers")
	default:
	}
	if err != nil || line != "data: {\"chunk\":0}\n" {
		t.Fatalf("first line %q %v", line, err)
	}
	close(firstSeen)
	var rest bytes.Buffer
	if _, err := rest.ReadFrom(br); err != nil {
		t.Fatal(err)
	}
	if want := "\ndata: {\"chunk\":1}\n\ndata: {\"chunk\":2}\n\ndata: [DONE]\n\n"; rest.String() != want {
		t.Fatalf("rest of stream %q, want %q", rest.String(), want)
	}
}

// A stream's head goes to the client with its first data when both came
// from the replica together, in one write, and at once when the data is
// not there yet (TestStreamStaysQueuedUntilItsFirstData waits for it); the
// end of the stream goes in a write of its own.
func TestStreamHeadGoesWithItsFirstData(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	replica := rawReplica(t, true, func() []byte { return []byte(sse) })
	p := startProxy(t, RoundRobin, []string{replica})
	var writes atomic.Int32
	c := serveThrough(t, p, func(ln net.Listener) net.Listener { return writeCounter{ln, &writes} })
	io.WriteString(c, streamRequest(""))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "data: a\n\n" {
		t.Fatalf("body %q, %v", got, err)
	}
	if n := writes.Load(); n != 2 {
		t.Fatalf("%d writes to the client for a head, one event and the end, want 2", n)
	}
}

// serveThrough serves p's handler on a new listener, wrapped by wrap, and
// returns a connection to it; both end with the test.
func serveThrough(t *testing.T, p *proxy, wrap func(net.Listener) net.Listener) net.Conn {
	t.Helper()
	ln := listenLoopback(t)
	scfg := ServerConfig{MaxBodySize: 1 << 20}
	srv := p.h.Server(scfg)
	go srv.Serve(wrap(ln))
	t.Cleanup(func() { srv.Shutdown() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// writeCounter counts the writes to its connections.
type writeCounter struct {
	net.Listener
	writes *atomic.Int32
}

func (l writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return writeCountingConn{c, l.writes}, err
}

type writeCountingConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A client that pipelined a request behind a stream gets the stream whole,
// its end included, while the next answer is still awaited: the end goes
// with the last data, not with the next answer, where fasthttp's writer
// holds its own last chunk.
func TestStreamEndsBeforeThePipelinedAnswer(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	var calls atomic.Int32
	second := make(chan struct{})
	t.Cleanup(func() { close(second) })
	replica := rawReplica(t, true, func() []byte {
		if calls.Add(1) == 2 {
			<-second
		}
		return []byte(sse)
	})
	p := startProxy(t, RoundRobin, []string{replica})
	c := dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, streamRequest("")+streamRequest(""))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(resp.Body); err != nil || string(got) != "data: a\n\n" {
		t.Fatalf("the first stream, with the second answer awaited: %q, %v", got, err)
	}
	second <- struct{}{}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(resp.Body); err != nil || string(got) != "data: a\n\n" {
		t.Fatalf("the second stream: %q, %v", got, err)
	}
}

// A stream whose last data, sent with its end, could not be written to the
// client is a client gone (499), not a whole answer.
func TestStreamEndUnwrittenIsClientGone(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	replica := rawReplica(t, true, func() []byte { return []byte(sse) })
	p := startProxy(t, RoundRobin, []string{replica}, func(_ *upstream.Config, cfg *Config, _ *ServerConfig) {
		cfg.AccessLog = true
	})
	c := serveThrough(t, p, func(ln net.Listener) net.Listener { return failingWrites{ln, []byte("data: a")} })
	io.WriteString(c, streamRequest(""))
	waitFor(t, "the stream's access log line", func() bool { return strings.Contains(p.logs.String(), "msg=request") })
	line := p.logs.String()
	line = line[strings.Index(line, "msg=request"):]
	line = line[:strings.IndexByte(line, '\n')]
	if !strings.Contains(line, "status=499") {
		t.Fatalf("%s; want status=499", line)
	}
}

// failingWrites fails each write to its connections that carries marker.
type failingWrites struct {
	net.Listener
	marker []byte
}

func (l failingWrites) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return &failingConn{c, l.marker}, err
}

type failingConn struct {
	net.Conn
	marker []byte
}

func (c *failingConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.marker) {
		return 0, errors.New("the client is gone")
	}
	return c.Conn.Write(p)
}

// A last chunk of any size arrives whole with its end, twice on one
// connection: past fasthttp's 4 KiB writer the chunk goes in two writes,
// and the end in its own.
func TestStreamLastChunkOfAnySize(t *testing.T) {
	for _, size := range []int{100, 4000, 4088, 4090, 4096, 6000} {
		data := bytes.Repeat([]byte("x"), size)
		replica := rawReplica(t, true, func() []byte { return oneChunk(data) })
		streamTwice(t, startProxy(t, RoundRobin, []string{replica}), data, fmt.Sprintf("size %d", size))
	}
}

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

// A stream whose replica is silent for longer than the write timeout, and
// less than the stream idle timeout (a long prefill after the head, which
// vLLM sends first), is not cut when its next event comes: the write
// timeout bounds a write to a client that stopped reading, not the
// replica's silence.
func TestStreamSilentPastTheWriteTimeout(t *testing.T) {
	const gap = 600 * time.Millisecond // the replica's silence, three write timeouts
	a := startReplica(t, "a", sse(3, func(i int) {
		if i == 1 {
			time.Sleep(gap) // the replica's behaviour under test, not a synchronisation
		}
	}))
	p := startProxy(t, Adaptive, []string{a.url()}, func(u *upstream.Config, _ *Config, s *ServerConfig) {
		s.WriteTimeout = 200 * time.Millisecond
		u.StreamIdleTimeout = 5 * time.Second
	})
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.err != nil || r.status != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Fatalf("%v %d %q: the stream was cut after the replica's silence", r.err, r.status, r.body)
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`); got != "" && got != "0" {
		t.Fatalf("client_gone sends = %q: a client that read was taken for one that stopped", got)
	}
}

// A replica that trickles a stream a byte at a time, each byte well inside
// -stream-idle-timeout, is cut once it has sent less than -stream-min-rate
// for that long, and counted as a mid-stream failure.
func TestTrickledStreamIsCutBelowTheMinimumRate(t *testing.T) {
	url := trickler(t, 10*time.Millisecond) // 100 bytes a second
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.StreamIdleTimeout, u.StreamMinRate = 200*time.Millisecond, 1000
	})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	readCut(t, c)
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="mid_stream"}`); got != "1" {
		t.Errorf("mid_stream sends = %q, want 1", got)
	}
	if !strings.Contains(p.logs.String(), upstream.ErrTooSlow.Error()) {
		t.Errorf("the cut's log line does not say that the replica was too slow")
	}
}
