package upstream

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The socket state read here is the evidence that Judge draws from, and
// the probe of a client that left: Linux reports a socket's pending error
// and its unacknowledged bytes (TCP_INFO), and a non-blocking peek tells
// an open idle connection from one that its peer closed.

// alive peeks at an idle socket without blocking: end of stream or stray
// bytes mean the connection cannot carry a request. Over TLS, so do bytes
// that TLS read from the socket before, and holds (tlsEmpty).
func (c *Conn) alive() bool {
	if c.rc == nil {
		return true
	}
	c.peekErr = nil
	if err := c.rc.Control(c.peekFn); err != nil {
		return false
	}
	// Not EOF (n == 0), an error, or stray data.
	return c.peekErr == unix.EAGAIN && (c.sock == nil || c.tlsEmpty())
}

func (c *Conn) peek(fd uintptr) {
	c.peekN, c.peekErr = peek(fd, c.peekBuf[:])
}

// answered reports whether the replica has sent bytes that are unread.
func (c *Conn) answered() bool {
	if c.rc == nil {
		return false
	}
	c.peekN = 0
	return c.rc.Control(c.peekFn) == nil && c.peekN > 0
}

// peek reads up to len(b) bytes of fd without consuming them or blocking.
// recvfrom(2) with no address: unix.Recvfrom's address, which it returns,
// would be allocated for every call.
func peek(fd uintptr, b []byte) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
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

// waitFunc returns c.readable: a wait on a socket holds no read buffer.
func (c *Conn) waitFunc() func(fd uintptr) bool { return c.readable }

// readSocket is one non-blocking read(2) of the socket fd, through the
// syscall package, whose race annotations order it after the writes that
// the bytes came from, as a read through the connection is.
func readSocket(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), p)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// writeSocket is one non-blocking write(2) to the socket fd, through the
// syscall package for its race annotations, as readSocket.
func writeSocket(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Write(int(fd), p)
		if err == syscall.EINTR {
			continue
		}
		return max(n, 0), err
	}
}

// clientGone reports whether client has closed its connection, without
// blocking and without consuming a byte. fasthttp does not tell a handler
// that its client left (valyala/fasthttp#468, #965), so a wait for the
// replica asks the client's socket at each of its polls. The client's
// RawConn is kept for the polls that follow, which then allocate nothing.
func (c *Conn) clientGone(client net.Conn) bool {
	if client != c.client {
		c.client, c.clientRC = client, nil
		if sc, ok := client.(syscall.Conn); ok {
			c.clientRC, _ = sc.SyscallConn()
		}
	}
	if c.clientRC == nil {
		return false
	}
	if c.peekFn == nil {
		c.peekFn = c.peek
	}
	// Control, not Read: it ignores the connection's read deadline.
	if err := c.clientRC.Control(c.peekFn); err != nil {
		return true // closed on this side
	}
	switch {
	case c.peekErr == unix.EAGAIN:
		return false
	case c.peekN > 0:
		// A pipelined request, unread: the client may have closed its
		// side behind it, which its socket's state tells.
		return closing(c.clientRC)
	}
	return true // EOF or a reset
}

// closing reports whether the peer of the socket rc has closed its side
// (CLOSE_WAIT), whatever bytes are still unread.
func closing(rc syscall.RawConn) bool {
	var state uint8
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	})
	return state == unix.BPF_TCP_CLOSE_WAIT
}
