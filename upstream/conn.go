package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Conn is one keep-alive connection to a replica. A Conn belongs to one
// request between Acquire and Release; it is not safe for concurrent use.
// It owns its deadlines: each wait and read sets the one it needs.
type Conn struct {
	nc net.Conn
	rc syscall.RawConn // nil where the connection is not a socket
	// sock is the TCP connection under nc when nc is TLS (tls.go): rc
	// is its socket's.
	sock *tlsSocket
	// br reads the answer. It comes from readers when bytes come, and
	// goes back while a wait finds none (fill) and with Release: a stream
	// between its events, a request waiting for its answer and an idle
	// pooled connection hold no read buffer.
	br  *bufio.Reader
	src source
	r   *Replica
	// Reused is true when the connection served a request before this one.
	Reused bool
	broken bool
	// streamed marks a connection whose last answer was a chunked stream:
	// some replicas (llama.cpp's llama-server) close the connection after
	// every one without saying so, and keep it after a body of known
	// length, however long. It is pooled only for a replica seen
	// keeping one (Release), and peeked at before it is used again,
	// however briefly it sat idle (Acquire). afterStream keeps it for the
	// request that reuses it (readError).
	streamed, afterStream bool
	// lastUse is the clock reading of the Release that pooled c last.
	lastUse time.Time
	// writeDeadline is set while a write deadline of a large request is.
	writeDeadline bool
	// readDeadline is the read deadline set last (await).
	readDeadline time.Time
	// until is when the answer under way must have ended
	// (ResponseTimeout), zero for no bound.
	until time.Time
	bufs  [2][]byte
	iov   net.Buffers
	body  Body

	// peekFn is c.peek, made once per connection so that a peek at this
	// socket (alive) or at the client's (clientGone) allocates nothing;
	// peekN, peekErr and peekBuf are its.
	peekFn  func(fd uintptr)
	peekN   int
	peekErr error
	peekBuf [1]byte
	// waitFn is c.readable, made once per connection (fill); nil where
	// the connection's buffer is held through its waits. waitErr is the
	// socket error that its read found.
	waitFn  func(fd uintptr) bool
	waitErr error
	// out is a small request that the wait for its answer writes
	// (writeInWait), of which outN bytes went.
	out  *[]byte
	outN int
	// client is the client of the request on c, whose socket a wait
	// polls (clientGone) through clientRC.
	client   net.Conn
	clientRC syscall.RawConn
}

// source is what a Conn's reader reads: the connection, with the read
// deadline that the next read needs set by that read, so that reading an
// answer already buffered whole moves no deadline; or, inside a wait's
// readable, its socket with one non-blocking read.
type source struct {
	nc  net.Conn
	c   *Conn
	due time.Duration // the deadline from the next read, 0 for none
	raw bool          // inside readable: read fd
	fd  uintptr
}

func (s *source) Read(p []byte) (int, error) {
	if s.raw {
		return readSocket(s.fd, p)
	}
	if s.due > 0 {
		s.c.readDeadline = time.Now().Add(s.due)
		s.nc.SetReadDeadline(s.c.readDeadline)
		s.due = 0
	}
	return s.nc.Read(p)
}

// connReadBuffer is the size of a replica connection's read buffer, held
// while bytes of an answer are buffered. A replica's answer head must fit
// in it (vLLM's and SGLang's are about 200
// bytes); a body larger than it is read around it, and an SSE event is
// smaller.
const connReadBuffer = 4 << 10

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, connReadBuffer) }}

func newConn(nc net.Conn, r *Replica) *Conn {
	c := &Conn{nc: nc, r: r}
	c.src = source{nc: nc, c: c}
	c.peekFn = c.peek
	sock := nc
	if tc, ok := nc.(*tls.Conn); ok {
		c.sock = tc.NetConn().(*tlsSocket)
		sock = c.sock.Conn
	}
	if sc, ok := sock.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			if c.sock == nil {
				// The answer's bytes are read from the socket itself:
				// TLS's must be read through TLS.
				c.waitFn = c.waitFunc()
			}
		}
	}
	return c
}

// Buffered returns the answer's bytes read from the socket and not yet
// consumed.
func (c *Conn) Buffered() int {
	if c.br == nil {
		return 0
	}
	return c.br.Buffered()
}

// Close closes c for good: the replica sees its connection end, which is how
// a request whose client left is cancelled.
func (c *Conn) Close() {
	c.broken = true
	c.closeSocket()
}

