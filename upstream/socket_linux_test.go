package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warmroute/warmroute/rawsock"
)

// untilReadable returns once c's socket holds a byte to read: the kernel
// has what the other end wrote.
func untilReadable(t *testing.T, c *Conn) {
	t.Helper()
	for {
		var readable bool
		c.rc.Control(func(fd uintptr) {
			_, err := rawsock.Peek(fd, &c.peekBuf)
			readable = err == nil
		})
		if readable {
			return
		}
		runtime.Gosched()
	}
}

// A reset that reaches a parked wait's read (the replica crashed while
// the relay wrote to its client) is a reset, not the stream's end: the
// read consumes the socket's error, and a read after it would see an end
// of stream.
func TestParkedWaitKeepsAReset(t *testing.T) {
	c, end := startTestReplica(t, Config{}).connect(t)
	srv := end.(*net.TCPConn)
	srv.Write([]byte("ab"))
	untilReadable(t, c)
	if err := c.AwaitMore(nil, PhaseStream); err != nil {
		t.Fatal(err)
	}
	c.Reader.Discard(2)
	srv.SetLinger(0)
	srv.Close() // a reset
	untilClosed(t, c)
	err := c.AwaitMore(nil, PhaseStream)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after a reset: %v, want ECONNRESET", err)
	}
}

// What a parked wait reads was written after what the writer did before
// its write, as with any read of a socket: under -race, the wait's read
// must tell the race detector so (rawsock/raw_race_linux.go), or this test
// reports a race that is not there; and a read buffer used after it went
// back to the pool would be reported as one.
func TestParkedWaitOrdersWithTheWriter(t *testing.T) {
	c, srv := startTestReplica(t, Config{}).connect(t)
	var x int
	wrote := make(chan struct{})
	go func() {
		x = 42
		srv.Write([]byte("a"))
		close(wrote)
	}()
	if err := c.AwaitMore(nil, PhaseStream); err != nil {
		t.Fatal(err)
	}
	if x != 42 {
		t.Fatalf("x = %d after the byte came, want 42", x)
	}
	<-wrote
}

// untilClosed returns once c's socket is in TCP_CLOSE: a reset reached it.
// TCP_INFO reads the state without consuming the socket's error.
func untilClosed(t *testing.T, c *Conn) {
	t.Helper()
	for {
		var state uint8
		c.rc.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = info.State
			}
		})
		if state == 7 { // TCP_CLOSE
			return
		}
		runtime.Gosched()
	}
}

// sendRequest is a request with a body of n bytes, for Send.
func sendRequest(n int) (head, body []byte) {
	head = []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n")
	body = make([]byte, n)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return head, body
}

// countSends wraps c's write-inside-the-wait function: calls counts its
// calls, first is what the first one wrote, and wrote is closed after it.
func countSends(c *Conn) (calls, first *int, wrote chan struct{}) {
	calls, first, wrote = new(int), new(int), make(chan struct{})
	write := c.writeThenWait
	c.sendFn = func(fd uintptr) bool {
		*calls++
		stop := write(fd)
		if *calls == 1 {
			*first = c.sendN
			close(wrote)
		}
		return stop
	}
	return calls, first, wrote
}

// Send writes a request inside its wait for the answer: the replica gets
// the request whole, the answer is read whole, and what the sender did
// before Send is ordered before what the replica does after reading the
// request (under -race, rawsock/raw_race_linux.go's write tells the race
// detector so; the raw writev does not, and this test then reports a race).
func TestSendWritesInsideTheWait(t *testing.T) {
	c, srv := startTestReplica(t, Config{}).connect(t)
	calls, _, _ := countSends(c)
	head, body := sendRequest(2000)
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	var x int
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(head)+len(body))
		io.ReadFull(srv, b)
		if x != 42 {
			b = nil
		}
		got <- b
		srv.Write([]byte(answer))
	}()
	x = 42
	if err := c.Send(head, body, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, append(head, body...)) {
		t.Fatalf("the replica read %d bytes that differ from the request, or before x was set", len(b))
	}
	if *calls == 0 || c.sendN != len(head)+len(body) {
		t.Fatalf("the request was not written inside the wait: %d calls, %d bytes written", *calls, c.sendN)
	}
	a := make([]byte, len(answer))
	if _, err := io.ReadFull(c.Reader, a); err != nil || string(a) != answer {
		t.Fatalf("read %q, %v; want %q", a, err, answer)
	}
}

// connectSmallBuffers is connect with 4 KiB socket buffers on both ends,
// so that a large request fills them before the replica reads it.
func connectSmallBuffers(t *testing.T, cfg Config) (*Conn, net.Conn) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, srv := startTestReplicaOn(t, ln, cfg).connect(t)
	c.rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) })
	return c, srv
}

