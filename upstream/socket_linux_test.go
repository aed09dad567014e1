package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// untilArrived returns once nc's socket holds bytes or an end of stream to
// read, without reading them: the kernel has what the other end sent.
func untilArrived(t *testing.T, nc *net.TCPConn) {
	t.Helper()
	rc, err := nc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var buf [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, err := peek(fd, buf[:])
		return n > 0 || err != unix.EAGAIN
	}); err != nil {
		t.Fatal(err)
	}
}

// The evidence that Judge draws from, from real sockets: a replica that
// closed with the request unread (before it came, or with it in its socket)
// is a reset or an unacknowledged FIN before any answer; one that read the
// request and closed is a plain failure, which is never sent again. On a
// reused connection, the first is a connection that the replica closed
// while idle: the request goes again on a fresh connection to it, once.
func TestRoundTripEvidence(t *testing.T) {
	maybeRunning := Verdict{Result: MaybeRunning, Demote: true, Status: 502}
	notSent := Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}
	fresh := Verdict{Result: NotSent, Resend: Fresh, Status: 503}
	for _, tt := range []struct {
		name   string
		reused bool
		// replica plays the replica's part on srv; c is the proxy's
		// end, for waits on what it has seen.
		replica func(t *testing.T, c *Conn, srv *net.TCPConn)
		signs   []Sign
		want    Verdict
	}{
		{"closed before the request came", false, func(t *testing.T, c *Conn, srv *net.TCPConn) {
			srv.Close()
			untilArrived(t, c.nc.(*net.TCPConn))
		}, []Sign{SignReset, SignUnacked}, notSent},
		{"reset before the request came", false, func(t *testing.T, c *Conn, srv *net.TCPConn) {
			srv.SetLinger(0)
			srv.Close()
			untilArrived(t, c.nc.(*net.TCPConn))
		}, []Sign{SignReset}, notSent},
		{"closed with the request unread", false, func(t *testing.T, _ *Conn, srv *net.TCPConn) {
			go func() { untilArrived(t, srv); srv.Close() }()
		}, []Sign{SignReset}, notSent},
		{"read the request and closed", false, func(t *testing.T, _ *Conn, srv *net.TCPConn) {
			head, body := request(100)
			got := readRequest(srv, len(head)+len(body))
			go func() { <-got; srv.Close() }()
		}, []Sign{SignFailed}, maybeRunning},
		{"idle connection closed by the replica", true, func(t *testing.T, c *Conn, srv *net.TCPConn) {
			srv.Close()
			untilArrived(t, c.nc.(*net.TCPConn))
		}, []Sign{SignReset, SignUnacked}, fresh},
		{"idle connection closed with the request unread", true, func(t *testing.T, _ *Conn, srv *net.TCPConn) {
			go func() { untilArrived(t, srv); srv.Close() }()
		}, []Sign{SignReset}, fresh},
		{"reused connection, read the request and closed", true, func(t *testing.T, _ *Conn, srv *net.TCPConn) {
			head, body := request(100)
			got := readRequest(srv, len(head)+len(body))
			go func() { <-got; srv.Close() }()
		}, []Sign{SignFailed}, Verdict{Result: MaybeRunning, Status: 502}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Pooled connections are trusted: the stale one is met by the
			// request, not by the peek before it.
			r := startTestReplica(t, Config{FirstByteTimeout: 10 * time.Second, TrustIdle: time.Hour})
			c, srv := r.connect(t)
			if tt.reused {
				var hd fasthttp.ResponseHeader
				got := serve(srv, 100, "HTTP/1.1 204 No Content\r\n\r\n")
				if err := roundTripWithin(t, c, 100, &hd, nil, nil); err != nil {
					t.Fatal(err)
				}
				<-got
				c.Release(time.Now())
				if c, _ = r.connect(t); !c.Reused {
					t.Fatal("the connection was not pooled")
				}
			}
			tt.replica(t, c, srv)
			var hd fasthttp.ResponseHeader
			err := roundTripWithin(t, c, 100, &hd, nil, nil)
			if err == nil {
				t.Fatal("RoundTrip succeeded")
			}
			if err.Reused != tt.reused || err.Phase != PhaseAwait && (err.Phase != PhaseWrite || tt.want.Result != NotSent) {
				t.Fatalf("%v: reused %v, want %v, in PhaseAwait", err, err.Reused, tt.reused)
			}
			if err.Phase == PhaseAwait && !slices.Contains(tt.signs, err.Sign) {
				t.Fatalf("%v: sign %v, want one of %v", err, err.Sign, tt.signs)
			}
			if v := Judge(err, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != tt.want {
				t.Fatalf("%v judged %+v, want %+v", err, v, tt.want)
			}
		})
	}
}

