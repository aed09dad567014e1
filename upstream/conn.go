package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/rawsock"
)

// Conn is one keep-alive connection to a replica. A Conn belongs to one
// request between Acquire and Release; it is not safe for concurrent use.
// It owns its deadlines: each wait and read below sets the one it needs.
type Conn struct {
	nc     net.Conn
	rc     syscall.RawConn // nil where the connection is not a socket
	Reader *bufio.Reader   // reads src
	src    source
	r      *Replica
	// Reused is true when the connection served a request before this one.
	Reused bool
	// recent is true when the connection is new or sat idle in the pool
	// less than recentIdle before this request (Send).
	recent           bool
	broken           bool
	hadWriteDeadline bool
	// lastUse is the clock reading of the Release that pooled c last.
	lastUse time.Time
	// readDeadline is the read deadline set on nc last (setReadDeadline).
	readDeadline time.Time
	iov          net.Buffers
	bufs         [2][]byte

	// peek state, written by peekFn, which is made once per connection so
	// that probing a pooled connection allocates nothing.
	peekFn  func(fd uintptr)
	peekErr error // EAGAIN: nothing to read, the connection is open
	peekBuf [1]byte
	// waitFn is c.readable, made once per connection (parkedPeek).
	waitFn  func(fd uintptr) bool
	waitErr error // the socket's error, as readable's read found it
	// pollFn is c.poll, made once per connection (Poll); polled is what
	// its readable reported.
	pollFn func(fd uintptr)
	polled bool
	// fd is the socket, for a Poller (Park); valid where rc is not nil.
	fd int
	// poller has the socket registered as pollSlot-1 (Park), 0 for none.
	poller   *rawsock.Poller
	pollSlot int32
	// unread is set by a Poll that did not read, its socket known empty
	// of bytes (source.drained), for the Park that follows.
	unread bool
	// writeFn is c.writeRaw, made once per connection (Write).
	writeFn func(fd uintptr) bool
	// sendFn is c.writeThenWait, made once per connection (Send); the
	// send state below is its and writeFn's.
	sendFn   func(fd uintptr) bool
	sendIov  [2]iovec
	sendLen  int   // bytes in sendIov
	sendN    int   // bytes that its write wrote
	sendErr  error // the write's error
	sendWait bool  // the write is done: the next call ends the wait
	sendAll  bool  // writeRaw writes all of bufs, waiting for room (write)
}

// source is what a Conn's Reader reads: the connection, or, inside a
// parked wait's function (readable), its socket with one non-blocking
// read(2), which the runtime's poller is not told of.
type source struct {
	nc  net.Conn
	raw bool    // inside readable
	fd  uintptr // the socket, while raw
	// due is the read deadline, counted from the read, that the next
	// read through nc must have (the Prepare methods), 0 for none: a
	// read of an answer already buffered whole then moves no deadline.
	due time.Duration
	c   *Conn
	// drained is set by a read inside readable that returned fewer bytes
	// than it had room for: the socket held no more bytes (a TCP read(2)
	// copies all that is queued, up to its length, and what came while
	// it held the socket is queued as it returns, with a wakeup). The
	// exceptions the poller saw come, and its Park reports them (unread):
	// an end of stream or an error after the bytes, and urgent data, at
	// which a read stops. Whatever comes after the read wakes the poller,
	// so a wait that parks next need not read first to find nothing
	// (Poll).
	drained bool
}

func (s *source) Read(p []byte) (int, error) {
	if s.raw {
		n, err := rawsock.Recv(s.fd, p)
		s.drained = err == nil && n < len(p)
		return n, err
	}
	s.drained = false
	if s.due > 0 {
		s.c.setReadDeadline(time.Now().Add(s.due))
		s.due = 0
	}
	return s.nc.Read(p)
}

// readers holds the read buffers of connections that wait for an answer
// or for the next bytes of a stream (parkedPeek): a stream spends most of
// its life there, and needs a buffer only once bytes came. A new
// connection takes its buffer from here too, so that there are about as
// many buffers as reads under way, not as connections.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, connReadBuffer) }}

// Replica returns the replica that c connects to.
func (c *Conn) Replica() *Replica { return c.r }