// closeSocket closes the socket and gives the read buffer back.
func (c *Conn) closeSocket() {
	if c.sock != nil {
		c.closeTLS()
	} else {
		c.nc.Close()
	}
	c.dropReader()
	c.dropOut()
	c.forgetClient()
}

// forgetClient drops the request's client, which a pooled connection must
// not keep alive.
func (c *Conn) forgetClient() { c.client, c.clientRC = nil, nil }

func (c *Conn) dropReader() {
	if c.br != nil {
		c.br.Reset(nil)
		readers.Put(c.br)
		c.br = nil
	}
}

// MarkBroken keeps c out of the pool when it is released.
func (c *Conn) MarkBroken() { c.broken = true }

// largeWrite is the size past which a request's write is bounded by a
// deadline: a smaller one fits in the socket's buffer and cannot block on
// a replica that stopped reading.
const largeWrite = 64 << 10

// write sends the request head and body in one writev. A write larger than
// largeWrite is bounded by StreamIdleTimeout. An error is in PhaseWrite:
// the replica did not get the whole request.
func (c *Conn) write(head, body []byte) *Error {
	if len(head)+len(body) > largeWrite {
		c.nc.SetWriteDeadline(time.Now().Add(c.r.set.cfg.StreamIdleTimeout))
		c.writeDeadline = true
	} else if c.writeDeadline {
		c.nc.SetWriteDeadline(time.Time{})
		c.writeDeadline = false
	}
	if c.sock != nil && len(body) > 0 && len(head)+len(body) <= inWaitWrite {
		if err := c.writeRecord(head, body); err != nil {
			return c.fail(PhaseWrite, err)
		}
		return nil
	}
	c.bufs[0], c.bufs[1] = head, body
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

// inWaitWrite bounds a request that its wait writes (writeInWait): a
// larger one's copy would cost about what the wait's saved read does.
const inWaitWrite = 8 << 10

var outBufs = sync.Pool{New: func() any { b := make([]byte, 0, inWaitWrite); return &b }}

// writeInWait readies a small request to be written by the wait for its
// answer (writeOut), once the runtime's poller waits for the answer:
// written before, the answer could come before the poller waited, and the
// wait would have to read the socket first to find it empty.
func (c *Conn) writeInWait(head, body []byte) bool {
	if c.waitFn == nil || c.Buffered() > 0 || len(head)+len(body) > inWaitWrite {
		return false
	}
	c.out, c.outN = outBufs.Get().(*[]byte), 0
	*c.out = append(append((*c.out)[:0], head...), body...)
	return true
}

// writeOut is readable's first call for a request that writeInWait
// readied: false (wait) once the request went whole; true otherwise, and
// await writes the rest, or meets the error, with write.
func (c *Conn) writeOut(fd uintptr) bool {
	n, err := writeSocket(fd, (*c.out)[c.outN:])
	if c.outN += n; err == nil && c.outN == len(*c.out) {
		c.dropOut()
		return false
	}
	return true
}

func (c *Conn) dropOut() {
	if c.out != nil {
		outBufs.Put(c.out)
		c.out = nil
	}
}

// sent passes on a failed write's error, or nil when the replica answered
// before it took the whole request (a 413, say) and stopped reading: its
// answer is the request's, and c is not reused.
func (c *Conn) sent(err *Error) *Error {
	if err == nil || err.Sign == SignTimeout || !c.answered() {
		return err
	}
	c.broken = true
	return nil
}

// pollInterval is how often a wait for the replica looks at the client and
// at the replica's state: a client that leaves has its upstream request
// cancelled, and a replica found hung releases its waiters, within this
// time.
const pollInterval = 250 * time.Millisecond

// await blocks until a byte of the answer is buffered. It fails timeout
// after start, when client (if not nil) closes its connection, or when the
// replica is demoted as hung. An end of stream before the first byte of
// the answer (PhaseAwait) is examined for the signs that the replica never
// read the request (see Judge).
func (c *Conn) await(client net.Conn, phase Phase, start time.Time, timeout time.Duration) *Error {
	if c.Buffered() > 0 {
		return nil
	}
	c.src.due = 0
	now := start
	for {
		left := timeout - now.Sub(start)
		var e *Error
		switch {
		case left <= 0:
			e = c.failSign(phase, SignTimeout, ErrTimeout)
		case c.r.hung.Load() && c.out == nil:
			// A request not yet written (writeInWait) goes first: the
			// verdict, that the replica may be running it, holds.
			e = c.failSign(phase, SignHung, ErrHung)
		case now != start && client != nil && c.clientGone(client):
			e = c.failSign(phase, SignClientGone, ErrClientGone)
		}
		if e == nil {
			c.armPoll(now, left)
			switch err := c.fill(); {
			case err == nil:
				c.r.progress.Add(1)
				return nil
			case err == errWriteShort:
				e = c.sent(c.write((*c.out)[c.outN:], nil))
				c.dropOut()
			case !errors.Is(err, os.ErrDeadlineExceeded):
				e = c.readError(phase, err)
			}
		}
		if e != nil {
			c.dropOut()
			c.takeReader() // as after any read, for the reads that follow
			return e
		}
		now = time.Now()
	}
}

// errWriteShort is fill's when writeOut did not write the request whole.
var errWriteShort = errors.New("request not written whole")

// fill waits for bytes and reads them into a buffer from readers. Where
// the socket can be waited on without a read (waitFn), the empty buffer
// goes back to readers while it waits, and a new one takes the bytes
// (readable). An error is a read's: the read deadline, an end of stream
// or a socket error.
func (c *Conn) fill() error {
	if c.waitFn == nil {
		c.takeReader()
		_, err := c.br.Peek(1)
		return err
	}
	c.dropReader()
	c.waitErr = nil
	err := c.rc.Read(c.waitFn)
	switch {
	case c.br != nil:
		return nil
	case c.out != nil:
		return errWriteShort
	case err != nil:
		return err // the deadline, or the connection closed
	case c.waitErr != nil:
		// A reset, say, which the read consumed: a read after it would
		// find only an end of stream.
		return &net.OpError{Op: "read", Net: "tcp", Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(),
			Err: os.NewSyscallError("read", c.waitErr)}
	}
	return io.EOF
}

// readable is the function of fill's RawConn.Read: true (stop waiting)
// once the socket had bytes, its end or an error to read; false (wait for
// the runtime's poller) while it has nothing. Bytes are read into a buffer
// from readers, which becomes c.br; with nothing, the buffer goes back.
func (c *Conn) readable(fd uintptr) bool {
	if c.out != nil {
		return c.writeOut(fd)
	}
	br := readers.Get().(*bufio.Reader)
	c.src.raw, c.src.fd = true, fd
	br.Reset(&c.src)
	_, err := br.Peek(1)
	c.src.raw = false
	if br.Buffered() > 0 {
		c.br = br
		return true
	}
	br.Reset(nil)
	readers.Put(br)
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return false
	case err != io.EOF:
		c.waitErr = err
	}
	return true
}