// clientGone tells a client that left, with a FIN or a reset, from one that
// is there, idle or with a pipelined request sent, whose bytes stay to be
// read; a connection closed on the proxy's side counts as gone.
func TestClientGone(t *testing.T) {
	for _, tt := range []struct {
		name   string
		do     func(client *net.TCPConn)
		closed bool
	}{
		{"idle", nil, false},
		{"a byte sent", func(c *net.TCPConn) { c.Write([]byte("x")) }, false},
		{"closed", func(c *net.TCPConn) { c.Close() }, true},
		{"reset", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			held, client := clientPair(t)
			if tt.do != nil {
				tt.do(client)
				untilArrived(t, held.(*net.TCPConn))
			}
			if got := (&Conn{}).clientGone(held); got != tt.closed {
				t.Fatalf("clientGone = %v, want %v", got, tt.closed)
			}
			if tt.name == "a byte sent" {
				buf := make([]byte, 4)
				if n, err := held.Read(buf); err != nil || string(buf[:n]) != "x" {
					t.Fatalf("read after clientGone = %q, %v; want the byte", buf[:n], err)
				}
			}
		})
	}
	held, _ := clientPair(t)
	held.Close()
	if !(&Conn{}).clientGone(held) {
		t.Fatal("clientGone of a connection closed on the proxy's side = false")
	}
}

// A client that leaves while its request waits for the replica ends the
// wait, for the head or between two chunks of a stream, within a poll or
// two: the exchange is a client gone, which blames no one, and closing the
// connection, as the caller then does, cancels the replica's request.
func TestClientGoneEndsTheWait(t *testing.T) {
	for _, stream := range []bool{false, true} {
		r := startTestReplica(t, Config{FirstByteTimeout: 10 * time.Second, StreamIdleTimeout: 10 * time.Second})
		c, srv := r.connect(t)
		held, client := clientPair(t)
		answer := ""
		if stream {
			answer = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
		}
		got := serve(srv, 10, answer)
		var hd fasthttp.ResponseHeader
		var err *Error
		var start time.Time
		if !stream {
			done := make(chan *Error, 1)
			go func() {
				head, body := request(10)
				done <- c.RoundTrip(head, body, &hd, held, nil, time.Now())
			}()
			<-got // the replica has the request
			client.Close()
			start = time.Now()
			err = within(t, done)
		} else {
			if err := roundTripWithin(t, c, 10, &hd, held, nil); err != nil {
				t.Fatal(err)
			}
			b := c.Stream(hd.ContentLength(), held, &hd)
			buf := make([]byte, 10)
			if n, err := b.Read(buf); err != nil || string(buf[:n]) != "abc" {
				t.Fatalf("first chunk %q, %v", buf[:n], err)
			}
			client.Close()
			start = time.Now()
			_, rerr := b.Read(buf)
			if !errors.As(rerr, &err) {
				t.Fatalf("a stream whose client left: %v", rerr)
			}
		}
		want := PhaseAwait
		if stream {
			want = PhaseStream
		}
		if err == nil || err.Sign != SignClientGone || err.Phase != want || !errors.Is(err, ErrClientGone) {
			t.Fatalf("stream %v: %v, want a client gone in %v", stream, err, want)
		}
		if d := time.Since(start); d > 4*pollInterval {
			t.Fatalf("stream %v: the client's leaving was found after %v", stream, d)
		}
		if v := Judge(err, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != (Verdict{Result: ClientGone, Status: 499}) {
			t.Fatalf("judged %+v", v)
		}
		c.Close()
		srv.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := srv.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the replica's connection after the client left: %d, %v; want it closed", n, err)
		}
	}
}