// Close closes c for good: the replica sees its connection end, which is how
// a request whose client left is cancelled.
func (c *Conn) Close() {
	c.broken = true
	c.closeSocket()
}

// Write sends the request head and body, in one system call where the
// socket takes them whole. An error is an *Error in PhaseWrite: the
// replica did not get the whole request.
//
// On a socket, a request of up to 64 KiB is one raw writev (writeRaw, in
// the connection's RawConn.Write), outside the runtime's system-call
// bookkeeping, as rawsock makes every other read and write: at low load a
// bookkept call wakes the runtime's monitor thread. What a short write
// left goes as a large request does: raw writes too, with a deadline.
func (c *Conn) Write(head, body []byte) error {
	n := len(head) + len(body)
	if n > 64<<10 || c.writeFn == nil {
		// Only a write larger than the socket buffer can block on a
		// replica that stopped reading.
		return c.write(head, body, n > 64<<10)
	}
	if c.hadWriteDeadline {
		// A deadline of an earlier large request, maybe past.
		c.nc.SetWriteDeadline(time.Time{})
		c.hadWriteDeadline = false
	}
	c.setIov(head, body)
	c.sendN, c.sendErr = 0, nil
	err := c.rc.Write(c.writeFn)
	c.setIov(nil, nil)
	switch {
	case err != nil:
		return c.fail(PhaseWrite, err) // the connection was closed
	case c.sendErr != nil:
		return c.fail(PhaseWrite, c.writevError(c.sendErr))
	case c.sendN < n:
		return c.writeRest(head, body)
	}
	return nil
}

// writevError is the error of a failed raw writev, as net reports one.
func (c *Conn) writevError(err error) error {
	return &net.OpError{Op: "writev", Net: "tcp", Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(),
		Err: os.NewSyscallError("writev", err)}
}

// writeRest writes what a raw writev of head and body left (c.sendN bytes
// went): its socket's buffer is full, so it goes as a large request does,
// with a write deadline.
func (c *Conn) writeRest(head, body []byte) error {
	return c.write(head[min(c.sendN, len(head)):], body[max(c.sendN-len(head), 0):], true)
}

// write is Write, with a write deadline StreamIdleTimeout away if bounded.
func (c *Conn) write(head, body []byte, bounded bool) error {
	if bounded {
		c.nc.SetWriteDeadline(time.Now().Add(c.r.set.cfg.StreamIdleTimeout))
	} else if c.hadWriteDeadline {
		c.nc.SetWriteDeadline(time.Time{})
	}
	c.hadWriteDeadline = bounded
	c.bufs[0], c.bufs[1] = head, body
	if c.writeFn != nil {
		return c.writeAll()
	}
	c.iov = c.bufs[:]
	if len(body) == 0 {
		c.iov = c.bufs[:1]
	}
	_, err := c.iov.WriteTo(c.nc)
	c.bufs[0], c.bufs[1] = nil, nil
	if err != nil {
		return c.fail(PhaseWrite, err)
	}
	return nil
}

// writeAll writes c.bufs as raw writevs inside the connection's
// RawConn.Write (writeRaw), which waits for room in the socket's buffer
// until the write deadline, as net.Buffers' writev did; but that writev
// is bookkept, and rawsock's doc says what that cost a request of 360 KB.
func (c *Conn) writeAll() error {
	c.sendN, c.sendErr, c.sendAll = 0, nil, true
	err := c.rc.Write(c.writeFn)
	c.sendAll = false
	c.setIov(nil, nil)
	c.bufs[0], c.bufs[1] = nil, nil
	switch {
	case c.sendErr != nil:
		return c.fail(PhaseWrite, c.writevError(c.sendErr))
	case err != nil:
		return c.fail(PhaseWrite, err) // the deadline, or the connection closed
	}
	return nil
}

