package router

import (
	"bufio"
	"bytes"
	"errors"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