// takeReader gives c a read buffer, if it holds none.
func (c *Conn) takeReader() {
	if c.br == nil {
		c.br = readers.Get().(*bufio.Reader)
		c.br.Reset(&c.src)
	}
}

// armPoll sets the read deadline of a wait's poll, a poll interval from now
// or at the wait's end (left from now) if that is sooner. The deadline that
// an earlier wait set does as well while it is at least half a poll
// interval away and no later than this one's: the poll comes a little
// sooner, and the runtime's timer is not moved for every event of a
// stream.
func (c *Conn) armPoll(now time.Time, left time.Duration) {
	wait := min(pollInterval, left)
	if d := c.readDeadline.Sub(now); d > wait || d <= pollInterval/2 {
		c.readDeadline = now.Add(wait)
		c.nc.SetReadDeadline(c.readDeadline)
	}
}

// readError types a failed read from the replica. Before the first
// response byte, an end of stream is examined for the signs that the
// replica never read the request (see Judge).
func (c *Conn) readError(phase Phase, err error) *Error {
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
			if c.afterStream {
				// The replica closed the connection that carried its
				// last stream as this request went out on it.
				c.r.closedAfterStream()
			}
		}
	}
	return c.fail(phase, err)
}

// fail returns err as an *Error of phase on c, with the sign read from the
// error itself, and keeps c out of the pool.
func (c *Conn) fail(phase Phase, err error) *Error {
	if e, ok := err.(*Error); ok {
		c.broken = true
		return e
	}
	sign := SignFailed
	switch {
	case isTimeout(err):
		sign = SignTimeout
	case phase == PhaseAwait && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		sign = SignReset
	}
	return c.failSign(phase, sign, err)
}

func (c *Conn) failSign(phase Phase, sign Sign, err error) *Error {
	c.broken = true
	return &Error{Phase: phase, Sign: sign, Reused: c.Reused, Err: err}
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}
