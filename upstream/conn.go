package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is one keep-alive connection to a replica. A Conn belongs to one
// request between Acquire and Release; it is not safe for concurrent use.
type Conn struct {
	nc     net.Conn
	rc     syscall.RawConn // nil where the connection is not a socket
	Reader *bufio.Reader
	r      *Replica
	// Reused is true when the connection served a request before this one.
	Reused           bool
	broken           bool
	hadWriteDeadline bool
	// lastUse is the clock reading of the Acquire that handed c out last.
	lastUse time.Time
	iov     net.Buffers
	bufs    [2][]byte

	// peek state, written by peekFn, which is made once per connection so
	// that probing a pooled connection allocates nothing.
	peekFn  func(fd uintptr)
	peekErr error // unix.EAGAIN: nothing to read, the connection is open
	peekBuf [1]byte
}

// Acquire returns an idle connection to r, or dials a new one; now is the
// caller's clock reading. A pooled connection that the replica closed while
// it sat idle is found here, before anything is written, and dropped
// without blame. A dial error is returned as a *SendError in PhaseDial.
func (r *Replica) Acquire(now time.Time) (*Conn, error) {
	for {
		r.mu.Lock()
		n := len(r.idle)
		if n == 0 {
			r.mu.Unlock()
			break
		}
		c := r.idle[n-1]
		r.idle[n-1] = nil
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		if now.Sub(c.lastUse) < r.set.cfg.TrustIdle || c.alive() {
			c.Reused, c.lastUse = true, now
			return c, nil
		}
		c.nc.Close()
	}
	nc, err := net.DialTimeout("tcp", r.addr, r.set.cfg.ConnectTimeout)
	if err != nil {
		return nil, &SendError{Phase: PhaseDial, Err: err}
	}
	c := &Conn{nc: nc, r: r, Reader: bufio.NewReaderSize(nc, 8<<10), lastUse: now}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.peekFn = c.peek
		}
	}
	return c, nil
}

// Release returns c to its replica's pool, or closes it if it is broken,
// the replica is down, or the pool is full. c must not be used afterwards.
func (c *Conn) Release() {
	r := c.r
	if c.broken || c.Reader.Buffered() > 0 || r.state.Load() != Live {
		c.nc.Close()
		return
	}
	r.mu.Lock()
	if len(r.idle) < r.set.cfg.MaxIdleConns {
		r.idle = append(r.idle, c)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	c.nc.Close()
}

// Close closes c for good: the replica sees its connection end, which is how
// a request whose client left is cancelled.
func (c *Conn) Close() {
	c.broken = true
	c.nc.Close()
}

// MarkBroken keeps c out of the pool when it is released.
func (c *Conn) MarkBroken() { c.broken = true }

// DropIdle closes every idle connection to r: one of them turned out closed
// by the replica, and the others are likely to be too.
func (r *Replica) DropIdle() { r.closeIdle() }

func (r *Replica) closeIdle() {
	r.mu.Lock()
	idle := r.idle
	r.idle = r.idle[:0]
	r.mu.Unlock()
	for i, c := range idle {
		c.nc.Close()
		idle[i] = nil
	}
}

// alive peeks at an idle socket without blocking: end of stream or stray
// bytes mean the connection cannot carry a request.
func (c *Conn) alive() bool {
	if c.rc == nil {
		return true
	}
	c.peekErr = nil
	if err := c.rc.Control(c.peekFn); err != nil {
		return false
	}
	return c.peekErr == unix.EAGAIN // not EOF (n == 0), an error, or stray data
}

func (c *Conn) peek(fd uintptr) {
	_, c.peekErr = peekByte(fd, &c.peekBuf)
}

// peekByte looks at the next byte of a socket without consuming it and
// without blocking. It calls recvfrom directly: x/sys/unix.Recvfrom
// allocates the sender's address on every call.
func peekByte(fd uintptr, buf *[1]byte) (int, error) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// pendingError returns the socket's pending error (SO_ERROR), if any. After
// the replica's FIN, a reset for bytes that arrived after the close leaves
// EPIPE there while reads still return end of stream.
func (c *Conn) pendingError() error {
	if c.rc == nil {
		return nil
	}
	var soErr int
	if err := c.rc.Control(func(fd uintptr) {
		soErr, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
	}); err != nil || soErr == 0 {
		return nil
	}
	return os.NewSyscallError("read", syscall.Errno(soErr))
}

// ErrClosedBeforeRequest is end of stream from a replica that had not
// acknowledged our request's bytes: it closed the connection before they
// reached it.
var ErrClosedBeforeRequest = errors.New("replica closed the connection before the request reached it")

// unacked reports whether bytes we sent are still unacknowledged. Read at
// end of stream, it tells a replica that closed before our request arrived
// (its FIN acknowledges nothing of the request) from one that received the
// request and then closed (its FIN acknowledges all of it).
func (c *Conn) unacked() bool {
	if c.rc == nil {
		return false
	}
	var n uint32
	if err := c.rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = info.Unacked
		}
	}); err != nil {
		return false
	}
	return n > 0
}

// ErrReplicaRestarting is end of stream on a reused connection from a replica
// that now refuses new connections: its process closed its listener and its
// idle connections, as a restart does, and runs nothing of ours.
var ErrReplicaRestarting = errors.New("replica closed a keep-alive connection and refuses new ones (restarting)")

