package upstream

import (
	"crypto/tls"
	"net"
	"time"
)

// A connection to an https:// replica is a TLS connection over TCP. Reads
// and writes go through TLS; what the proxy learns from the socket itself
// (socket_linux.go: the peek of an idle connection, the reset and the
// unacknowledged bytes that Judge weighs) it reads from the TCP connection
// under it, whose state TLS does not change: a replica that closed before
// the request came has acknowledged none of its records, as none of its
// bytes. TLS reads whole records, so it may hold bytes that the socket no
// longer has: a wait reads through it, and holds its read buffer, and the
// peek before a reuse also asks TLS whether it holds any (tlsEmpty).

// replicaTLS returns the TLS configuration of the replica at addr: the
// set's, with the replica's own host as the name to verify when the set
// names none, HTTP/1.1 as the one protocol offered, and a session cache of
// its own, so that a new connection resumes the replica's last session
// rather than making a full handshake.
func (s *Set) replicaTLS(addr string) *tls.Config {
	cfg := &tls.Config{}
	if s.cfg.TLS != nil {
		cfg = s.cfg.TLS.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	cfg.NextProtos = []string{"http/1.1"}
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	return cfg
}

// dial opens a new connection to r: a TCP connect, and for an https://
// replica a TLS handshake over it, the two within ConnectTimeout. A
// failure of either is in PhaseDial: no byte of a request went, so the
// request may go to another replica, and r is demoted as unreachable. A
// certificate that does not verify fails so: nothing goes to an https://
// replica in the clear.
func (r *Replica) dial() (*Conn, *Error) {
	timeout := r.set.cfg.ConnectTimeout
	start := time.Now()
	nc, err := net.DialTimeout("tcp", r.addr, timeout)
	if err != nil {
		return nil, &Error{Phase: PhaseDial, Err: err}
	}
	if r.tls == nil {
		return newConn(nc, r), nil
	}
	tc := tls.Client(&tlsSocket{Conn: nc}, r.tls)
	nc.SetDeadline(start.Add(timeout))
	if err := tc.Handshake(); err != nil {
		nc.Close()
		return nil, &Error{Phase: PhaseDial, Err: err}
	}
	nc.SetDeadline(time.Time{})
	return newConn(tc, r), nil
}

// tlsSocket is the TCP connection under a TLS connection to a replica. Its
// reads can be refused, so that tlsEmpty's read through TLS returns at
// once with what TLS holds, and never waits for the socket.
type tlsSocket struct {
	net.Conn
	refuse bool
}

func (s *tlsSocket) Read(p []byte) (int, error) {
	if s.refuse {
		return 0, errRefused
	}
	return s.Conn.Read(p)
}

// errRefused is a refused read of a tlsSocket: a temporary error, which
// TLS passes on without taking it for its connection's end.
var errRefused net.Error = refusedRead{}

type refusedRead struct{}

func (refusedRead) Error() string   { return "read refused: looking at what TLS holds" }
func (refusedRead) Timeout() bool   { return true }
func (refusedRead) Temporary() bool { return true }

// tlsEmpty reports whether c's TLS connection holds no byte of data that a
// read would return, without reading the socket: after a whole answer,
// bytes past its end would be taken for the next request's answer. Data
// that it finds is consumed, and c must then be closed. A record that
// carries no data (a session ticket, a key update) is handled as the next
// read would handle it.
func (c *Conn) tlsEmpty() bool {
	c.sock.refuse = true
	n, err := c.nc.Read(c.peekBuf[:])
	c.sock.refuse = false
	return n == 0 && err == errRefused
}

// writeRecord writes a small request's head and body to a TLS connection
// in one record and one write: net.Buffers would make each a record, and
// a write, of its own.
func (c *Conn) writeRecord(head, body []byte) error {
	b := outBufs.Get().(*[]byte)
	*b = append(append((*b)[:0], head...), body...)
	_, err := c.nc.Write(*b)
	outBufs.Put(b)
	return err
}

// closeTLS closes the connection to an https:// replica. One that failed
// is closed under TLS, at once: a close_notify alert, which TLS sends
// first, could wait for a socket that its replica no longer reads. One
// closed while idle says close_notify, so that its replica sees a clean
// end.
func (c *Conn) closeTLS() {
	if c.broken {
		c.sock.Conn.Close()
		return
	}
	c.nc.Close()
}
