//go:build linux

package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// reviewRequest is a request with a head of about headN bytes (padded
// with a header) and a body of bodyN bytes; either may be empty.
func reviewRequest(headN, bodyN int) (head, body []byte) {
	if headN > 0 {
		head = []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n")
		if pad := headN - len(head) - len("X-Pad: \r\n\r\n"); pad > 0 {
			head = append(head, "X-Pad: "...)
			for i := 0; i < pad; i++ {
				head = append(head, byte('A'+i%23))
			}
			head = append(head, "\r\n"...)
		}
		head = append(head, "\r\n"...)
	}
	body = make([]byte, bodyN)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return head, body
}

// readSlowly reads n bytes of srv in pieces of at most step bytes, each
// read only after the writer has had to wait for room (waited), so that
// every piece of the request crosses a full socket buffer.
func readSlowly(srv net.Conn, n, step int, waited <-chan struct{}) <-chan []byte {
	got := make(chan []byte, 1)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		b := make([]byte, 0, n)
		buf := make([]byte, step)
		for len(b) < n {
			if waited != nil {
				select {
				case <-waited:
				case <-time.After(10 * time.Second):
					got <- b
					return
				}
			}
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

// countWaits wraps c's raw write function: each call that asks to wait
// (the socket's buffer full) sends on the returned channel, without
// blocking the writer.
func countWaits(c *Conn) (calls *int, waits <-chan struct{}) {
	calls = new(int)
	ch := make(chan struct{}, 1<<16)
	write := c.writeRaw
	c.writeFn = func(fd uintptr) bool {
		*calls++
		done := write(fd)
		if !done {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return done
	}
	return calls, ch
}

// Every split of a request larger than the socket's buffers arrives whole
// and in order: the head alone, the body alone, the head split across
// many writes, the split between head and body, and through Write's short
// raw writev (head split in the first writev, rest written by writeAll).
func TestReviewLargeWriteSplits(t *testing.T) {
	for _, tc := range []struct {
		name         string
		head, body   int
		step         int
		waitBeforeRd bool
	}{
		{"large head, no body", 200 << 10, 0, 3000, false},
		{"no head, large body", 0, 200 << 10, 3000, false},
		{"head split many times, then body", 100 << 10, 100 << 10, 1777, false},
		{"small head, large body, odd reads", 37, 300 << 10, 4099, false},
		{"short raw writev split in the head", 60 << 10, 10, 2500, false},
		{"short raw writev, no body", 60 << 10, 0, 2500, false},
		{"short raw writev, no head", 0, 60 << 10, 2500, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 5 * time.Second})
			calls, waits := countWaits(c)
			head, body := reviewRequest(tc.head, tc.body)
			want := append(append([]byte{}, head...), body...)
			var w <-chan struct{}
			if tc.waitBeforeRd {
				w = waits
			}
			got := readSlowly(srv, len(want), tc.step, w)
			if err := writeWithin(t, c, head, body); err != nil {
				t.Fatal(err)
			}
			b := <-got
			if !bytes.Equal(b, want) {
				i := 0
				for i < len(b) && i < len(want) && b[i] == want[i] {
					i++
				}
				t.Fatalf("the replica read %d bytes of %d, differing from byte %d", len(b), len(want), i)
			}
			if *calls < 2 {
				t.Fatalf("%d raw write calls: the socket took the whole request at once, this test measures nothing", *calls)
			}
		})
	}
}

// drain reads srv until its end (c closed) and returns what came.
func drain(t *testing.T, srv net.Conn) []byte {
	t.Helper()
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(srv)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("draining the replica's end: %v", err)
	}
	return b
}

// A replica that reads part of a large request and then stops: the write
// fails at its deadline as a PhaseWrite timeout, judged not sent (another
// replica gets it), and what the replica got is an exact prefix of the
// request, shorter than it: nothing written twice or skipped around the
// waits.
func TestReviewDeadlineMidRequest(t *testing.T) {
	c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 300 * time.Millisecond})
	head, body := reviewRequest(30<<10, 300<<10)
	want := append(append([]byte{}, head...), body...)
	const part = 50 << 10
	first := readRequest(srv, part)
	err := writeWithin(t, c, head, body)
	var e *Error
	if !errors.As(err, &e) || e.Phase != PhaseWrite || e.Sign != SignTimeout {
		t.Fatalf("a replica that stopped reading mid-request: %v, want a PhaseWrite timeout", err)
	}
	if v := Judge(e); v.Result != NotSent || v.Resend != Other || !v.Demote {
		t.Fatalf("judged %+v", v)
	}
	got := <-first
	c.Close()
	got = append(got, drain(t, srv)...)
	if len(got) >= len(want) || !bytes.Equal(got, want[:len(got)]) {
		t.Fatalf("the replica got %d bytes of a %d-byte request, not a proper prefix of it", len(got), len(want))
	}
	if len(got) < part {
		t.Fatalf("the replica got %d bytes, fewer than the %d it read", len(got), part)
	}
}

