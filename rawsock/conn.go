package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
)

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
	peeked           [1]byte // AwaitReadable's byte, not kept
	reading, writing atomic.Bool

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
	c.readFn, c.writeFn, c.peekFn = c.read, c.write, c.peek
	return c
}

// AwaitReadable waits until a read of c would not wait: bytes, the end of
// stream or an error are there. It reads nothing, and holds no buffer
// while it waits. Its error is the wait's: the read deadline, or c closed.
func (c *Conn) AwaitReadable() error {
	return c.rc.Read(c.peekFn)
}

// peek is AwaitReadable's RawConn function: false (wait for the poller)
// while the socket has nothing to read.
func (c *Conn) peek(fd uintptr) bool {
	return peek(fd, &c.peeked) != syscall.EAGAIN
}

// Read reads as net.Conn's Read does, with its errors: io.EOF at the end
// of stream, an *net.OpError for the rest.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 || !c.reading.CompareAndSwap(false, true) {
		return c.TCPConn.Read(p)
	}
	c.rp, c.rn, c.rerr = p, 0, nil
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
	for c.wn < len(c.wp) {
		n, err := send(fd, c.wp[c.wn:])
		if err == syscall.EAGAIN {
			return false
		}
		if err != nil {
			c.werr = err
			return true
		}
		c.wn += n
	}
	return true
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
