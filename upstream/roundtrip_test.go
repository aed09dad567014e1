package upstream

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

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

// hints counts the 103 answers that RoundTrip passes on, and keeps the
// Link header that each had.
type hints struct {
	hd    *fasthttp.ResponseHeader
	links []string
}

func (h *hints) EarlyHints() error {
	h.links = append(h.links, string(h.hd.Peek("Link")))
	return nil
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

// RoundTrip reads interim answers until the final one: 100 and 102 are
// consumed, a 103 is passed on with its headers, and the final head is the
// one read; 101 and a run of more interim answers than maxInterim fail the
// exchange, as a head that never completes and a replica that never
// answers do, each in its phase. The final answer's body is still to read
// after the head, and the connection is pooled only after an answer that
// did not say Connection: close.
func TestRoundTrip(t *testing.T) {
	final := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	for _, tt := range []struct {
		name, answer string
		links        []string // the 103s passed on
		phase        Phase    // of the error, if any
		sign         Sign
		err          error
		pooled       bool
	}{
		{name: "plain", answer: final, pooled: true},
		{name: "100 and 102", answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n" + final, pooled: true},
		{name: "103", answer: "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n" +
			"HTTP/1.1 103 Early Hints\r\nLink: </b>; rel=preload\r\n\r\n" + final, links: []string{"</a>; rel=preload", "</b>; rel=preload"}, pooled: true},
		{name: "eight interim answers", answer: strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", maxInterim) + final, pooled: true},
		{name: "nine interim answers", answer: strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", maxInterim+1) + final,
			phase: PhaseHead, sign: SignFailed, err: errBadInterim},
		{name: "101", answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
			phase: PhaseHead, sign: SignFailed, err: errBadInterim},
		{name: "replica closes after this answer", answer: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{name: "a head that never completes", answer: "HTTP/1.1 200 OK\r\nContent-Le", phase: PhaseHead, sign: SignTimeout},
		{name: "no answer", phase: PhaseAwait, sign: SignTimeout, err: ErrTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The rest of a head gets StreamIdleTimeout, and a replica
			// that sends nothing FirstByteTimeout: each is short where
			// the test waits for it.
			cfg := Config{FirstByteTimeout: 10 * time.Second, StreamIdleTimeout: 2 * pollInterval}
			if tt.answer == "" {
				cfg.FirstByteTimeout = 200 * time.Millisecond
			}
			r := startTestReplica(t, cfg)
			c, srv := r.connect(t)
			got := serve(srv, 10, tt.answer)
			var hd fasthttp.ResponseHeader
			early := &hints{hd: &hd}
			start := time.Now()
			err := roundTripWithin(t, c, 10, &hd, nil, early)
			if d := time.Since(start); tt.phase == PhaseHead && tt.sign == SignTimeout && d < 2*pollInterval {
				t.Fatalf("timed out after %v, before its timeout", d)
			}
			if head, body := request(10); !bytes.Equal(<-got, append(head, body...)) {
				t.Fatal("the replica did not get the request whole")
			}
			if strings.Join(early.links, "|") != strings.Join(tt.links, "|") {
				t.Fatalf("103s passed on with %q, want %q", early.links, tt.links)
			}
			if tt.phase != 0 {
				if err == nil || err.Phase != tt.phase || err.Sign != tt.sign || tt.err != nil && !errors.Is(err, tt.err) || !c.broken {
					t.Fatalf("RoundTrip = %v, want a %v error in %v (%v), the connection not pooled", err, tt.sign, tt.phase, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var resp fasthttp.Response
			hd.CopyTo(&resp.Header)
			if resp.StatusCode() != 200 {
				t.Fatalf("final status %d", resp.StatusCode())
			}
			if err := c.ReadWhole(&resp, 0); err != nil || string(resp.Body()) != "ok" {
				t.Fatalf("body %q, %v", resp.Body(), err)
			}
			c.Release(time.Now())
			if pooled := len(r.idle) == 1; pooled != tt.pooled {
				t.Fatalf("pooled %v, want %v", pooled, tt.pooled)
			}
		})
	}
}

// A replica demoted as hung while a request waits on it ends the wait at
// the next poll, long before the first-byte timeout: the request may be
// running there, so it is answered 504 and never sent again.
func TestHungReplicaEndsTheWait(t *testing.T) {
	r := startTestReplica(t, Config{FirstByteTimeout: 30 * time.Second})
	c, srv := r.connect(t)
	got := serve(srv, 10, "")
	done := make(chan *Error, 1)
	go func() {
		var hd fasthttp.ResponseHeader
		head, body := request(10)
		done <- c.RoundTrip(head, body, &hd, nil, nil, time.Now())
	}()
	<-got
	start := time.Now()
	r.demote(errors.New("probe timed out"), start, true)
	err := within(t, done)
	if err == nil || err.Sign != SignHung || err.Phase != PhaseAwait || !errors.Is(err, ErrHung) {
		t.Fatalf("a wait on a replica demoted as hung: %v", err)
	}
	if d := time.Since(start); d > 4*pollInterval {
		t.Fatalf("the demotion ended the wait after %v", d)
	}
	if v := Judge(err, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != (Verdict{Result: TimedOut, Status: 504}) {
		t.Fatalf("judged %+v", v)
	}
}

// A request sent to a replica demoted as hung just before is written all
// the same, so that the verdict (it may be running) is true.
func TestRequestToAHungReplicaIsWritten(t *testing.T) {
	r := startTestReplica(t, Config{FirstByteTimeout: 30 * time.Second})
	c, srv := r.connect(t)
	r.demote(errors.New("probe timed out"), time.Now(), true)
	got := serve(srv, 10, "")
	var hd fasthttp.ResponseHeader
	if err := roundTripWithin(t, c, 10, &hd, nil, nil); err == nil || err.Sign != SignHung || err.Phase != PhaseAwait {
		t.Fatalf("%v, want a hung replica's error in PhaseAwait", err)
	}
	if b := <-got; len(b) == 0 {
		t.Fatal("the replica read nothing")
	}
}