// Send writes the request head and body and waits for the first byte of
// the answer: Write, then AwaitFirst, with their errors.
//
// On a socket, a request that fits in one write on a connection that was
// idle less than recentIdle is written inside the wait's RawConn.Read
// (writeThenWait), so that the wait needs no read that finds the socket
// empty first: one system call a request less. The wait is armed before
// the write, so nothing that the replica sends after the request can go
// unseen; but arming it forgets what the poller reported before, which a
// read finds and a wait does not. Of that, the replica's reset is sent
// again when the request reaches it, and a full close draws one, but a
// FIN after which the replica still reads (a half close) would leave the
// wait asleep until its poll and then read as a replica that took the
// request and closed. So a connection that sat idle long enough for the
// replica to close it goes the way of Write and AwaitFirst, whose read
// finds the FIN at once, while the request is still unacknowledged.
func (c *Conn) Send(head, body []byte, client net.Conn, sent time.Time) error {
	n := len(head) + len(body)
	if c.sendFn == nil || !c.recent || n > 64<<10 || c.Buffered() > 0 {
		return c.writeAwait(head, body, client, sent)
	}
	c.setIov(head, body) // a raw write: no write deadline applies
	c.sendLen, c.sendN, c.sendErr, c.sendWait = n, 0, nil, false
	c.armPoll(sent, c.r.set.cfg.FirstByteTimeout)
	err := c.rc.Read(c.sendFn)
	c.setIov(nil, nil)
	switch {
	case !c.sendWait && errors.Is(err, os.ErrDeadlineExceeded):
		// The wait's deadline had passed before it began: the request
		// goes as Write sends it, and AwaitFirst times it out.
		return c.writeAwait(head, body, client, sent)
	case !c.sendWait:
		// The connection was closed before the write.
		return c.fail(PhaseWrite, err)
	case c.sendErr != nil:
		return c.fail(PhaseWrite, c.writevError(c.sendErr))
	case c.sendN < n:
		// The socket took part of it, so its buffer is full.
		if err := c.writeRest(head, body); err != nil {
			return err
		}
	}
	return c.AwaitFirst(client, sent)
}

// recentIdle is how long a pooled connection may have sat idle for Send to
// write inside its wait. A replica closes an idle keep-alive connection
// after seconds (uvicorn's default is 5 s), not within milliseconds of its
// answer, and then fully, which draws a reset. Under load a pool holds
// more connections than are in use, and the one on top sat idle up to a
// few milliseconds (scripts/cpu-per-request.sh's SSE load: 88% within
// 6.4 ms, 98% within 26 ms; chat's mostly within 1 ms).
const recentIdle = 10 * time.Millisecond

// writeAwait is Send without the write inside the wait.
func (c *Conn) writeAwait(head, body []byte, client net.Conn, sent time.Time) error {
	if err := c.Write(head, body); err != nil {
		return err
	}
	return c.AwaitFirst(client, sent)
}

// epoch is the process's first clock reading, which monoNow counts from.
var epoch = time.Now()

// monoNow is time.Now for deadlines and durations, with one clock read
// (monotonic) where time.Now makes two: a stream waits once an event. Its
// wall time is epoch's plus the monotonic time since, which a step of the
// system clock does not move; nothing reads it but the poller's deadline,
// which reads the monotonic time.
func monoNow() time.Time { return epoch.Add(time.Since(epoch)) }

// pollInterval is how often a wait for the replica looks at the client and
// at the replica's state: a client that leaves has its upstream request
// cancelled, and a replica found hung releases its waiters, within this
// time.
const pollInterval = 250 * time.Millisecond

// AwaitFirst blocks until the first byte of the answer is buffered; sent is
// the caller's clock reading when the request went out. It fails after
// FirstByteTimeout, when client (if not nil) closes its connection, or when
// the replica is demoted as hung. An end of stream here is examined for the
// signs that the replica never read the request (see Judge). An error is an
// *Error in PhaseAwait.
func (c *Conn) AwaitFirst(client net.Conn, sent time.Time) error {
	return c.await(client, PhaseAwait, sent, c.r.set.cfg.FirstByteTimeout, false)
}

// AwaitFirstParked is AwaitFirst whose wait holds no read buffer from its
// start, as a stream's wait between events does (await says why others
// keep theirs for the first poll). It is for waits that come in bursts,
// which the router hands to its relays: their buffers go back to the pool
// as each wait begins, and the next request's connection takes one from
// there, so a burst of thousands of waits does not hold a buffer each.
func (c *Conn) AwaitFirstParked(client net.Conn, sent time.Time) error {
	return c.await(client, PhaseAwait, sent, c.r.set.cfg.FirstByteTimeout, true)
}