// A request that the socket takes only in part is written whole: the
// rest goes after the short write, in order, whether the write ended in
// the body or in the head.
func TestSendFinishesAShortWrite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pad, body int // bytes of a padding header, of the body
	}{
		{"in the body", 0, 60 << 10},
		{"in the head", 60 << 10, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A lost rest fails in 5 s, not at the test's timeout.
			c, srv := connectSmallBuffers(t, Config{FirstByteTimeout: 5 * time.Second})
			_, first, wrote := countSends(c)
			head, body := sendRequest(tc.body)
			if tc.pad > 0 {
				pad := append([]byte("X-Pad: "), bytes.Repeat([]byte{'p'}, tc.pad)...)
				head = append(append(head[:len(head)-2:len(head)-2], pad...), "\r\n\r\n"...)
			}
			answer := "HTTP/1.1 204 No Content\r\n\r\n"
			got := make(chan []byte, 1)
			go func() {
				<-wrote // the replica reads nothing before the first write is done
				b := make([]byte, len(head)+len(body))
				io.ReadFull(srv, b)
				got <- b
				srv.Write([]byte(answer))
			}()
			if err := c.Send(head, body, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			if *first >= len(head) && tc.pad > 0 || *first >= len(head)+len(body) {
				t.Fatalf("the socket took %d of %d bytes at once, of a %d-byte head: this test measures nothing", *first, len(head)+len(body), len(head))
			}
			if b := <-got; !bytes.Equal(b, append(head, body...)) {
				t.Fatalf("the replica read %d bytes that differ from the request", len(b))
			}
			if b, _ := c.Reader.Peek(len(answer)); string(b) != answer {
				t.Fatalf("read %q, want %q", b, answer)
			}
		})
	}
}

// The rest of a short write has a write deadline: a replica that stopped
// reading does not hold the request forever.
func TestSendBoundsTheRestOfAShortWrite(t *testing.T) {
	c, _ := connectSmallBuffers(t, Config{StreamIdleTimeout: 100 * time.Millisecond})
	head, body := sendRequest(60 << 10) // the replica reads none of it
	done := make(chan error, 1)
	go func() { done <- c.Send(head, body, nil, time.Now()) }()
	select {
	case err := <-done:
		var e *Error
		if !errors.As(err, &e) || e.Phase != PhaseWrite || e.Sign != SignTimeout {
			t.Fatalf("a replica that reads nothing: %v, want a PhaseWrite timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the rest of a short write waited 10 s on a replica that reads nothing, with StreamIdleTimeout 100ms")
	}
}

// Send's errors are Write's and AwaitFirst's: a reset before the write is
// a failed write (the request went nowhere, so it may go to another
// replica), a closed connection too, and a wait whose deadline passed
// before it began still sends the request and times out as AwaitFirst.
func TestSendErrors(t *testing.T) {
	r := startTestReplica(t, Config{FirstByteTimeout: 50 * time.Millisecond})
	head, body := sendRequest(500)

	c, end := r.connect(t)
	srv := end.(*net.TCPConn)
	srv.SetLinger(0)
	srv.Close() // a reset
	untilClosed(t, c)
	calls, _, _ := countSends(c)
	var e *Error
	err := c.Send(head, body, nil, time.Now())
	if !errors.As(err, &e) || e.Phase != PhaseWrite || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("a reset connection: %v, want a PhaseWrite reset", err)
	}
	if *calls != 1 {
		t.Fatalf("a reset connection: %d calls of the write inside the wait, want 1 (its write failed)", *calls)
	}

	c, _ = r.connect(t)
	c.nc.Close()
	if err := c.Send(head, body, nil, time.Now()); !errors.As(err, &e) || e.Phase != PhaseWrite {
		t.Fatalf("a closed connection: %v, want PhaseWrite", err)
	}

	c, end = r.connect(t)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(head)+len(body))
		io.ReadFull(end, b)
		got <- b
	}()
	err = c.Send(head, body, nil, time.Now().Add(-time.Second))
	if !errors.As(err, &e) || e.Phase != PhaseAwait || !errors.Is(err, ErrTimeout) {
		t.Fatalf("a deadline already past: %v, want a PhaseAwait timeout", err)
	}
	if b := <-got; !bytes.Equal(b, append(head, body...)) {
		t.Fatalf("the replica read %d bytes that differ from the request", len(b))
	}
}

