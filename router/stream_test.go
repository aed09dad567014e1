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

// dataBuffered says whether a stream's first Read can return bytes at once:
// some body bytes are buffered, after a whole and valid size line when
// chunked, and not the last chunk's (its trailers may come later).
func TestDataBuffered(t *testing.T) {
	for _, tc := range []struct {
		buffered string
		chunked  bool
		want     bool
	}{
		{"", false, false},
		{"x", false, true},
		{"", true, false},
		{"9\r", true, false},
		{"9\r\n", true, false},
		{"9\r\nd", true, true},
		{"1a;ext=1\r\nd", true, true},
		{"10\r\nd", true, true},
		{"0\r\n\r\n", true, false},
		{"00;ext\r\n\r\n", true, false},
		{"1X0\n0", true, false},
		{"\r\nd", true, false},
	} {
		x := &exchange{c: bufferedConn(tc.buffered)}
		x.stream.chunked = tc.chunked
		if got := x.dataBuffered(); got != tc.want {
			t.Errorf("%q (chunked %v): %v, want %v", tc.buffered, tc.chunked, got, tc.want)
		}
	}
}

// A stream's head goes to the client with its first data when both came
// from the replica together, in one write, and at once when the data is
// not there yet (TestStreamStaysQueuedUntilItsFirstData waits for it); the
// end of the stream, come with its last data, goes in that write too: the
// relay writes it so, and the client's connection ends fasthttp's body
// in that write (lastchunk.go).
// fasthttp on a connection that cannot (not from Listener)
// writes the end on its own.
func TestStreamHeadGoesWithItsFirstData(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	replica := rawReplica(t, true, func() []byte { return []byte(sse) })
	for _, tc := range []struct {
		name    string
		relayed bool
		coarse  bool // through Listener
		want    int32
	}{
		{"relayed", true, true, 1},
		{"fasthttp", false, true, 1},
		{"fasthttp, plain connection", false, false, 2},
	} {
		// A proxy each: Server sets the handler's write timeout, which
		// the last case's Read may still read.
		p := startProxy(t, RoundRobin, []string{replica}, func(_ *upstream.Config, cfg *Config, _ *ServerConfig) {
			if !tc.relayed {
				cfg.RelayAbove, cfg.RelayWaitingAbove = -1, -1
			}
		})
		var writes atomic.Int32
		c := serveThrough(t, p, tc.coarse, func(ln net.Listener) net.Listener { return writeCounter{ln, &writes} })
		io.WriteString(c, streamRequest(""))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != "data: a\n\n" {
			t.Fatalf("%s: body %q, %v", tc.name, got, err)
		}
		if n := writes.Load(); n != tc.want {
			t.Fatalf("%s: %d writes to the client for a head, one event and the end, want %d", tc.name, n, tc.want)
		}
	}
}

// serveThrough serves p's handler on a new listener, wrapped by wrap and,
// when coarse, by ServerConfig.Listener (the proxy's own), and returns a
// connection to it; both end with the test.
func serveThrough(t *testing.T, p *proxy, coarse bool, wrap func(net.Listener) net.Listener) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scfg := ServerConfig{MaxBodySize: 1 << 20}
	srv := p.h.Server(scfg)
	wrapped := wrap(ln)
	if coarse {
		wrapped = scfg.Listener(wrapped)
	}
	go srv.Serve(wrapped)
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

// bufferedConn is a replica connection with b buffered.
func bufferedConn(b string) *upstream.Conn {
	br := bufio.NewReader(strings.NewReader(b))
	br.Peek(len(b))
	return &upstream.Conn{Reader: br}
}

// chunkSize's one-pass reading of a line of hex digits agrees with the
// general one on every line.
func FuzzChunkSize(f *testing.F) {
	for _, line := range []string{"0", "5", "1a", "1A", "fFfF", "123456789abcdef", "123456789abcdef0",
		"", " 5", "5 ", "5;ext=1", "g", "-1", "0x5", "\t5\t"} {
		f.Add([]byte(line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		got, gotErr := chunkSize(line)
		want, wantErr := chunkSizeSlow(line)
		if got != want || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("chunkSize(%q) = %d, %v; the general reading gives %d, %v", line, got, gotErr, want, wantErr)
		}
	})
}

func TestChunkSize(t *testing.T) {
	for _, tc := range []struct {
		line string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1a", 26, true}, {"1A", 26, true}, {"123456789abcdef", 0x123456789abcdef, true},
		{"5;ext=1", 5, true}, {" 5 ", 5, true}, {"", 0, false}, {"g", 0, false}, {"123456789abcdef0", 0, false},
	} {
		got, err := chunkSize([]byte(tc.line))
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("chunkSize(%q) = %d, %v; want %d (valid %v)", tc.line, got, err, tc.want, tc.ok)
		}
	}
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
	p := startProxy(t, RoundRobin, []string{replica}, func(_ *upstream.Config, cfg *Config, _ *ServerConfig) {
		cfg.RelayAbove, cfg.RelayWaitingAbove = -1, -1
	})
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
// client is a client gone (499), on both paths, not a whole answer.
func TestStreamEndUnwrittenIsClientGone(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	replica := rawReplica(t, true, func() []byte { return []byte(sse) })
	for _, relayed := range []bool{true, false} {
		p := startProxy(t, RoundRobin, []string{replica}, func(_ *upstream.Config, cfg *Config, _ *ServerConfig) {
			if !relayed {
				cfg.RelayAbove, cfg.RelayWaitingAbove = -1, -1
			}
			cfg.AccessLog = true
		})
		c := serveThrough(t, p, true, func(ln net.Listener) net.Listener { return failingWrites{ln, []byte("data: a")} })
		io.WriteString(c, streamRequest(""))
		waitFor(t, "the stream's access log line", func() bool { return strings.Contains(p.logs.String(), "msg=request") })
		line := p.logs.String()
		line = line[strings.Index(line, "msg=request"):]
		line = line[:strings.IndexByte(line, '\n')]
		if !strings.Contains(line, "status=499") {
			t.Fatalf("relayed %v: %s; want status=499", relayed, line)
		}
	}
}

// failingWrites fails each write to its connections that carries marker.
type failingWrites struct {
	net.Listener
	marker []byte
}

func (l failingWrites) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return failingConn{c, l.marker}, err
}

type failingConn struct {
	net.Conn
	marker []byte
}

func (c failingConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.marker) {
		return 0, errors.New("the client is gone")
	}
	return c.Conn.Write(p)
}

// A last chunk of any size arrives whole with its end, twice on one
// connection, on both paths: past fasthttp's 4 KiB writer the chunk goes
// in two writes, and the end in its own.
func TestStreamLastChunkOfAnySize(t *testing.T) {
	for _, size := range []int{100, 4000, 4088, 4090, 4096, 6000} {
		data := bytes.Repeat([]byte("x"), size)
		replica := rawReplica(t, true, func() []byte { return oneChunk(data) })
		for _, relayed := range []bool{true, false} {
			p := startProxy(t, RoundRobin, []string{replica}, func(_ *upstream.Config, cfg *Config, _ *ServerConfig) {
				if !relayed {
					cfg.RelayAbove, cfg.RelayWaitingAbove = -1, -1
				}
			})
			streamTwice(t, p, data, fmt.Sprintf("size %d, relayed %v", size, relayed))
		}
	}
}