// AwaitFinal is AwaitFirst for the final answer after an interim (1xx)
// one: the replica has the request, so an end of stream here proves
// nothing, and the wait is still bounded by FirstByteTimeout from sent.
func (c *Conn) AwaitFinal(client net.Conn, sent time.Time) error {
	return c.await(client, PhaseHead, sent, c.r.set.cfg.FirstByteTimeout, false)
}

// AwaitMore is AwaitFirst for the next byte of an answer under way: it
// fails after StreamIdleTimeout without a byte. While bytes are buffered
// it returns at once without a system call.
func (c *Conn) AwaitMore(client net.Conn, phase Phase) error {
	if c.Buffered() > 0 {
		return nil
	}
	return c.await(client, phase, monoNow(), c.r.set.cfg.StreamIdleTimeout, phase == PhaseStream)
}

// await waits for a byte. A parked wait (a stream's between its events,
// AwaitFirstParked's) and any wait past its first poll interval (a long
// prefill) hold no read buffer (parkedPeek); the first poll of another
// wait for an answer reads at once, as the parked wait costs a few percent
// more CPU a request (scripts/peers.sh chat) and an answer that comes
// within a poll interval holds its buffer only that long.
func (c *Conn) await(client net.Conn, phase Phase, start time.Time, timeout time.Duration, parked bool) error {
	if c.Buffered() > 0 {
		return nil
	}
	now, left := start, timeout
	park := c.waitFn != nil && parked
	if c.Reader == nil && !park {
		c.takeReader() // a new connection's first wait
	}
	for {
		c.armPoll(now, left)
		// Read at once rather than wait for readiness first. A wait
		// through RawConn.Read that does not read first is not safe:
		// its prepareRead clears a readiness already reported, so an
		// answer that arrived before the wait would sit unseen until the
		// deadline (BenchmarkProxyChat: 163 us against 38 us a request,
		// from such stalls). parkedPeek reads before it waits.
		var err error
		if park {
			err = c.parkedPeek()
		} else {
			_, err = c.Reader.Peek(1)
		}
		park = c.waitFn != nil
		if err == nil {
			c.r.progress.Add(1)
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return c.readError(phase, err)
		}
		now = time.Now()
		left = timeout - now.Sub(start)
		if err := c.ended(client, phase, left); err != nil {
			return err
		}
	}
}

// ended is a wait's verdict at a poll that found nothing, left of its time
// to go: its end, its replica found hung, its client gone; nil while none.
func (c *Conn) ended(client net.Conn, phase Phase, left time.Duration) error {
	switch {
	case left <= 0:
		return c.failSign(phase, SignTimeout, ErrTimeout)
	case c.r.hung.Load():
		return c.failSign(phase, SignHung, ErrHung)
	case client != nil && PeerClosed(client):
		return c.failSign(phase, SignClientGone, ErrClientGone)
	}
	return nil
}

// armPoll sets the read deadline of a wait's poll from now, a poll interval
// away or at the wait's end (left from now) if that is sooner. The
// deadline that an earlier wait on this connection set does as well while
// it is at least half a poll interval away and no later than this wake:
// the poll comes a little sooner, and the runtime's timer is not moved on
// every request (on a busy connection, once in a hundred). Durations from
// now, not times: a time.Time's Add costs several times its Sub.
func (c *Conn) armPoll(now time.Time, left time.Duration) {
	c.src.due = 0 // the wait's deadline is the one
	wait := min(pollInterval, left)
	if d := c.readDeadline.Sub(now); d > wait || d <= pollInterval/2 {
		c.setReadDeadline(now.Add(wait))
	}
}

// parkedPeek is Reader.Peek(1) on an empty buffer that gives the buffer
// back to readers while it waits: a request that waits for its answer, and
// an open stream that waits between its events, holds no read buffer. The
// wait is RawConn.Read with readable as its function, which takes a buffer
// and reads the socket into it before each wait (RawRead's prepareRead
// forgets a readiness already reported, so bytes that came before the wait
// are found by this read, not by the poller), and gives the buffer back
// when there was nothing. The system calls are a plain read's: one read
// when bytes are there, else a failed read, the wait and the read (and at
// an end of stream, one more read through the connection). A socket
// error that the read found (a reset) is returned as a read through the
// connection would have returned it; an end of stream, and errors of the
// wait itself (a closed connection), are left to the Peek that follows, so
// that they read as from Peek itself.
func (c *Conn) parkedPeek() error {
	if c.Reader != nil { // none before a new connection's first wait
		readers.Put(c.Reader)
	}
	c.Reader, c.waitErr = nil, nil
	if parkHook != nil {
		parkHook()
	}
	err := c.rc.Read(c.waitFn)
	if c.Reader != nil {
		return nil
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		c.takeReader()
		return err
	}
	return c.endRead()
}