// refuses reports whether a connect to r is refused right now.
func (r *Replica) refuses() bool {
	nc, err := net.DialTimeout("tcp", r.addr, min(r.set.cfg.ConnectTimeout, 250*time.Millisecond))
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED)
	}
	nc.Close()
	return false
}

// PeerClosed reports whether the other end of nc has closed it, without
// blocking and without consuming a byte. fasthttp does not tell a handler
// that its client left (valyala/fasthttp#468, #965), so the proxy asks the
// socket while it waits. It allocates, so it runs only when a wait times out.
func PeerClosed(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	var perr error
	var buf [1]byte
	// Control, not Read: it ignores the connection's read deadline.
	if err := rc.Control(func(fd uintptr) {
		n, perr = peekByte(fd, &buf)
	}); err != nil {
		return true
	}
	if perr == unix.EAGAIN {
		return false
	}
	return n == 0 // EOF or a reset; n > 0 is a pipelined request
}

// Write sends the request head and body in one system call. An error is a
// *SendError in PhaseWrite: the replica did not get the whole request.
func (c *Conn) Write(head, body []byte) error {
	if len(head)+len(body) > 64<<10 {
		// Only a write larger than the socket buffer can block on a
		// replica that stopped reading.
		c.nc.SetWriteDeadline(time.Now().Add(c.r.set.cfg.ResponseTimeout))
	} else if c.hadWriteDeadline {
		c.nc.SetWriteDeadline(time.Time{})
	}
	c.hadWriteDeadline = len(head)+len(body) > 64<<10
	c.bufs[0], c.bufs[1] = head, body
	c.iov = c.bufs[:]
	if len(body) == 0 {
		c.iov = c.bufs[:1]
	}
	_, err := c.iov.WriteTo(c.nc)
	c.bufs[0], c.bufs[1] = nil, nil
	if err != nil {
		c.broken = true
		return &SendError{Phase: PhaseWrite, Reused: c.Reused, Err: err}
	}
	return nil
}

// ErrClientGone is returned by Await when the client closed its connection.
var ErrClientGone = errors.New("client closed the connection")

// pollInterval is how often a wait for the replica looks at the client: a
// client that leaves has its upstream request cancelled within this time.
const pollInterval = 250 * time.Millisecond

// AwaitResponse is Await for the first byte of a response: an end of stream
// there is examined for the signs that the replica never had the request
// (see Classify).
// now is the caller's clock reading, saving one: a clock read costs as
// much as a tenth of the proxy's own work on a small request.
func (c *Conn) AwaitResponse(client net.Conn, now time.Time) error {
	return c.await(client, true, now)
}

// Await blocks until at least one byte from the replica is buffered, the
// replica closes or times out (no byte for ResponseTimeout), or client, when
// not nil, closes its connection. While bytes are already buffered it
// returns at once without a system call.
func (c *Conn) Await(client net.Conn) error {
	if c.Reader.Buffered() > 0 {
		return nil
	}
	return c.await(client, false, time.Now())
}

func (c *Conn) await(client net.Conn, first bool, now time.Time) error {
	if c.Reader.Buffered() > 0 {
		return nil
	}
	deadline := now.Add(c.r.set.cfg.ResponseTimeout)
	for {
		wake := now.Add(pollInterval)
		if client == nil || wake.After(deadline) {
			wake = deadline
		}
		c.nc.SetReadDeadline(wake)
		// Read at once rather than wait for readiness first. A wait
		// through RawConn.Read would save the EAGAIN read but is not
		// safe: its prepareRead clears a readiness already reported, so
		// an answer that arrived before the wait would sit unseen until
		// the deadline (BenchmarkProxyChat: 163 us against 38 us a
		// request, from such stalls).
		_, err := c.Reader.Peek(1)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return c.readError(err, first)
		}
		now = time.Now()
		if !now.Before(deadline) {
			c.broken = true
			return ErrTimeout
		}
		if client != nil && PeerClosed(client) {
			c.broken = true
			return ErrClientGone
		}
	}
}

// readError types a failed read from the replica. At the first response
// byte, an end of stream is examined for the signs that the replica never
// had the request (see Classify).
func (c *Conn) readError(err error, first bool) error {
	c.broken = true
	if err == io.EOF && first {
		if e := c.pendingError(); e != nil {
			// The replica's end was closed with our request unread:
			// its kernel answered the bytes with a reset.
			return e
		}
		if c.unacked() {
			return ErrClosedBeforeRequest
		}
		if c.Reused && c.r.refuses() {
			return ErrReplicaRestarting
		}
	}
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ErrTimeout is returned by Await when the replica sent nothing for
// ResponseTimeout.
var ErrTimeout = errors.New("replica sent nothing within the response timeout")

// HeadBuffered reports whether a whole response head is already buffered,
// so that reading it cannot block and needs no deadline of its own.
func (c *Conn) HeadBuffered() bool {
	b, _ := c.Reader.Peek(c.Reader.Buffered())
	return bytes.Contains(b, crlfcrlf)
}

var crlfcrlf = []byte("\r\n\r\n")

// SetReadDeadline bounds the next reads from the replica; Await sets its own.
func (c *Conn) SetReadDeadline(t time.Time) { c.nc.SetReadDeadline(t) }