// A pooled connection is written inside the wait only if it sat idle less
// than recentIdle: one idle longer may have been closed by its replica,
// and a half close (a FIN after which the replica still reads) that the
// poller reported before the wait would go unseen by it (Send). Write and
// AwaitFirst read the FIN at once, while the request is unacknowledged,
// so the request goes again on a fresh connection.
func TestSendAfterAHalfClose(t *testing.T) {
	r := startTestReplica(t, Config{FirstByteTimeout: 5 * time.Second, TrustIdle: time.Hour})
	c, end := r.connect(t)
	srv := end.(*net.TCPConn)
	head, body := sendRequest(100)
	answer := "HTTP/1.1 204 No Content\r\n\r\n"
	exchange := func(c *Conn) {
		go func() {
			io.ReadFull(srv, make([]byte, len(head)+len(body)))
			srv.Write([]byte(answer))
		}()
		if err := c.Send(head, body, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		c.Reader.Discard(len(answer))
	}
	exchange(c)
	t0 := time.Now()
	c.Release(t0)
	c, err := r.Acquire(t0.Add(recentIdle / 2))
	if err != nil || !c.recent {
		t.Fatalf("a connection idle %v: %v, recent %v", recentIdle/2, err, c.recent)
	}
	calls, _, _ := countSends(c)
	exchange(c)
	if *calls == 0 {
		t.Fatal("a connection idle less than recentIdle was not written inside the wait")
	}

	c.Release(t0)
	srv.CloseWrite()
	untilReadable(t, c)
	c, err = r.Acquire(t0.Add(recentIdle))
	if err != nil || c.recent {
		t.Fatalf("a connection idle %v: %v, recent %v", recentIdle, err, c.recent)
	}
	calls, _, _ = countSends(c)
	err = c.Send(head, body, nil, time.Now())
	var e *Error
	if !errors.As(err, &e) || e.Phase != PhaseAwait || *calls != 0 {
		t.Fatalf("after a half close: %v (%d writes inside the wait), want a PhaseAwait error from Write and AwaitFirst", err, *calls)
	}
	if v := Judge(e); v.Result != NotSent || v.Resend != Fresh {
		t.Fatalf("after a half close: %v judged %+v, want not sent, resent on a fresh connection", err, v)
	}
}

// countWrites wraps c's raw write function, as countSends does Send's:
// calls counts its calls, and first is what the first one wrote.
func countWrites(c *Conn) (calls, first *int) {
	calls, first = new(int), new(int)
	write := c.writeRaw
	c.writeFn = func(fd uintptr) bool {
		*calls++
		stop := write(fd)
		if *calls == 1 {
			*first = c.sendN
		}
		return stop
	}
	return calls, first
}

// readRequest reads n bytes of srv in the background, for at most 10 s:
// a request cut short is sent as what was read.
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

// writeWithin is c.Write(head, body), failing t if it has not returned
// within 10 s.
func writeWithin(t *testing.T, c *Conn, head, body []byte) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Write(head, body) }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Write did not return in 10 s")
		return nil
	}
}

// Write sends a request of up to 64 KiB with one raw writev: the replica
// reads it whole, a write deadline that an earlier large request left
// does not fail it, a request that the socket takes only in part is
// finished after the short write, and a reset is a failed write.
func TestWriteIsOneRawWritev(t *testing.T) {
	t.Run("whole, after a large request's deadline", func(t *testing.T) {
		c, srv := startTestReplica(t, Config{}).connect(t)
		calls, _ := countWrites(c)
		c.nc.SetWriteDeadline(time.Now().Add(-time.Second))
		c.hadWriteDeadline = true
		head, body := sendRequest(2000)
		got := readRequest(srv, len(head)+len(body))
		if err := writeWithin(t, c, head, body); err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, append(head, body...)) {
			t.Fatalf("the replica read %d bytes that differ from the request", len(b))
		}
		if *calls != 1 || c.sendN != len(head)+len(body) {
			t.Fatalf("the request was not one raw writev: %d calls, %d bytes written", *calls, c.sendN)
		}
	})
	t.Run("short", func(t *testing.T) {
		// A lost rest fails in 5 s, not at the test's timeout.
		c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 5 * time.Second})
		calls, first := countWrites(c)
		head, body := sendRequest(60 << 10)
		got := readRequest(srv, len(head)+len(body))
		if err := writeWithin(t, c, head, body); err != nil {
			t.Fatal(err)
		}
		if *calls < 2 || *first >= len(head)+len(body) {
			t.Fatalf("%d calls, the socket took %d of %d bytes at once: this test measures nothing", *calls, *first, len(head)+len(body))
		}
		if b := <-got; !bytes.Equal(b, append(head, body...)) {
			t.Fatalf("the replica read %d bytes that differ from the request", len(b))
		}
	})
	t.Run("reset", func(t *testing.T) {
		c, end := startTestReplica(t, Config{}).connect(t)
		srv := end.(*net.TCPConn)
		srv.SetLinger(0)
		srv.Close()
		untilClosed(t, c)
		head, body := sendRequest(500)
		var e *Error
		err := writeWithin(t, c, head, body)
		if !errors.As(err, &e) || e.Phase != PhaseWrite || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("a reset connection: %v, want a PhaseWrite reset", err)
		}
	})
}

