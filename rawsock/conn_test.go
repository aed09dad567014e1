package rawsock

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection: the dialed one,
// wrapped, and the accepted one, as it is.
func pair(t testing.TB) (*Conn, *net.TCPConn) {
	t.Helper()
	nc, peer := tcpPair(t)
	w, ok := Wrap(nc).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) is not a *Conn", nc)
	}
	return w, peer
}

// tcpPair is pair with neither end wrapped.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.FailNow()
	}
	t.Cleanup(func() { nc.Close(); peer.Close() })
	return nc.(*net.TCPConn), peer.(*net.TCPConn)
}

func skipUnsupported(t testing.TB) {
	if !supported {
		t.Skip("no raw socket calls on " + runtime.GOOS)
	}
}

func TestWrapLeavesOtherConnections(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe end) = %T, want it unchanged", got)
	}
}

// TestReadWrite sends payloads of every size both ways, from a byte to
// more than the socket buffers hold, and through socket buffers of a few
// kilobytes, which the write fills, so that it waits and goes on where it
// stopped. Every size goes through the raw calls, large ones too (doc.go
// says why).
func TestReadWrite(t *testing.T) {
	skipUnsupported(t)
	for _, tc := range []struct {
		size  int
		small bool
	}{{1, false}, {1500, false}, {64 << 10, false}, {1 << 20, false}, {8 << 20, false}, {64 << 10, true}} {
		size := tc.size
		c, peer := pair(t)
		if tc.small {
			for _, conn := range []*net.TCPConn{c.TCPConn, peer} {
				conn.SetReadBuffer(8 << 10)
				conn.SetWriteBuffer(8 << 10)
			}
		}
		var reads, writes, longest int
		read, write := c.readFn, c.writeFn
		c.readFn = func(fd uintptr) bool { reads++; longest = max(longest, len(c.rp)); return read(fd) }
		c.writeFn = func(fd uintptr) bool { writes++; return write(fd) }
		want := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
		if err := transfer(c, peer, want); err != nil {
			t.Fatalf("size %d, Conn to peer: %v", size, err)
		}
		if err := transfer(peer, c, want); err != nil {
			t.Fatalf("size %d, peer to Conn: %v", size, err)
		}
		if reads == 0 || writes == 0 {
			t.Fatalf("size %d: %d raw reads and %d raw writes, want both made raw", size, reads, writes)
		}
		// transfer reads with a buffer of the payload's size.
		if want := min(size, MaxCall); longest != want {
			t.Fatalf("size %d: the longest raw read was of up to %d bytes, want %d (MaxCall %d)", size, longest, want, MaxCall)
		}
	}
}

// sendAll sends at most MaxCall bytes a call, in order, stops where the
// socket's buffer is full and goes on from there, and stops at an error.
func TestSendAllCapsEachCall(t *testing.T) {
	p := bytes.Repeat([]byte("0123456789abcdef"), (3*MaxCall+5)/16+1)[:3*MaxCall+5]
	for _, tc := range []struct {
		name    string
		takes   []int // what the socket takes, call by call: -1 full, -2 an error
		done    bool
		sent    int
		wantErr bool
	}{
		{"a peer that keeps pace", []int{MaxCall, MaxCall, MaxCall, 5}, true, len(p), false},
		{"short sends, then full", []int{1000, 7, MaxCall, -1}, false, 1007 + MaxCall, false},
		{"full at once", []int{-1}, false, 0, false},
		{"an error after a send", []int{300, -2}, true, 300, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			calls := 0
			send := func(_ uintptr, b []byte) (int, error) {
				if len(b) > MaxCall {
					t.Fatalf("a call of %d bytes, over MaxCall (%d)", len(b), MaxCall)
				}
				if calls >= len(tc.takes) {
					t.Fatalf("call %d, after the socket was full or failed", calls+1)
				}
				take := tc.takes[calls]
				calls++
				switch take {
				case -1:
					return 0, syscall.EAGAIN
				case -2:
					return 0, syscall.EPIPE
				}
				take = min(take, len(b))
				got = append(got, b[:take]...)
				return take, nil
			}
			n := 0
			done, err := sendAll(0, p, &n, send)
			if done != tc.done || n != tc.sent || (err != nil) != tc.wantErr {
				t.Fatalf("sendAll = %v, %v with %d sent; want %v, error %v, %d sent", done, err, n, tc.done, tc.wantErr, tc.sent)
			}
			if !bytes.Equal(got, p[:n]) {
				t.Fatal("the socket got other bytes than p's first")
			}
			if done {
				return
			}
			// Room again: it goes on where it stopped.
			tc.takes = append(tc.takes, len(p), len(p), len(p), len(p))
			if done, err := sendAll(0, p, &n, send); !done || err != nil || n != len(p) || !bytes.Equal(got, p) {
				t.Fatalf("after room came: %v, %v, %d of %d sent", done, err, n, len(p))
			}
		})
	}
}

