package upstream

import (
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The fakes that the package's tests play a replica and a client with,
// and the harness around a round trip: a listener that stands for a
// replica, each connection it accepts handed to the test; the replica's
// side of an exchange on such a connection; the proxy's side, bounded in
// time; and a client's connection as the proxy holds one.

// A replica and its connections.

// testReplica is a loopback listener that stands for a replica, with a set
// in front of it: the test plays the replica on each connection accepted.
type testReplica struct {
	*Replica
	accepted chan *net.TCPConn
}

func startTestReplica(t *testing.T, cfg Config) *testReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveTestReplica(t, cfg, ln)
}

// serveTestReplica is startTestReplica on the listener ln.
func serveTestReplica(t *testing.T, cfg Config, ln net.Listener) *testReplica {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan *net.TCPConn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*net.TCPConn)
		}
	}()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := NewSet([]string{ln.Addr().String()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testReplica{s.Replica(0), accepted}
}

// connect returns a connection to r from Acquire, and the replica's end of
// the connection that Acquire dialed, if it dialed one; both are closed when
// the test ends.
func (r *testReplica) connect(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	c, srv := acquire(t, r.Replica, r.accepted)
	if srv != nil {
		t.Cleanup(func() { srv.Close() })
	}
	return c, srv
}

// acquire returns a connection to r from Acquire, closed when the test
// ends, and, when Acquire dialed it, the replica's end of it from
// accepted (the zero P for a reused one).
func acquire[P any](t *testing.T, r *Replica, accepted <-chan P) (*Conn, P) {
	t.Helper()
	c, err := r.Acquire(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if c.Reused {
		var none P
		return c, none
	}
	return c, within(t, accepted)
}

// A client of the proxy.

// clientPair returns a client connection as the proxy holds it and the
// client's own end; both are closed when the test ends.
func clientPair(t *testing.T) (held net.Conn, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	held, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close(); c.Close() })
	return held, c.(*net.TCPConn)
}

// The replica's side of an exchange.

// request is a chat request with a body of n bytes.
func request(n int) (head, body []byte) {
	head = []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n")
	body = make([]byte, n)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return head, body
}

// readRequest reads n bytes of srv in the background, for at most 10 s,
// and sends what it read.
func readRequest(srv net.Conn, n int) <-chan []byte {
	got := make(chan []byte, 1)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		b := make([]byte, n)
		m, _ := io.ReadFull(srv, b)
		got <- b[:m]
	}()
	return got
}

// readSlowly reads n bytes of srv in pieces of step bytes, for at most
// 10 s, and sends what it read.
func readSlowly(srv net.Conn, n, step int) <-chan []byte {
	got := make(chan []byte, 1)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		b := make([]byte, 0, n)
		buf := make([]byte, step)
		for len(b) < n {
			m, err := srv.Read(buf[:min(step, n-len(b))])
			b = append(b, buf[:m]...)
			if err != nil {
				break
			}
		}
		got <- b
	}()
	return got
}

// serve reads one request of a body of n bytes from srv and writes answer.
func serve(srv net.Conn, n int, answer string) <-chan []byte {
	got := make(chan []byte, 1)
	head, _ := request(n)
	req := readRequest(srv, len(head)+n)
	go func() {
		b := <-req
		srv.Write([]byte(answer))
		got <- b
	}()
	return got
}

// The proxy's side of an exchange, bounded in time.

// streamAnswer has the replica at r's end of c answer with answer, closing
// its connection after it when close is set, and returns the answer's body
// as Stream gives it, and the header that its trailers go into.
func streamAnswer(t *testing.T, c *Conn, srv net.Conn, answer string, close bool) (*Body, *fasthttp.ResponseHeader) {
	t.Helper()
	got := serve(srv, 0, answer)
	hd := new(fasthttp.ResponseHeader)
	if err := roundTripWithin(t, c, 0, hd, nil, nil); err != nil {
		t.Fatal(err)
	}
	<-got
	if close {
		srv.Close()
	}
	return c.Stream(hd.ContentLength(), nil, hd), hd
}

// readAll reads b whole with reads of size bytes, and returns what it read
// and the first error other than io.EOF.
func readAll(b *Body, size int) ([]byte, error) {
	var out []byte
	buf := make([]byte, size)
	for {
		n, err := b.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// roundTripWithin runs c.RoundTrip of a request with a body of n bytes,
// failing t if it has not returned within 10 s.
func roundTripWithin(t *testing.T, c *Conn, n int, hd *fasthttp.ResponseHeader, client net.Conn, early Interim) *Error {
	t.Helper()
	head, body := request(n)
	done := make(chan *Error, 1)
	go func() { done <- c.RoundTrip(head, body, hd, client, early, time.Now()) }()
	return within(t, done)
}

// within returns what done receives, failing t if nothing comes within
// 10 s.
func within[T any](t *testing.T, done <-chan T) T {
	t.Helper()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no result within 10 s")
		var zero T
		return zero
	}
}
