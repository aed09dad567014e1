package router

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/rawsock"
	"github.com/warmroute/warmroute/upstream"
)

// fasthttp moves a client connection's deadlines three times a request: the
// idle wait's read deadline, the request's own, and the answer's write
// deadline. Each move takes a clock read and a timer update in the runtime's
// poller, 7% of a small request's CPU (peers-issue13.md, build T). With
// timeouts of a minute nothing needs that precision, so the connections
// that Listener accepts keep what fasthttp asks for and hand it to the
// poller only when a read or write is about to wait on it, and only when
// it differs from the deadline already set by more than a slack: a deadline
// moved later by less than the slack is left where it was, so a timeout may
// fire up to the slack early, never late. A connection that serves a
// request every few milliseconds then sets its deadlines about once per
// slack rather than three times a request.

// maxDeadlineSlack bounds the slack for the longest timeouts.
const maxDeadlineSlack = time.Second

// Listener returns ln with the coarse deadlines above on each connection it
// accepts; the slack is a sixteenth of the shortest of cfg's timeouts, at
// most maxDeadlineSlack. Under them, a TCP connection reads and writes
// with raw system calls (rawsock).
func (cfg ServerConfig) Listener(ln net.Listener) net.Listener {
	slack := maxDeadlineSlack
	for _, t := range [...]time.Duration{cfg.ReadTimeout, cfg.IdleTimeout, cfg.writeTimeout()} {
		if t > 0 {
			slack = min(slack, t/16)
		}
	}
	return coarseListener{ln, int64(slack)}
}

type coarseListener struct {
	net.Listener
	slack int64
}

func (l coarseListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c = rawsock.Wrap(c)
	if _, ok := c.(socket); ok {
		return &coarseSocket{coarseConn{Conn: c, slack: l.slack}}, nil
	}
	return &coarseConn{Conn: c, slack: l.slack}, nil
}

// coarseConn is a client connection with coarse deadlines. It embeds
// net.Conn, not *net.TCPConn, so that nothing writes to the socket past its
// Write (a promoted ReadFrom would) without the write deadline.
//
// The price: fasthttp sends an answer larger than its write buffer (4 KiB)
// with one writev only to a *net.TCPConn, so through a coarseConn such an
// answer takes two writes. For 20 KB answers that costs about 5 us of CPU
// a request more than the 2 us the deadlines save (peers-issue13.md); the
// small answers of agent loops and SSE events gain.
type coarseConn struct {
	net.Conn
	slack int64
	read  deadline
	write deadline
	relay relayState // relay.go
	// end is the data of a body's last chunk, whose write ends the body
	// too, and endSent says that it did (lastchunk.go): both the
	// goroutine's that writes the answer.
	end     []byte
	endSent bool
	// linger is the most bytes that Close reads and drops (lingerer),
	// 0 for none.
	linger atomic.Int64
}

// deadline is one direction's deadline, in Unix nanoseconds (0: none):
// want is what was last asked for, set what the poller has. Both are
// atomic because a deadline may be moved by another goroutine than the one
// that reads or writes; mu orders the moves that reach the poller, so that
// the last one made is of the latest deadline asked for.
type deadline struct {
	want, set atomic.Int64
	mu        sync.Mutex
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// ask records t; it reports whether t must go to the poller now rather
// than at the next read or write: a deadline already past is how a waiting
// read or write is interrupted, and that must not wait.
func (d *deadline) ask(t time.Time) bool {
	n := unixNano(t)
	d.want.Store(n)
	s := d.set.Load()
	if n == 0 || (s != 0 && n >= s) {
		return false // removed, or moved later: the read or write sees to it
	}
	return time.Until(t) <= 0 // one clock read (monotonic) where t has it, as fasthttp's do
}

// due returns the deadline the poller should have before a read or write,
// and whether it differs from the one it has by more than the slack.
func (d *deadline) due(slack int64) (int64, bool) {
	w, s := d.want.Load(), d.set.Load()
	if w == s || (w != 0 && s != 0 && w > s && w-s < slack) {
		return 0, false
	}
	return w, true
}

func timeOf(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// apply gives the poller d's deadline through set when it is due. It
// looks again after each move: a deadline asked for meanwhile by another
// goroutine, which saw the set one before this move changed it and so left
// it to the next read or write, is not lost.
func (d *deadline) apply(slack int64, set func(time.Time) error) error {
	if _, ok := d.due(slack); !ok {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		n, ok := d.due(slack)
		if !ok {
			return nil
		}
		d.set.Store(n)
		if err := set(timeOf(n)); err != nil {
			return err
		}
	}
}

func (c *coarseConn) applyRead() error  { return c.read.apply(c.slack, c.Conn.SetReadDeadline) }
func (c *coarseConn) applyWrite() error { return c.write.apply(c.slack, c.Conn.SetWriteDeadline) }

func (c *coarseConn) Read(p []byte) (int, error) {
	if c.relay.unreading {
		return 0, errUnreading
	}
	if err := c.applyRead(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *coarseConn) Write(p []byte) (int, error) {
	if c.end != nil || c.endSent {
		return c.writeEnd(p)
	}
	return c.send(p)
}

// send is Write with the deadline.
func (c *coarseConn) send(p []byte) (int, error) {
	if err := c.applyWrite(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *coarseConn) SetReadDeadline(t time.Time) error {
	if c.read.ask(t) {
		return c.applyRead()
	}
	return nil
}

func (c *coarseConn) SetWriteDeadline(t time.Time) error {
	if c.write.ask(t) {
		return c.applyWrite()
	}
	return nil
}

func (c *coarseConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// socket is what the router needs of a TCP connection besides net.Conn:
// SyscallConn for the client's liveness peek (upstream.PeerClosed) and
// CloseWrite for the lingering close (lingerer).
type socket interface {
	syscall.Conn
	CloseWrite() error
}

// coarseSocket is a coarseConn over a socket, with socket's methods; a
// connection of another kind (an in-memory one in tests) has neither, as
// it had before it was wrapped.
type coarseSocket struct{ coarseConn }

func (c *coarseSocket) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(socket).SyscallConn()
}

func (c *coarseSocket) CloseWrite() error { return c.Conn.(socket).CloseWrite() }

// PeerClosed is the socket's own probe, which allocates nothing
// (upstream.PeerClosed).
func (c *coarseSocket) PeerClosed() bool { return upstream.PeerClosed(c.Conn) }
