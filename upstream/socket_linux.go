package upstream

import (
	"bufio"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warmroute/warmroute/rawsock"
)

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
	_, c.peekErr = rawsock.Peek(fd, &c.peekBuf)
}

// readable is the function of parkedPeek's RawConn.Read: true (stop
// waiting) once the socket had bytes, its end or an error to read; false
// (wait for the poller) while it has nothing. Bytes are read into a buffer
// from readers, which becomes c.Reader; with nothing, the buffer goes back.
// An error that the read found (a reset) is kept in waitErr: the read
// consumed it, and a read after it would see only an end of stream.
func (c *Conn) readable(fd uintptr) bool {
	br := readers.Get().(*bufio.Reader)
	c.src.raw, c.src.fd = true, fd
	br.Reset(&c.src)
	_, err := br.Peek(1)
	c.src.raw = false
	if br.Buffered() > 0 {
		c.Reader = br
		return true
	}
	readers.Put(br)
	switch err {
	case unix.EAGAIN:
		return false
	case io.EOF:
	default:
		c.waitErr = err
	}
	return true
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

// PeerClosed reports whether the other end of nc has closed it, without
// blocking and without consuming a byte. fasthttp does not tell a handler
// that its client left (valyala/fasthttp#468, #965), so the proxy asks the
// socket at every poll of a wait. A connection that can probe itself
// (rawsock.Conn, and the router's wrappers of it) does so without
// allocating; any other allocates a RawConn and a closure.
func PeerClosed(nc net.Conn) bool {
	if p, ok := nc.(interface{ PeerClosed() bool }); ok {
		return p.PeerClosed()
	}
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
		n, perr = rawsock.Peek(fd, &buf)
	}); err != nil {
		return true
	}
	if perr == unix.EAGAIN {
		return false
	}
	return n == 0 // EOF or a reset; n > 0 is a pipelined request
}

// iovec is one buffer of a writev(2).
type iovec = unix.Iovec

// sendFunc returns the function of Send's wait: writeThenWait.
func (c *Conn) sendFunc() func(fd uintptr) bool { return c.writeThenWait }

// writeThenWait is the function of Send's RawConn.Read. Its first call
// writes the request with one non-blocking writev and asks to wait unless
// the write fell short or failed; its next, once the socket is readable,
// ends the wait. The answer is read after the wait, through c.Reader.
func (c *Conn) writeThenWait(fd uintptr) bool {
	if c.sendWait {
		return true
	}
	c.sendWait = true
	c.sendN, c.sendErr = rawsock.Writev(fd, &c.sendIov)
	return c.sendErr != nil || c.sendN < c.sendLen
}

// writeFunc returns the function of Write's RawConn.Write: writeRaw.
func (c *Conn) writeFunc() func(fd uintptr) bool { return c.writeRaw }

// writeRaw writes the request with one non-blocking writev, whatever the
// socket took of it: Write sends the rest. For writeAll (c.sendAll) it
// writes all of c.bufs, and asks to wait while the socket's buffer is full.
func (c *Conn) writeRaw(fd uintptr) bool {
	if !c.sendAll {
		c.sendN, c.sendErr = rawsock.Writev(fd, &c.sendIov)
		return true
	}
	done, err := writevAll(fd, &c.sendIov, c.bufs[0], c.bufs[1], &c.sendN, rawsock.Writev)
	c.sendErr = err
	return done
}

// writevAll writes head and body from their byte *n on through writev,
// at most rawsock.MaxCall bytes a call (rawsock says why), and counts in
// *n what went. It reports false while the socket's buffer is full (a
// write of 0 bytes), and true once all went or writev failed, with its
// error.
func writevAll(fd uintptr, iov *[2]iovec, head, body []byte, n *int, writev func(uintptr, *[2]iovec) (int, error)) (bool, error) {
	for *n < len(head)+len(body) {
		h := head[min(*n, len(head)):]
		b := body[max(*n-len(head), 0):]
		h = h[:min(len(h), rawsock.MaxCall)]
		setIovec(iov, h, b[:min(len(b), rawsock.MaxCall-len(h))])
		m, err := writev(fd, iov)
		switch {
		case err != nil:
			return true, err
		case m == 0:
			return false, nil // full: wait for room
		}
		*n += m
	}
	return true, nil
}

// setIov points sendIov at head and body.
func (c *Conn) setIov(head, body []byte) { setIovec(&c.sendIov, head, body) }

// setIovec points iov at head and body.
func setIovec(iov *[2]iovec, head, body []byte) {
	iov[0].Base = unsafe.SliceData(head)
	iov[0].SetLen(len(head))
	iov[1].Base = unsafe.SliceData(body)
	iov[1].SetLen(len(body))
}