// A replica that resets the connection after reading part of a large
// request: a PhaseWrite reset (ECONNRESET or EPIPE), at once, not at the
// deadline.
func TestReviewResetMidRequest(t *testing.T) {
	c, end := connectSmallBuffers(t, Config{StreamIdleTimeout: 30 * time.Second})
	srv := end.(*net.TCPConn)
	head, body := reviewRequest(500, 1<<20)
	const part = 40 << 10
	first := readRequest(srv, part)
	reset := make(chan struct{})
	go func() {
		<-first
		srv.SetLinger(0)
		srv.Close()
		close(reset)
	}()
	start := time.Now()
	err := writeWithin(t, c, head, body)
	<-reset
	var e *Error
	if !errors.As(err, &e) || e.Phase != PhaseWrite || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("a replica that reset mid-request: %v, want a PhaseWrite reset", err)
	}
	if e.Sign == SignTimeout {
		t.Fatalf("a reset judged a timeout: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the reset was found after %v", d)
	}
}

// A replica that closes (FIN, then a reset for what comes after) mid-request.
func TestReviewCloseMidRequest(t *testing.T) {
	c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 30 * time.Second})
	head, body := reviewRequest(500, 1<<20)
	first := readRequest(srv, 40<<10)
	go func() {
		<-first
		srv.Close()
	}()
	err := writeWithin(t, c, head, body)
	var e *Error
	if !errors.As(err, &e) || e.Phase != PhaseWrite || e.Sign == SignTimeout {
		t.Fatalf("a replica that closed mid-request: %v, want a PhaseWrite failure", err)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("a replica that closed mid-request: %v, want ECONNRESET or EPIPE", err)
	}
}

// The connection closed (Close, as when its request is cancelled) while a
// large write waits for room: the write ends at once as a PhaseWrite
// failure, not at its deadline.
func TestReviewCloseWhileWriteWaits(t *testing.T) {
	c, _ := connectSmallBuffers(t, Config{StreamIdleTimeout: 30 * time.Second})
	_, waits := countWaits(c)
	head, body := reviewRequest(500, 1<<20)
	done := make(chan error, 1)
	go func() { done <- c.Write(head, body) }()
	select {
	case <-waits:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never waited for room")
	}
	start := time.Now()
	c.nc.Close()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a write on a closed connection still waits after 10 s")
	}
	var e *Error
	if !errors.As(err, &e) || e.Phase != PhaseWrite || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed while waiting: %v, want a PhaseWrite net.ErrClosed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// A large request on a connection whose earlier large request left a
// write deadline that has since passed goes through: write sets its own.
// And a small request after the large one is not failed by its deadline.
func TestReviewStaleDeadline(t *testing.T) {
	c, srv := startTestReplica(t, Config{StreamIdleTimeout: 5 * time.Second}).connect(t)
	c.nc.SetWriteDeadline(time.Now().Add(-time.Second))
	c.hadWriteDeadline = true
	head, body := reviewRequest(100, 200<<10)
	got := readRequest(srv, len(head)+len(body))
	if err := writeWithin(t, c, head, body); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, append(head, body...)) {
		t.Fatal("the replica read other bytes")
	}
	c.nc.SetWriteDeadline(time.Now().Add(-time.Second)) // as if it had passed
	head, body = reviewRequest(100, 1000)
	got = readRequest(srv, len(head)+len(body))
	if err := writeWithin(t, c, head, body); err != nil {
		t.Fatalf("a small request after a large one whose deadline passed: %v", err)
	}
	if b := <-got; !bytes.Equal(b, append(head, body...)) {
		t.Fatal("the replica read other bytes")
	}
}

// Send of a large request to a replica that reads it slowly, answers and
// is awaited: the request arrives whole, the answer is found.
func TestReviewSendLarge(t *testing.T) {
	c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 5 * time.Second, FirstByteTimeout: 5 * time.Second})
	head, body := reviewRequest(300, 500<<10)
	answer := "HTTP/1.1 204 No Content\r\n\r\n"
	got := readSlowly(srv, len(head)+len(body), 3333, nil)
	res := make(chan []byte, 1)
	go func() {
		b := <-got
		srv.Write([]byte(answer))
		res <- b
	}()
	if err := c.Send(head, body, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if b := <-res; !bytes.Equal(b, append(head, body...)) {
		t.Fatalf("the replica read %d bytes that differ", len(b))
	}
	if b, _ := c.Reader.Peek(len(answer)); string(b) != answer {
		t.Fatalf("read %q", b)
	}
}
