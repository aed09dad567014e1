package upstream

import (
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// untilReadable returns once c's socket holds a byte to read: the kernel
// has what the other end wrote.
func untilReadable(t *testing.T, c *Conn) {
	t.Helper()
	for {
		var readable bool
		c.rc.Control(func(fd uintptr) {
			_, err := peekByte(fd, &c.peekBuf)
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
// must tell the race detector so (readsocket_race_linux.go), or this test
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