// transfer writes want to w while it reads r, and reports what went wrong;
// a write that falls short fails the read at its deadline.
func transfer(w io.Writer, r net.Conn, want []byte) error {
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer r.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		n, err := w.Write(want)
		if err == nil && n != len(want) {
			err = fmt.Errorf("wrote %d of %d bytes and no error", n, len(want))
		}
		done <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if err := <-done; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("read other bytes than were written")
	}
	return nil
}

// TestReadWaits reads an empty socket: the read waits for the peer's bytes
// rather than failing with EAGAIN.
func TestReadWaits(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	buf := make([]byte, 16)
	go func() {
		n, err := c.Read(buf)
		got <- result{n, err}
	}()
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || string(buf[:r.n]) != "hello" {
		t.Fatalf("Read = %d, %v (%q); want 5, nil (hello)", r.n, r.err, buf[:r.n])
	}
}

// AwaitReadable returns once bytes are there, and reads none of them; at
// the end of stream it returns too; with nothing coming it waits until
// the read deadline, which is its error.
func TestAwaitReadable(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	done := make(chan error, 1)
	go func() { done <- c.AwaitReadable() }()
	if _, err := peer.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("AwaitReadable with bytes there: %v", err)
	}
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("Read after AwaitReadable = %q, %v; want hi", buf[:n], err)
	}

	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if err := c.AwaitReadable(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("AwaitReadable with nothing coming: %v, want the deadline", err)
	}
	c.SetReadDeadline(time.Time{})

	go func() { done <- c.AwaitReadable() }()
	peer.Close()
	if err := <-done; err != nil {
		t.Fatalf("AwaitReadable at the end of stream: %v", err)
	}
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("Read at the end of stream: %v, want EOF", err)
	}
}

