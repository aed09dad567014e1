package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func reviewPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i%251) ^ seed
	}
	return b
}

// countRawWrites wraps c's raw write function: waits gets a value each
// time the write asks to wait for room.
func countRawWrites(c *Conn) (waits <-chan struct{}) {
	ch := make(chan struct{}, 1<<16)
	write := c.writeFn
	c.writeFn = func(fd uintptr) bool {
		done := write(fd)
		if !done {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return done
	}
	return ch
}

// A large Write cut by its deadline (a client that reads a huge answer
// too slowly) returns exactly the bytes that went: the peer, reading
// afterwards to the end, gets n bytes, a prefix of p; the error is a
// write's timeout, as *net.TCPConn's.
func TestReviewLargeWriteDeadlineCount(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	p := reviewPattern(16<<20, 7)
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := c.Write(p)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !isNetOp(err, "write") {
		t.Fatalf("Write past its deadline: %d, %v; want a write's timeout", n, err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%v is not a net.Error timeout", err)
	}
	if n <= 0 || n >= len(p) {
		t.Fatalf("Write wrote %d of %d bytes before its deadline: this test measures nothing", n, len(p))
	}
	c.CloseWrite()
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n || !bytes.Equal(got, p[:n]) {
		t.Fatalf("the peer got %d bytes, Write reported %d (prefix equal: %v)", len(got), n, bytes.Equal(got, p[:min(len(got), len(p))]))
	}
}

// A Write waiting for room is ended at once by a deadline moved into the
// past from another goroutine (how the router interrupts a write).
func TestReviewLargeWriteInterrupted(t *testing.T) {
	skipUnsupported(t)
	c, _ := pair(t)
	waits := countRawWrites(c)
	p := reviewPattern(16<<20, 1)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(p)
		done <- err
	}()
	select {
	case <-waits:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never waited for room")
	}
	c.SetWriteDeadline(time.Now().Add(-time.Second))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) || !isNetOp(err, "write") {
			t.Fatalf("interrupted write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write whose deadline was moved into the past still waits after 10 s")
	}
}

// Large Reads and Writes at once on one Conn, both ways: every byte
// arrives once and in order each way.
func TestReviewFullDuplexLarge(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	const size = 8 << 20
	out, in := reviewPattern(size, 3), reviewPattern(size, 5)
	errs := make(chan error, 4)
	go func() { // c writes
		n, err := c.Write(out)
		if err == nil && n != size {
			err = errors.New("short write")
		}
		errs <- err
	}()
	go func() { // c reads, in large reads
		got := make([]byte, 0, size)
		buf := make([]byte, 3<<20)
		for len(got) < size {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				errs <- err
				return
			}
		}
		if !bytes.Equal(got, in) {
			errs <- errors.New("c read other bytes than the peer wrote")
			return
		}
		errs <- nil
	}()
	go func() {
		_, err := peer.Write(in)
		errs <- err
	}()
	go func() {
		got := make([]byte, size)
		_, err := io.ReadFull(peer, got)
		if err == nil && !bytes.Equal(got, out) {
			err = errors.New("the peer read other bytes than c wrote")
		}
		errs <- err
	}()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	peer.SetDeadline(time.Now().Add(20 * time.Second))
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// Two large Writes at once (the second *net.TCPConn's): neither's bytes
// come in the middle of the other's.
func TestReviewConcurrentLargeWrites(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	const size = 4 << 20
	a, b := bytes.Repeat([]byte{'a'}, size), bytes.Repeat([]byte{'b'}, size)
	waits := countRawWrites(c)
	errs := make(chan error, 2)
	go func() { _, err := c.Write(a); errs <- err }()
	select {
	case <-waits: // a's raw write waits for room, holding the write lock
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never waited")
	}
	go func() { _, err := c.Write(b); errs <- err }()
	peer.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, 2*size)
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got[:size], a) || !bytes.Equal(got[size:], b) {
		t.Fatal("the two writes' bytes are interleaved")
	}
}

// A large Write to a peer that resets mid-way: the error is a write's
// ECONNRESET or EPIPE, at once, as *net.TCPConn's.
func TestReviewLargeWriteReset(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	waits := countRawWrites(c)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(reviewPattern(32<<20, 9))
		done <- err
	}()
	select {
	case <-waits:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never waited")
	}
	peer.SetLinger(0)
	peer.Close()
	select {
	case err := <-done:
		if !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) || !isNetOp(err, "write") {
			t.Fatalf("a write to a peer that reset: %#v (%v)", err, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write to a peer that reset still waits after 10 s")
	}
}

// A large Read given as much as is there returns it, and one with nothing
// more coming ends at its deadline, as *net.TCPConn's.
func TestReviewLargeRead(t *testing.T) {
	skipUnsupported(t)
	c, peer := pair(t)
	want := reviewPattern(100<<10, 2)
	if _, err := peer.Write(want); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32<<20)
	var got []byte
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < len(want) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read other bytes")
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !isNetOp(err, "read") {
		t.Fatalf("a large read with nothing coming: %d, %v", n, err)
	}
}