// takeReader gives c a read buffer from readers, after a wait that held
// none.
func (c *Conn) takeReader() {
	br := readers.Get().(*bufio.Reader)
	br.Reset(&c.src)
	c.Reader = br
}

// endRead is the read after a wait that found the socket's end or an
// error, not bytes: a socket error that readable's read found (a reset) is
// returned as a read through the connection would have returned it; an end
// of stream, and errors of the wait itself (a closed connection), are left
// to a Peek, so that they read as from Peek itself.
func (c *Conn) endRead() error {
	c.takeReader()
	if c.waitErr != nil {
		return &net.OpError{Op: "read", Net: "tcp", Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(),
			Err: os.NewSyscallError("read", c.waitErr)}
	}
	_, err := c.Reader.Peek(1)
	return err
}

// parkHook, when tests set it, is called as a wait parks, its buffer
// given back.
var parkHook func()

// readError types a failed read from the replica. Before the first
// response byte, an end of stream is examined for the signs that the
// replica never read the request (see Judge).
func (c *Conn) readError(phase Phase, err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
		if phase == PhaseAwait {
			if e := c.pendingError(); e != nil {
				// The replica's end was closed with our request unread:
				// its kernel answered the bytes with a reset.
				return c.failSign(phase, SignReset, e)
			}
			if c.unacked() {
				return c.failSign(phase, SignUnacked, ErrClosedBeforeRequest)
			}
		}
	}
	return c.fail(phase, err)
}

// fail returns err as an *Error of phase on c, with the sign read from the
// error itself, and keeps c out of the pool.
func (c *Conn) fail(phase Phase, err error) error {
	sign := SignFailed
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &te) && te.Timeout():
		sign = SignTimeout
	case phase == PhaseAwait && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		sign = SignReset
	}
	return c.failSign(phase, sign, err)
}

func (c *Conn) failSign(phase Phase, sign Sign, err error) error {
	c.broken = true
	return &Error{Phase: phase, Sign: sign, Reused: c.Reused, Err: err}
}

// Fail returns err, met while reading the answer in phase, as an *Error,
// and keeps c out of the pool. An error that is already an *Error is
// returned as it is.
func (c *Conn) Fail(phase Phase, err error) error {
	if _, ok := err.(*Error); ok {
		c.broken = true
		return err
	}
	return c.fail(phase, err)
}

// PrepareHead makes sure that reading a response head cannot block past
// StreamIdleTimeout: a head that is not buffered whole gets that long for
// its rest, not what is left of a wait's poll interval. The deadline is set
// by the first read that the rest needs, so a head buffered whole, the
// common case, costs nothing.
func (c *Conn) PrepareHead() { c.src.due = c.r.set.cfg.StreamIdleTimeout }

// PrepareBody is PrepareHead for a body read whole.
func (c *Conn) PrepareBody() { c.src.due = c.r.set.cfg.StreamIdleTimeout }

// PrepareWhole makes sure that reading a body of unknown length whole (for
// a client that cannot take it streamed) cannot block past
// FirstByteTimeout from its first read.
func (c *Conn) PrepareWhole() { c.src.due = c.r.set.cfg.FirstByteTimeout }

// PrepareLine is PrepareHead for one line of a chunked body.
func (c *Conn) PrepareLine() { c.src.due = c.r.set.cfg.StreamIdleTimeout }

// setReadDeadline sets nc's read deadline and remembers it for await.
func (c *Conn) setReadDeadline(t time.Time) {
	c.nc.SetReadDeadline(t)
	c.readDeadline = t
}

// MarkBroken keeps c out of the pool when it is released.
func (c *Conn) MarkBroken() { c.broken = true }