// TestErrors meets each failure through a Conn and through a plain
// *net.TCPConn: the errors must be the ones expected, and of one kind.
func TestErrors(t *testing.T) {
	skipUnsupported(t)
	buf := make([]byte, 16)
	reset := func(_ net.Conn, peer *net.TCPConn) {
		peer.SetLinger(0)
		peer.Close()
	}
	for _, tc := range []struct {
		name  string
		setup func(c net.Conn, peer *net.TCPConn)
		op    func(c net.Conn) error
		check func(err error) bool
		want  string
	}{{
		name:  "end of stream",
		setup: func(_ net.Conn, peer *net.TCPConn) { peer.Close() },
		op:    func(c net.Conn) error { _, err := c.Read(buf); return err },
		check: func(err error) bool { return err == io.EOF },
		want:  "io.EOF itself",
	}, {
		name:  "read deadline",
		setup: func(c net.Conn, _ *net.TCPConn) { c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) },
		op:    func(c net.Conn) error { _, err := c.Read(buf); return err },
		check: func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) && isNetOp(err, "read") },
		want:  "a read's os.ErrDeadlineExceeded",
	}, {
		name:  "reset",
		setup: reset,
		op:    func(c net.Conn) error { _, err := c.Read(buf); return err },
		check: func(err error) bool { return errors.Is(err, syscall.ECONNRESET) && isNetOp(err, "read") },
		want:  "a read's ECONNRESET",
	}, {
		name:  "closed",
		setup: func(c net.Conn, _ *net.TCPConn) { c.Close() },
		op:    func(c net.Conn) error { _, err := c.Read(buf); return err },
		check: func(err error) bool { return errors.Is(err, net.ErrClosed) && isNetOp(err, "read") },
		want:  "a read's net.ErrClosed",
	}, {
		// The peer reads nothing: the socket buffers fill, and the
		// write waits until its deadline.
		name:  "write deadline",
		setup: func(c net.Conn, _ *net.TCPConn) { c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)) },
		op: func(c net.Conn) error {
			chunk := make([]byte, 64<<10)
			for {
				if n, err := c.Write(chunk); err != nil {
					if n == len(chunk) {
						return errors.New("a failed write wrote everything")
					}
					return err
				}
			}
		},
		check: func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) && isNetOp(err, "write") },
		want:  "a write's os.ErrDeadlineExceeded",
	}, {
		name:  "write after reset",
		setup: reset,
		op: func(c net.Conn) error {
			// The first write may land before the reset does.
			for {
				if _, err := c.Write([]byte("x")); err != nil {
					return err
				}
			}
		},
		check: func(err error) bool {
			return (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) && isNetOp(err, "write")
		},
		want: "a write's ECONNRESET or EPIPE",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := pair(t)
			tc.setup(c, peer)
			err := tc.op(c)
			if !tc.check(err) {
				t.Fatalf("error %#v (%v); want %s", err, err, tc.want)
			}
			plain, plainPeer := tcpPair(t)
			tc.setup(plain, plainPeer)
			if got, want := errorKind(err), errorKind(tc.op(plain)); got != want {
				t.Fatalf("error of kind\n\t%s\nwhere *net.TCPConn's is\n\t%s", got, want)
			}
		})
	}
}

// errorKind describes err by what callers test of it: its type, its
// *net.OpError's operation and what that wraps, and the errors it is.
func errorKind(err error) string {
	kind := fmt.Sprintf("%T", err)
	var oe *net.OpError
	if errors.As(err, &oe) {
		kind += fmt.Sprintf(" op=%s err=%T timeout=%v", oe.Op, oe.Err, oe.Timeout())
	}
	for _, target := range []error{io.EOF, net.ErrClosed, os.ErrDeadlineExceeded, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, target) {
			kind += fmt.Sprintf(" is %q", target)
		}
	}
	return kind
}

func isNetOp(err error, op string) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == op
}

// TestConcurrentReads reads from two goroutines at once, which net.Conn
// allows: every byte arrives once, in order within each read.
func TestConcurrentReads(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	const total = 1 << 20
	type piece struct{ b []byte }
	pieces := make(chan piece, 1024)
	read := func(done chan<- error) {
		for {
			buf := make([]byte, 1000)
			n, err := c.Read(buf)
			if n > 0 {
				pieces <- piece{buf[:n]}
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				done <- err
				return
			}
		}
	}
	done := make(chan error, 2)
	go read(done)
	go read(done)
	src := make([]byte, total)
	for i := range src {
		src[i] = byte(i % 251)
	}
	go func() {
		peer.Write(src)
		peer.CloseWrite()
	}()
	var n int
	for finished := 0; finished < 2; {
		select {
		case p := <-pieces:
			n += len(p.b)
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished++
		}
	}
	for len(pieces) > 0 {
		n += len((<-pieces).b)
	}
	if n != total {
		t.Fatalf("read %d bytes, want %d", n, total)
	}
}

func TestReadWriteAllocateNothing(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	msg, buf := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a write and a read allocate %.1f times, want 0", allocs)
	}
}