// A request over 64 KiB (an agent's context) is written as raw writevs
// too, not through the runtime's bookkept writev (rawsock's doc says why):
// the replica reads it whole through socket buffers that it fills many
// times over, and one that reads nothing fails the write at its deadline.
func TestLargeWriteIsRaw(t *testing.T) {
	t.Run("whole", func(t *testing.T) {
		c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 5 * time.Second})
		calls, _ := countWrites(c)
		head, body := sendRequest(1 << 20)
		got := readRequest(srv, len(head)+len(body))
		if err := writeWithin(t, c, head, body); err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, append(head, body...)) {
			t.Fatalf("the replica read %d bytes that differ from the request", len(b))
		}
		if *calls < 2 {
			t.Fatalf("%d raw write calls for 1 MiB through small socket buffers, want the waits between them", *calls)
		}
	})
	t.Run("a replica that reads nothing", func(t *testing.T) {
		c, _ := connectSmallBuffers(t, Config{StreamIdleTimeout: 100 * time.Millisecond})
		calls, _ := countWrites(c)
		head, body := sendRequest(1 << 20)
		err := writeWithin(t, c, head, body)
		var e *Error
		if !errors.As(err, &e) || e.Phase != PhaseWrite || e.Sign != SignTimeout {
			t.Fatalf("a replica that reads nothing: %v, want a PhaseWrite timeout", err)
		}
		if *calls == 0 {
			t.Fatal("the write went through the bookkept writev")
		}
	})
}

// writevAll writes head and body in order, at most rawsock.MaxCall bytes
// a call, wherever the socket's short writes leave it: in the head, at its
// end, in the body; it stops where the buffer is full and goes on from
// there, and stops at an error.
func TestWritevAllCapsEachCall(t *testing.T) {
	const limit = rawsock.MaxCall
	for _, tc := range []struct {
		name         string
		headN, bodyN int
		takes        []int // what the socket takes, call by call: -1 full, -2 an error
		done         bool
		sent         int
	}{
		{"a large body", 300, 3*limit + 5, []int{limit, limit, limit, limit}, true, 300 + 3*limit + 5},
		{"a large head, no body", 2*limit + 1, 0, []int{limit, limit, 1}, true, 2*limit + 1},
		{"no head", 0, limit + 1, []int{limit, 1}, true, limit + 1},
		{"short in the head, then full", limit + 10, limit, []int{7, limit, -1}, false, 7 + limit},
		{"short at the head's end", 500, 2 * limit, []int{500, limit, limit}, true, 500 + 2*limit},
		{"an error", 300, limit, []int{100, -2}, true, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := make([]byte, tc.headN)
			for i := range head {
				head[i] = byte('A' + i%26)
			}
			body := make([]byte, tc.bodyN)
			for i := range body {
				body[i] = byte('a' + i%23)
			}
			var got []byte
			calls := 0
			writev := func(_ uintptr, iov *[2]iovec) (int, error) {
				b := append(unsafe.Slice(iov[0].Base, iov[0].Len), unsafe.Slice(iov[1].Base, iov[1].Len)...)
				if len(b) > limit {
					t.Fatalf("a writev of %d bytes, over rawsock.MaxCall (%d)", len(b), limit)
				}
				if calls >= len(tc.takes) {
					t.Fatalf("writev %d, after the socket was full or failed", calls+1)
				}
				take := tc.takes[calls]
				calls++
				switch take {
				case -1:
					return 0, nil
				case -2:
					return 0, syscall.EPIPE
				}
				take = min(take, len(b))
				got = append(got, b[:take]...)
				return take, nil
			}
			var iov [2]iovec
			n := 0
			done, err := writevAll(0, &iov, head, body, &n, writev)
			if done != tc.done || n != tc.sent || (err != nil) != (tc.takes[len(tc.takes)-1] == -2) {
				t.Fatalf("writevAll = %v, %v with %d sent; want %v, %d sent", done, err, n, tc.done, tc.sent)
			}
			whole := append(append([]byte{}, head...), body...)
			if !bytes.Equal(got, whole[:n]) {
				t.Fatal("the socket got other bytes than the request's first")
			}
			if done {
				return
			}
			tc.takes = append(tc.takes, limit, limit, limit, limit)
			if done, err := writevAll(0, &iov, head, body, &n, writev); !done || err != nil || !bytes.Equal(got, whole) {
				t.Fatalf("after room came: %v, %v, %d of %d sent", done, err, n, len(whole))
			}
		})
	}
}
