package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
)

// MaxCall is the most bytes that one raw call copies. A send(2) or
// recv(2) on a socket that does not block goes on copying for as long as
// the other end keeps pace, and inside a raw call the goroutine cannot be
// preempted: its P's other goroutines and timers, and a stop-the-world,
// wait for the whole call. With one P, a 1 ms sleep beside 64 MiB
// requests written raw to a replica on the loopback took up to 215 ms,
// and 26 ms in calls of 256 KiB (timing-session12.txt in the results),
// which copy in tens of microseconds, with a preemption point between
// two.
const MaxCall = 256 << 10

// Conn is a TCP connection whose Read and Write are raw system calls. A
// call's state lives in the Conn, so that a call allocates nothing; a Read
// made while another is under way (or a Write while another is) is
// *net.TCPConn's own, which waits for the first one. fasthttp's server and
// upstream.Conn make one at a time.
type Conn struct {
	*net.TCPConn
	rc               syscall.RawConn
	readFn, writeFn  func(fd uintptr) bool
	peekFn           func(fd uintptr) bool
	closedFn         func(fd uintptr)
	peeked           [1]byte // AwaitReadable's byte, not kept
	probed           [1]byte // PeerClosed's byte, not kept
	closed           bool    // what PeerClosed's probe found
	reading, writing atomic.Bool
	probing          atomic.Bool

	rp   []byte // the Read under way
	rn   int
	rerr error
	wp   []byte // the Write under way
	wn   int
	werr error
}

// Wrap returns nc as a *Conn where nc is a *net.TCPConn on a system that
// has the raw calls (Linux), and nc itself elsewhere.
func Wrap(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok || !supported {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	c := &Conn{TCPConn: tc, rc: rc}
	c.readFn, c.writeFn, c.peekFn, c.closedFn = c.read, c.write, c.peek, c.probe
	return c
}

// SyscallConn returns the RawConn that c was wrapped with: the
// *net.TCPConn's own method makes a new one each call.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// AwaitReadable waits until a read of c would not wait: bytes, the end of
// stream or an error are there. It reads nothing, and holds no buffer
// while it waits. Its error is the wait's: the read deadline, or c closed.
func (c *Conn) AwaitReadable() error {
	return c.rc.Read(c.peekFn)
}

// peek is AwaitReadable's RawConn function: false (wait for the poller)
// while the socket has nothing to read.
func (c *Conn) peek(fd uintptr) bool {
	_, err := Peek(fd, &c.peeked)
	return err != syscall.EAGAIN
}

// PeerClosed reports whether the other end has closed the connection or
// reset it, without waiting and without consuming a byte. It sees only the
// next byte: while unread bytes are there (a pipelined request), it reports
// false, even if a close or a reset came after them. The proxy asks it of a
// client every poll of a long wait (fasthttp does not tell a handler
// that its client left), thousands of times a second with thousands of
// prefills under way, so it allocates nothing. A probe made while
// another one is under way reports false.
func (c *Conn) PeerClosed() bool {
	if !c.probing.CompareAndSwap(false, true) {
		return false
	}
	c.closed = false
	// Control, not Read: it ignores the connection's read deadline.
	err := c.rc.Control(c.closedFn)
	closed := err != nil || c.closed
	c.probing.Store(false)
	return closed
}

// probe is PeerClosed's RawConn function.
func (c *Conn) probe(fd uintptr) {
	n, err := Peek(fd, &c.probed)
	c.closed = err != syscall.EAGAIN && n == 0 // the end, or a reset
}

// Read reads as net.Conn's Read does, with its errors: io.EOF at the end
// of stream, an *net.OpError for the rest.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 || !c.reading.CompareAndSwap(false, true) {
		return c.TCPConn.Read(p)
	}
	c.rp, c.rn, c.rerr = p[:min(len(p), MaxCall)], 0, nil
	err := c.rc.Read(c.readFn)
	n, rerr := c.rn, c.rerr
	c.rp = nil
	c.reading.Store(false)
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case rerr == io.EOF:
		return 0, io.EOF
	case rerr != nil:
		return 0, c.opError("read", os.NewSyscallError("read", rerr))
	}
	return n, nil
}

// read is Read's RawConn function: false (wait for the poller) while the
// socket has nothing to read.
func (c *Conn) read(fd uintptr) bool {
	n, err := Recv(fd, c.rp)
	if err == syscall.EAGAIN {
		return false
	}
	c.rn, c.rerr = n, err
	return true
}

// Write writes as net.Conn's Write does: all of p, or an error.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.writing.CompareAndSwap(false, true) {
		return c.TCPConn.Write(p)
	}
	c.wp, c.wn, c.werr = p, 0, nil
	err := c.rc.Write(c.writeFn)
	n, werr := c.wn, c.werr
	c.wp = nil
	c.writing.Store(false)
	switch {
	case werr != nil:
		return n, c.opError("write", os.NewSyscallError("write", werr))
	case err != nil:
		return n, c.opError("write", err)
	}
	return n, nil
}

// write is Write's RawConn function: false (wait for the poller) while the
// socket's buffer is full.
func (c *Conn) write(fd uintptr) bool {
	done, err := sendAll(fd, c.wp, &c.wn, send)
	c.werr = err
	return done
}

// sendAll sends p[*n:] through send, at most MaxCall bytes a call, and
// counts in *n what went. It reports false while the socket's buffer is
// full (send's syscall.EAGAIN), and true once all of p went or send
// failed, with send's error.
func sendAll(fd uintptr, p []byte, n *int, send func(uintptr, []byte) (int, error)) (bool, error) {
	for *n < len(p) {
		m, err := send(fd, p[*n:min(len(p), *n+MaxCall)])
		if err == syscall.EAGAIN {
			return false, nil
		}
		if err != nil {
			return true, err
		}
		*n += m
	}
	return true, nil
}

// opError is err as net.Conn's Read or Write reports it. RawConn's own
// errors (a deadline, a closed connection) come as an *net.OpError of its
// "raw-read" or "raw-write"; what they wrap becomes the read's or write's.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