// An idle connection that its replica closed, or that has stray bytes, is
// found by Acquire's peek before a request goes on it: it is dropped, and
// a fresh connection dialed.
func TestAcquireDropsADeadIdleConnection(t *testing.T) {
	for _, tt := range []struct {
		name  string
		spoil func(srv *net.TCPConn)
	}{
		{"closed", func(srv *net.TCPConn) { srv.Close() }},
		{"half closed", func(srv *net.TCPConn) { srv.CloseWrite() }},
		{"stray bytes", func(srv *net.TCPConn) { srv.Write([]byte("HTTP/1.1 200 OK\r\n")) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := startTestReplica(t, Config{TrustIdle: -1})
			c, srv := r.connect(t)
			c.Release(time.Now())
			tt.spoil(srv)
			untilArrived(t, c.nc.(*net.TCPConn))
			fresh, srv2 := r.connect(t)
			if fresh == c || fresh.Reused || srv2 == nil {
				t.Fatal("Acquire reused a dead idle connection")
			}
		})
	}
}

// A replica that takes several poll intervals to answer (a long prefill) is
// waited for, its client polled all along and found there: the answer is
// read whole.
func TestAnswerAfterSeveralPolls(t *testing.T) {
	r := startTestReplica(t, Config{FirstByteTimeout: 10 * time.Second})
	c, srv := r.connect(t)
	held, _ := clientPair(t)
	head, body := request(10)
	req := readRequest(srv, len(head)+len(body))
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	go func() {
		<-req
		<-time.After(2*pollInterval + pollInterval/2) // the prefill
		srv.Write([]byte(answer))
	}()
	var hd fasthttp.ResponseHeader
	if err := roundTripWithin(t, c, 10, &hd, held, nil); err != nil || hd.StatusCode() != 200 {
		t.Fatalf("%v, status %d", err, hd.StatusCode())
	}
}

// abcStream is a chunked stream of "abc".
const abcStream = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"

// streamABC has srv answer abcStream on c and reads it to its end.
func streamABC(t *testing.T, c *Conn, srv net.Conn) {
	t.Helper()
	b, _ := streamAnswer(t, c, srv, abcStream, false)
	if got, err := readAll(b, 64); err != nil || string(got) != "abc" {
		t.Fatalf("stream %q, %v", got, err)
	}
}

// probes returns a channel that gets a value after each probe of r's
// connections after a stream.
func probes(r *testReplica) <-chan struct{} {
	ch := make(chan struct{}, 4)
	r.probed = func() { ch <- struct{}{} }
	return ch
}

// A replica that closes its connection after a streamed answer without
// saying so (llama.cpp's llama-server does) may read a request sent on it
// in the instant before its close, and drop it. So a connection that
// carried a replica's stream is not reused before the replica was seen
// keeping one: the first is set aside and looked at later, and once the
// replica was seen closing it, none is pooled; a connection that carried a
// whole answer still is.
func TestReplicaThatClosesAfterStreams(t *testing.T) {
	r := startTestReplica(t, Config{TrustIdle: time.Hour})
	probed := probes(r)
	c, srv := r.connect(t)
	streamABC(t, c, srv)
	c.Release(time.Now())
	// The replica closes the connection only now, after the proxy is done
	// with the stream: the reuse of that connection is what must not be.
	srv.Close()
	if len(r.idle) != 0 {
		t.Fatal("a connection that carried a stream was pooled before the replica was seen keeping one")
	}
	c2, srv2 := r.connect(t)
	if c2 == c || c2.Reused {
		t.Fatal("a connection that carried the replica's first stream was reused")
	}
	<-probed
	if r.afterStreams.Load() != streamsClosed || r.KeepsStreamConns() {
		t.Fatal("the replica's close after a stream was not learnt")
	}
	streamABC(t, c2, srv2)
	c2.Release(time.Now())
	if len(r.idle) != 0 || r.probing.Load() {
		t.Fatal("a connection that carried a stream was kept though the replica closes them")
	}
	c3, srv3 := r.connect(t)
	got := serve(srv3, 0, "HTTP/1.1 204 No Content\r\n\r\n")
	var hd fasthttp.ResponseHeader
	if err := roundTripWithin(t, c3, 0, &hd, nil, nil); err != nil {
		t.Fatal(err)
	}
	<-got
	c3.Release(time.Now())
	if len(r.idle) != 1 {
		t.Fatal("a connection that carried a whole answer was not pooled")
	}
}

