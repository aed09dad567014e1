package router

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"

	"github.com/valyala/fasthttp"
)

// A request head whose lines end in a bare LF never ends for fasthttp: it
// waits for the CRLFCRLF that closes a head (so that no peer frames the
// stream differently), and the client, whose head ended at its blank
// line, waits for an answer; each such request held its connection until
// -client-read-timeout (60 s) ran out. RFC 9112 section 2.2 lets a server
// take a bare LF as a line's end; warmroute refuses the head instead, at
// once: the connection notes the bytes of each request's head as fasthttp
// reads them, and when fasthttp asks for more after a blank line ended by
// a bare LF, with no CRLFCRLF before it, the read fails, and fasthttp
// answers 400 (ErrorHandler) and closes the connection.

// Listener returns ln with its connections watched for bare-LF heads;
// the server that Server returns serves it. A TLS front's ln is the TLS
// listener, so that the bytes scanned are the decrypted ones.
func Listener(ln net.Listener) net.Listener { return headListener{ln} }

type headListener struct{ net.Listener }

func (l headListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &headConn{Conn: c, scanning: true}, nil
}

// headConn is a client connection whose request heads are scanned for
// their end as they are read. Only its server's connection goroutine uses
// it (Read and the ConnState callback).
type headConn struct {
	net.Conn
	// fresh: bytes were read since the connection became idle (or was
	// opened), so the request now read began with them. A request that
	// fasthttp had read ahead of (pipelined) is not watched.
	fresh bool
	// watching: the request now read is watched; scanning: its head has
	// not ended yet.
	watching, scanning bool
	// last are the three bytes before the next one scanned; bare is set
	// once a blank line ended with, or after, a bare LF.
	last uint32
	bare bool
}

var errBareLF = errors.New("a request head line ends in a bare LF")

func (c *headConn) Read(p []byte) (int, error) {
	if c.watching && c.scanning && c.bare {
		return 0, errBareLF
	}
	n, err := c.Conn.Read(p)
	c.fresh = c.fresh || n > 0
	if c.scanning {
		c.scan(p[:n])
	}
	return n, err
}

// scan follows the head's bytes to its end: a CRLFCRLF ends the scan; a
// blank line ended by a bare LF ("\n\n"), or a CRLF after a line that a
// bare LF ended ("\n\r\n" without a CR before it), sets bare.
func (c *headConn) scan(p []byte) {
	for _, b := range p {
		if b == '\n' {
			switch prev := c.last; {
			case byte(prev) == '\n':
				c.bare = true
			case prev&0xffff == '\n'<<8|'\r':
				if byte(prev>>16) == '\r' {
					c.scanning = false
					return
				}
				c.bare = true
			}
		}
		c.last = (c.last<<8 | uint32(b)) & 0xffffff
	}
}

// SyscallConn is the socket's, which a wait for a replica polls to find a
// client that left (upstream.Conn). A TLS client's is the TCP connection's
// under TLS: its end, or its reset, shows there as without TLS.
func (c *headConn) SyscallConn() (syscall.RawConn, error) {
	nc := c.Conn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, errors.New("not a socket")
	}
	return sc.SyscallConn()
}

// connState is the server's ConnState: an idle connection's next request
// is scanned from its first byte; one begun before (pipelined) is not.
func connState(nc net.Conn, state fasthttp.ConnState) {
	c, ok := nc.(*headConn)
	if !ok {
		return
	}
	switch state {
	case fasthttp.StateNew, fasthttp.StateIdle:
		c.fresh, c.watching, c.scanning, c.last, c.bare = false, false, true, 0, false
	case fasthttp.StateActive:
		c.watching = c.fresh
	}
}