// A replica that keeps its connection after a stream gets its streamed
// connections reused once that was seen; if it closes one all the same,
// the peek before the reuse finds it and no such connection is pooled
// from then on.
func TestReplicaThatKeepsStreamConns(t *testing.T) {
	r := startTestReplica(t, Config{TrustIdle: time.Hour})
	probed := probes(r)
	for i := 0; i < 2; i++ {
		c, srv := r.connect(t)
		if c.Reused {
			t.Fatalf("stream %d: a connection was reused before the replica was seen keeping one", i)
		}
		streamABC(t, c, srv)
		c.Release(time.Now())
	}
	<-probed
	if !r.KeepsStreamConns() {
		t.Fatal("the replica kept its connection after a stream, and that was not learnt")
	}
	c, srv := r.connect(t)
	streamABC(t, c, srv)
	c.Release(time.Now())
	c2, _ := r.connect(t)
	if c2 != c {
		t.Fatal("a connection that carried a stream was not reused though the replica keeps them")
	}
	streamABC(t, c2, srv)
	c2.Release(time.Now())
	srv.Close()
	untilArrived(t, c.nc.(*net.TCPConn))
	if c3, _ := r.connect(t); c3 == c {
		t.Fatal("a connection that the replica closed was reused")
	}
	if r.afterStreams.Load() != streamsClosed {
		t.Fatal("the replica's close after a stream was not learnt")
	}
}

// A body of known length relayed as it comes is no stream that a replica
// closes after: llama-server keeps its connection after one, however long.
// Its connection is pooled as after a whole answer, and teaches nothing of
// what the replica does after a chunked stream.
func TestLongBodyIsNoStream(t *testing.T) {
	r := startTestReplica(t, Config{TrustIdle: time.Hour})
	c, srv := r.connect(t)
	b, _ := streamAnswer(t, c, srv, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", false)
	if got, err := readAll(b, 64); err != nil || string(got) != "abc" {
		t.Fatalf("body %q, %v", got, err)
	}
	c.Release(time.Now())
	if len(r.idle) != 1 || r.probing.Load() || r.afterStreams.Load() != streamsUnknown {
		t.Fatalf("pooled %d, probing %v, learnt %d: want the connection pooled and nothing learnt", len(r.idle), r.probing.Load(), r.afterStreams.Load())
	}
}

// A probe that a demotion overtook learns nothing: the replica readmitted
// may be another engine, and the probed connection was the old one's.
func TestProbeOvertakenByDemotion(t *testing.T) {
	r := startTestReplica(t, Config{TrustIdle: time.Hour})
	probed := probes(r)
	c, srv := r.connect(t)
	streamABC(t, c, srv)
	c.Release(time.Now())
	if !r.Demote(io.EOF, time.Now()) {
		t.Fatal("not demoted")
	}
	srv.Close() // the old engine's end of the probed connection
	r.readmit()
	<-probed
	if got := r.afterStreams.Load(); got != streamsUnknown {
		t.Fatalf("learnt %d from the connection of the replica before its demotion", got)
	}
}

// A small request that the socket's buffers cannot take whole is written
// in part by the wait for its answer and the rest by a write: the replica
// reads it whole and in order, and its answer is read.
func TestSmallRequestWrittenInPart(t *testing.T) {
	// The replica's receive buffer is set before its connection is
	// accepted, so that the window it offers is small from the start.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1) })
		return nil
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := serveTestReplica(t, Config{StreamIdleTimeout: 5 * time.Second, FirstByteTimeout: 5 * time.Second}, ln)
	c, srv := r.connect(t)
	c.nc.(*net.TCPConn).SetWriteBuffer(1) // the kernel's least, a few KiB
	head, body := request(inWaitWrite - 200)
	want := append(head, body...)
	if len(want) > inWaitWrite {
		t.Fatalf("a %d-byte request is not written by its wait", len(want))
	}
	read := make(chan []byte, 1)
	go func() {
		// The replica reads nothing until the first bytes came, so that
		// the wait's write found the buffers full.
		rc, _ := srv.SyscallConn()
		rc.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return err != unix.EAGAIN
		})
		b := <-readSlowly(srv, len(want), 1<<10)
		srv.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n"))
		read <- b
	}()
	done := make(chan *Error, 1)
	var hd fasthttp.ResponseHeader
	go func() { done <- c.RoundTrip(head, body, &hd, nil, nil, time.Now()) }()
	if err := within(t, done); err != nil || hd.StatusCode() != 204 {
		t.Fatalf("%v, status %d", err, hd.StatusCode())
	}
	if c.outN == 0 || c.outN >= len(want) {
		t.Fatalf("the wait wrote %d bytes of %d, want a part", c.outN, len(want))
	}
	if b := <-read; !bytes.Equal(b, want) {
		t.Fatalf("the replica read %d bytes that differ from the request's %d", len(b), len(want))
	}
}
