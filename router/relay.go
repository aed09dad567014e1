package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/rawsock"
	"github.com/warmroute/warmroute/upstream"
)

// A stream's answer is written by a relay, on the client's connection
// taken over from fasthttp, not by fasthttp's connection goroutine through
// a body stream. That goroutine, parked in the body's Read between two
// events, held its read buffer (8 KiB), its write buffer (4 KiB), the
// stream's copy buffer (4 KiB), the request's ctx, and a stack grown by
// the handler: about 31 KiB of a stream's 34, where nginx holds 14
// (peers-issue13.md, session 9). The relay holds none of them while it
// waits: fasthttp releases its buffers and ctx when the handler hijacks
// the connection, the relay's wait is parked with no goroutine (park.go;
// elsewhere than Linux, its worker waits on a stack of about 4 KiB), and
// its buffer is taken only while it has bytes to write.
// When the stream ended whole, the connection waits for its next request
// and goes back to fasthttp (Server.ServeConn).
//
// The relay costs a stream about 9k user-space instructions more than
// fasthttp's body stream (cachegrind, SSE of 16 events: 45.7k -> 54.4k):
// a goroutine that fasthttp starts for the hijack, two handoffs to
// workers, deadlines moved, and ServeConn's setup of the connection again.
// In CPU time a request with the proxy on a core of its own it was not
// measurably dearer (9 interleaved rounds, 119.7 -> 116.3 us), but with
// the CPUs shared with the load and the replicas it made 8% fewer SSE
// requests a core (SHARED=1 scripts/peers.sh, every round). Memory
// matters when many streams are open, so Config.RelayAbove keeps
// fasthttp's way for the first streams open at once (main's default: 64,
// at most 1.3 MiB more than relaying them).
// Streams to a client of HTTP/1.0, or through a server that h.Server did
// not make, are written by fasthttp.
//
// A request that waits for its replica's first byte holds the same in
// fasthttp's goroutine: its 8 KiB read buffer, the ctx, and an 8 KiB stack.
// When a burst of requests all wait at once, that peak stays resident after
// their streams were relayed (scripts/streams.sh, all at once: 32.7 KiB a
// stream, nginx 13.7). So past Config.RelayWaitingAbove requests waiting at
// once, the next ones wait on a relay too (waitOnRelay): the connection is
// taken over as soon as the request is written, and the relay awaits the
// first byte, reads the head, and writes whatever answer comes, a stream
// or not (respond with x.early), or the proxy's own (writeAnswer). It
// sends the request again where run would (route), so it keeps the body,
// until the answer comes, and where to splice another replica's Host into
// the head. A relayed wait costs a chat request about 11k instructions
// more (31.9k -> 42.9k, scripts/instructions.sh); for a stream it replaces
// the relay at the head, at the same cost. main's default, 256, keeps
// fasthttp's way for all but large bursts.

const (
	// relayData is the most data one chunk carries: fasthttp's copy
	// buffer, so that the chunks are the ones it made.
	relayData = 4 << 10
	// relayHeadRoom is room for a head written with the first chunk; a
	// larger head goes alone.
	relayHeadRoom = 2 << 10
	// chunkRoom is room for a chunk's size line before its data.
	chunkRoom = 8
	// relayFrom is where a chunk's data is read into a relay buffer.
	relayFrom = relayHeadRoom + chunkRoom
)

// relayBuf is a relay's buffer: the head, a chunk's size line, its data,
// and the CRLF and the last chunk after it.
type relayBuf [relayFrom + relayData + len(lastChunk)]byte

var relayBufs = sync.Pool{New: func() any { return new(relayBuf) }}

// lastChunk ends a chunked body that has no trailers.
const lastChunk = "\r\n0\r\n\r\n"

// relayStream hands x's stream to a relay: it writes the head into x.head
// (the request's, sent already) and hijacks the client's connection, which
// fasthttp hands to x.hijacked once the handler returned.
//
// It reports false, and does nothing, while no more than Config.RelayAbove
// streams are open (this one counted), and for a connection that Listener
// did not wrap: fasthttp then writes the stream.
func (x *exchange) relayStream(cl int) bool {
	if above := x.h.cfg.RelayAbove; above < 0 || x.h.streams.Load() <= int64(above) || !x.relayable() {
		return false
	}
	x.keepForRelay()
	x.relayHead(&x.ctx.Response.Header, cl)
	x.hijackForRelay()
	return true
}

// relayWaits reports whether the request that x is about to send is to be
// awaited by a relay (waitOnRelay): more than Config.RelayWaitingAbove
// requests wait for their first byte (this one counted), and the relay can
// take every answer over. It cannot an HTTP/1.0 client's (fasthttp reads
// its body of unknown length whole), a Responses API request's (its id is
// read from the body) or a large body's, which the budget takes back as
// the handler returns.
func (x *exchange) relayWaits() bool {
	above := x.h.cfg.RelayWaitingAbove
	if above < 0 || x.h.waiting.Load() <= int64(above) || x.ctx == nil || x.responses || x.bodyHeld {
		return false
	}
	return x.ctx.Request.Header.IsHTTP11() && x.relayable()
}

// relayable reports whether x's connection can be taken over: one that
// Listener wrapped, of a server that h.Server made.
func (x *exchange) relayable() bool {
	g, ok := x.client.(guarded)
	return ok && g.relayState() != nil && x.h.relays.srv.Load() != nil
}

// waitOnRelay hands x, sent already, to a relay, which awaits its answer
// and writes it (relayOnce). x keeps the request's body for a second send
// until the answer comes, and gives fasthttp a spare buffer for it, so that
// neither allocates.
func (x *exchange) waitOnRelay() {
	x.early = true
	x.headRequest = x.ctx.IsHead()
	x.hostAt, x.hostLen = hostAt(&x.ctx.Request.Header), len(x.r.Host())
	// If the ctx goes back to fasthttp without a hijack (a client that
	// left), Close ends x so.
	x.stream.result = upstream.ClientGone
	// The server's answers carry no Content-Type or Date but the
	// replica's, and the relay's neither (Handler.relayBlank).
	x.h.relayBlank.CopyTo(x.ownHeader())
	sp, _ := keptBodies.Get().(*keptBody)
	if sp == nil {
		sp = new(keptBody)
	}
	x.body, x.spare = x.ctx.Request.SwapBody(sp.b), sp
	sp.b = nil
	x.keepForRelay()
	x.hijackForRelay()
}

// keptBody is a body buffer, pooled in keptBodies: the bodies that relays
// keep for a second send (waitOnRelay) go back there once their answer
// came, so that an open stream holds none.
type keptBody struct{ b []byte }

var keptBodies sync.Pool

// maxKeptBody is the largest body buffer pooled in keptBodies: a larger one
// goes to the collector (the budget's spare ones are for large bodies).
const maxKeptBody = 64 << 10

// giveBodyBack gives the body that x kept for a second send to keptBodies,
// if it kept one: no send follows.
func (x *exchange) giveBodyBack() {
	if x.spare == nil {
		return
	}
	if cap(x.body) <= maxKeptBody {
		x.spare.b = x.body[:0]
	}
	keptBodies.Put(x.spare)
	x.spare, x.body = nil, nil
}

// keepForRelay copies from the ctx what a relay needs of it: whether the
// client closes the connection after this answer, and the access log's
// method and path.
func (x *exchange) keepForRelay() {
	ctx := x.ctx
	x.answer.close = ctx.Request.Header.ConnectionClose() || x.h.relays.stopping.Load()
	if x.h.cfg.AccessLog {
		x.logMethod = append(x.logMethod[:0], ctx.Method()...)
		x.logPath = append(x.logPath[:0], ctx.Path()...)
	}
}

// relayHead writes into x.head the head of an answer that a relay writes,
// hd with the body's framing (cl -1 chunked, as fasthttp would) and the
// client's Connection: close.
func (x *exchange) relayHead(hd *fasthttp.ResponseHeader, cl int) {
	hd.SetContentLength(max(cl, -1))
	x.stream.clientChunked = cl < 0
	if x.closeAfter(hd) {
		x.stream.closeAfter = true
	}
	x.head = hd.AppendBytes(x.head[:0])
}

// closeAfter reports whether the connection closes after the answer whose
// head is hd, and says so in hd: the client asked, or the server stopped
// since (an answer that a relay awaited is written long after the hijack),
// as fasthttp's own answers say it while it shuts down.
func (x *exchange) closeAfter(hd *fasthttp.ResponseHeader) bool {
	if x.answer.close || x.h.relays.stopping.Load() {
		x.answer.close = true
		hd.SetConnectionClose()
	}
	return x.answer.close
}

// hijackForRelay takes the client's connection from fasthttp for a relay.
func (x *exchange) hijackForRelay() {
	x.relayed = true
	x.h.relays.start()
	x.client.(guarded).relayState().waiting.Store(x)
	if x.hijack == nil {
		x.hijack = x.hijacked
	}
	x.ctx.HijackSetNoResponse(true)
	x.ctx.Hijack(x.hijack)
}

// writeError makes the proxy's own error answer: the ctx's response, or
// x's own head with body for a relay to write (writeAnswer).
func (x *exchange) writeError(status int, body []byte) *fasthttp.ResponseHeader {
	if !x.early {
		writeError(x.ctx, status, body)
		return &x.ctx.Response.Header
	}
	hd := x.ownHeader()
	x.h.relayBlank.CopyTo(hd)
	hd.SetStatusCode(status)
	hd.SetContentTypeBytes(strApplicationJSON)
	hd.SetContentLength(len(body))
	x.answer.body, x.answer.ready = body, true
	return hd
}

// guarded is a client connection that a stream can be relayed on: it keeps
// the stream's relayState.
type guarded interface {
	relayState() *relayState
}

// relayState is what a client connection keeps of a stream relayed on it.
type relayState struct {
	// waiting is the stream between the handler's hijack and fasthttp's
	// call of the hijack handler, which does not come when fasthttp
	// cannot flush the answers it buffered before it (a client that
	// left): it closes the connection instead, and Close ends the stream.
	waiting atomic.Pointer[exchange]
	// unreading makes a read return errUnreading at once (unread).
	unreading bool
	// handoff is held from the hijack until fasthttp's Close of the
	// connection after it, which closeHeld makes a no-op: the relay
	// closes the connection, or serves it again, only after that.
	handoff   sync.Mutex
	closeHeld atomic.Bool
	// prev and next link the connection in relays.idle.
	prev, next *coarseConn
}

func (c *coarseConn) relayState() *relayState { return &c.relay }

// errUnreading is a read's error while a hijack handler takes what
// fasthttp's buffer holds: the socket is not read.
var errUnreading = errors.New("router: reading fasthttp's buffer only")

// Close ends the stream that waited for its hijack, if any, and skips the
// close that fasthttp makes after a hijack: the relay owns the connection.
func (c *coarseConn) Close() error {
	if c.relay.closeHeld.CompareAndSwap(true, false) {
		c.relay.handoff.Unlock()
		return nil
	}
	if x := c.relay.waiting.Swap(nil); x != nil {
		x.h.relays.done()
		x.CloseWithError(net.ErrClosed)
	}
	if max := c.linger.Swap(0); max > 0 {
		c.lingerClose(max)
	}
	return c.Conn.Close()
}

func (c *coarseConn) lingerOnClose(max int64) { c.linger.Store(max) }

// lingerClose ends c's writing and reads and drops up to max bytes, for
// lingerTime at most (lingerer).
func (c *coarseConn) lingerClose(max int64) {
	s, ok := c.Conn.(socket)
	if !ok {
		return
	}
	s.CloseWrite()
	c.Conn.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c.Conn, max)
}

// hijacked is the hijack handler of a relayed stream. It runs in a
// goroutine of fasthttp's that holds the connection's read buffer and the
// ctx until it returns, so the relay runs on a worker of its own.
func (x *exchange) hijacked(c net.Conn) {
	st := x.client.(guarded).relayState()
	st.waiting.Store(nil)
	// The ctx goes back to fasthttp's pool when this returns, with the
	// body, unless x kept it for a relay's second send: x lets go of
	// both, for the collector and for any use of them by mistake.
	x.ctx = nil
	if !x.early {
		x.body = nil
	}
	st.unreading = true
	x.pipelined = unread(c, x.pipelined[:0])
	st.unreading = false
	st.handoff.Lock()
	st.closeHeld.Store(true)
	relayWorkers.do(x)
}

// A stream is relayed, and then its connection served, on workers
// (workers.go), which keep the stacks that their work grew.
var (
	relayWorkers workers[*exchange] // run is set in init: a relay, sending again, reaches relayWorkers itself
	serveWorkers = workers[serveJob]{run: serveOn}
)

func init() { relayWorkers.run = (*exchange).relay }

// serveJob is a relayed stream's connection with a request there, and the
// server to serve it: the one that its handler made last. The connection
// stays counted in relays until ServeConn returns.
type serveJob struct {
	c   net.Conn
	srv *fasthttp.Server
	r   *relays
}

// testHookServe, when set, is called as a relayed connection's next
// request is about to be served by srv.
var testHookServe func(srv *fasthttp.Server)

func serveOn(j serveJob) {
	if testHookServe != nil {
		testHookServe(j.srv)
	}
	j.srv.ServeConn(j.c)
	j.r.done()
}

// unread appends to dst what fasthttp's reader holds of the client's
// connection past the streamed request: a pipelined next request, rarely
// anything. c is the hijacked connection, which reads through that buffer
// and then from a connection in unreading, which returns at once.
func unread(c net.Conn, dst []byte) []byte {
	b := relayBufs.Get().(*relayBuf)
	for {
		n, err := c.Read(b[:])
		dst = append(dst, b[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	relayBufs.Put(b)
	return dst
}

// relay writes x's stream, then waits for the connection's next request
// and hands it to a serve worker, or closes it. The connection is counted
// in h.relays throughout, until ServeConn returns or it is closed: a drain
// that saw none could otherwise end while a request that came just before
// it is served, outside fasthttp's sight until ServeConn counts it.
func (x *exchange) relay() {
	h, conn := x.h, x.client
	keep, parked, pending := x.relayOnce()
	if parked {
		return // x is the poller's; its wake calls relay again
	}
	st := conn.(guarded).relayState()
	st.handoff.Lock() // fasthttp has made its Close
	st.handoff.Unlock()
	if len(pending) > 0 {
		if pc, ok := conn.(*pipelinedConn); ok {
			pc.rest = pending // what it held went to fasthttp's buffer, and from there to pending
		} else {
			conn = &pipelinedConn{Conn: conn, rest: pending}
		}
	}
	srv := h.relays.srv.Load()
	if !keep || !h.relays.awaitRequest(conn, srv) {
		conn.Close()
		h.relays.done()
		return
	}
	// A request that came as the drain began is served, with
	// Connection: close (Serve), and the drain waits for it.
	serveWorkers.do(serveJob{c: conn, srv: srv, r: &h.relays})
}

// awaitRequest waits, as fasthttp does between two requests of a
// connection, for the next request on a relayed stream's connection, and
// reports whether one came. ServeConn would take its wait for the request
// itself for the first of a new connection: ReadTimeout, not IdleTimeout,
// and a 408 answer when it passes. The wait holds no buffer. StopStreams
// ends it at once (false): the idle connection is closed, and its client
// opens another, elsewhere, rather than send a request into the drain.
func (r *relays) awaitRequest(conn net.Conn, srv *fasthttp.Server) bool {
	idle := srv.IdleTimeout
	if idle <= 0 {
		idle = srv.ReadTimeout
	}
	for {
		switch c := conn.(type) {
		case *pipelinedConn:
			if len(c.rest) > 0 {
				return true
			}
			conn = c.Conn
			continue
		case *coarseSocket:
			return r.idleWait(&c.coarseConn, idle)
		}
		return !r.stopping.Load() // another kind, in memory: ServeConn waits
	}
}

// idleWait is awaitRequest on a socket: the connection is listed in r's
// idle ones meanwhile, for StopStreams to wake.
func (r *relays) idleWait(c *coarseConn, idle time.Duration) bool {
	rc, ok := c.Conn.(*rawsock.Conn)
	if !ok {
		return !r.stopping.Load()
	}
	var t time.Time
	if idle > 0 {
		t = time.Now().Add(idle)
	}
	c.read.ask(t)
	if c.applyRead() != nil {
		return false
	}
	r.mu.Lock()
	if r.stopping.Load() {
		r.mu.Unlock()
		return false
	}
	c.relay.next, c.relay.prev = r.idle, nil
	if r.idle != nil {
		r.idle.relay.prev = c
	}
	r.idle = c
	r.mu.Unlock()
	err := rc.AwaitReadable()
	r.mu.Lock()
	if c.relay.prev != nil {
		c.relay.prev.relay.next = c.relay.next
	} else {
		r.idle = c.relay.next
	}
	if c.relay.next != nil {
		c.relay.next.relay.prev = c.relay.prev
	}
	c.relay.next, c.relay.prev = nil, nil
	r.mu.Unlock()
	// A request there is served even if the drain began meanwhile; a
	// wait that StopStreams ended returns its deadline error.
	return err == nil
}

// relayOnce writes x's stream, closes it, and reports whether the
// connection may serve another request, with the bytes of it that fasthttp
// had read already. A panic is logged and closes the connection, as in
// survive.
func (x *exchange) relayOnce() (keep, parked bool, pending []byte) {
	defer func() {
		if v := recover(); v != nil {
			x.h.log.Error("panic relaying a stream; the connection is closed", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			x.abandon()
			if x.early && !x.answer.started {
				// Nothing reached the client yet: it gets a 500, as
				// survive answers.
				x.writeError(fasthttp.StatusInternalServerError, errBodyInternal)
				x.answer.close = true
				x.writeAnswer()
			}
			keep, parked = false, false
		}
	}()
	if x.early && !x.park.head {
		streamed, err := x.awaitAnswer()
		if err == errParked {
			return false, true, nil
		}
		x.park.head = true
		if !streamed {
			keep = x.writeAnswer()
			pending, x.pipelined = x.pipelined, nil
			releaseExchange(x)
			return keep, false, pending
		}
	}
	err := x.writeStream()
	if err == errParked {
		return false, true, nil
	}
	keep = err == nil && x.stream.done && !x.stream.closeAfter
	if len(x.pipelined) > 0 {
		pending, x.pipelined = x.pipelined, nil // the pooled x keeps none of it
	}
	x.CloseWithError(err)
	return keep, false, pending
}

// writeStream writes the answer's head and body to the client: what each
// Read of the replica's bytes gives as one chunk (or as it is, for a body
// of known length), then the last chunk and the trailers. It returns the
// stream's error (a replica that cut it, a client that left) or the
// error of a write to the client.
func (x *exchange) writeStream() error {
	s := &x.stream
	var head []byte
	if !x.answer.started { // not a relay resumed from a parked wait
		if t := x.h.writeTimeout; t > 0 {
			x.client.SetWriteDeadline(time.Now().Add(t))
			s.written = x.clock()
		}
		x.answer.started = true
		head = x.head
		if len(head) > relayHeadRoom || !x.dataBuffered() {
			// The client learns at once that the answer started; the
			// first data, when it comes, goes in its own write.
			if _, err := x.client.Write(head); err != nil {
				return err
			}
			head = nil
		}
	}
	for {
		if !s.done && s.err == nil && x.c.Buffered() == 0 && x.awaitDataParked() {
			// Parked, without a buffer (head is nil: it waits only
			// with data buffered); a failure of the wait is the
			// stream's error, which Read returns.
			return errParked
		}
		b := relayBufs.Get().(*relayBuf)
		// What a Read gives goes to the client even with an error: the
		// data before a fault in the replica's stream.
		n, err := x.Read(b[relayFrom : relayFrom+relayData])
		if n > 0 && err == nil && x.endBuffered() {
			// The end came with the data: it goes in the same write.
			// This Read takes it, with no byte and no wait.
			_, err = x.Read(b[relayFrom+n : relayFrom+n+1])
		}
		lo, hi := relayFrom, relayFrom+n
		var trailers []byte
		if s.clientChunked {
			switch {
			case n > 0 && err == io.EOF && x.trailerSection() == nil:
				lo = chunkSizeLine(b, n)
				hi += copy(b[hi:], lastChunk)
			case n > 0:
				lo = chunkSizeLine(b, n)
				hi += copy(b[hi:], "\r\n")
			case err != io.EOF:
			default:
				if trailers = x.trailerSection(); trailers == nil {
					hi += copy(b[hi:], lastChunk[2:])
				} else {
					hi += copy(b[hi:], "0\r\n")
				}
			}
		}
		if head != nil {
			lo -= copy(b[lo-len(head):lo], head)
			head = nil
		}
		var werr error
		if hi > lo {
			_, werr = x.client.Write(b[lo:hi])
		}
		relayBufs.Put(b)
		if werr != nil {
			return werr
		}
		if x.sc != nil && head == nil && !s.pin {
			x.dropScratch() // the pin is made and the head written
		}
		if err != nil && err != io.EOF {
			return err
		}
		if trailers != nil {
			_, werr = x.client.Write(trailers)
		}
		if err == io.EOF {
			return werr
		}
	}
}

// awaitAnswer awaits the first byte of the request that waitOnRelay handed
// over, parked (awaitParked: relayed waits come in bursts), then its answer
// as send does, and sends it again as run does when it may. It reports
// whether there is an answer's body to relay (x.stream), or else the
// proxy's own answer (x.answer) to write; or errParked.
func (x *exchange) awaitAnswer() (bool, error) {
	err := x.awaitParked(upstream.PhaseAwait, x.sent)
	if err == errParked {
		return false, err
	}
	streamed, uerr := x.answered(x.sent, err)
	if uerr != nil {
		return x.route(uerr), nil
	}
	return streamed, nil
}

// writeAnswer writes the proxy's own answer that x.answer holds, and reports
// whether the connection may serve another request: not after none, for a
// client that left.
func (x *exchange) writeAnswer() bool {
	if !x.answer.ready {
		return false
	}
	x.answer.started = true
	hd := x.relayHeader
	x.closeAfter(hd)
	if t := x.h.writeTimeout; t > 0 {
		x.client.SetWriteDeadline(time.Now().Add(t))
	}
	b := relayBufs.Get().(*relayBuf)
	w := hd.AppendBytes(b[:0])
	body := x.answer.body
	if x.headRequest {
		body = nil
	}
	if len(w)+len(body) <= len(b) {
		// Head and body in one write, as fasthttp's writer sends a
		// small answer.
		w = append(w, body...)
		body = nil
	}
	_, err := x.client.Write(w)
	if err == nil && len(body) > 0 {
		_, err = x.client.Write(body)
	}
	relayBufs.Put(b)
	return err == nil && !x.answer.close
}

// chunkSizeLine writes the size line of a chunk of n bytes of data, which
// start at relayFrom in b, before them, and returns where it starts.
func chunkSizeLine(b *relayBuf, n int) int {
	const hex = "0123456789abcdef"
	i := relayFrom - 2
	b[i], b[i+1] = '\r', '\n'
	for {
		i--
		b[i] = hex[n&15]
		if n >>= 4; n == 0 {
			return i
		}
	}
}

// trailerSection returns the trailer section that a relayed stream's
// replica sent, ended by its blank line, or nil for none: only a chunked
// answer has trailers.
func (x *exchange) trailerSection() []byte {
	if !x.stream.chunked || x.relayHeader == nil {
		return nil
	}
	if t := x.relayHeader.TrailerHeader(); len(t) > len("\r\n") {
		return t
	}
	return nil
}

// abandon closes the replica connection that x held, so that the
// in-flight count comes back; x is not pooled again.
func (x *exchange) abandon() {
	if x.c == nil {
		return
	}
	x.endWait()
	x.unqueue()
	x.c.Close()
	x.c = nil
	if x.stream.active {
		x.r.EndStream()
		x.h.streams.Add(-1)
	}
	x.r.End()
}

// pipelinedConn is a client connection whose next bytes fasthttp read
// before the stream before them was relayed.
type pipelinedConn struct {
	net.Conn
	rest []byte
}

func (c *pipelinedConn) Read(p []byte) (int, error) {
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *pipelinedConn) lingerOnClose(max int64) {
	if l, ok := c.Conn.(lingerer); ok {
		l.lingerOnClose(max)
	}
}

// relayState is the connection's under it, so that its next streams are
// relayed too.
func (c *pipelinedConn) relayState() *relayState {
	if g, ok := c.Conn.(guarded); ok {
		return g.relayState()
	}
	return nil
}

// SyscallConn and CloseWrite keep the socket's methods (socket).
func (c *pipelinedConn) SyscallConn() (syscall.RawConn, error) {
	if s, ok := c.Conn.(socket); ok {
		return s.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// PeerClosed asks the socket under it: bytes of a pipelined request
// already read do not keep a client that left from being found gone.
func (c *pipelinedConn) PeerClosed() bool { return upstream.PeerClosed(c.Conn) }

func (c *pipelinedConn) CloseWrite() error {
	if s, ok := c.Conn.(socket); ok {
		return s.CloseWrite()
	}
	return errors.ErrUnsupported
}

// relays counts, for the drain, the connections taken over from fasthttp
// for a stream: while it is relayed, while the connection waits for its
// next request, and while ServeConn serves it again. It serves them with
// srv, the last server that Handler.Server made; none is relayed before it.
type relays struct {
	srv atomic.Pointer[fasthttp.Server]
	n   atomic.Int64
	// stopping is set when the server stops: a connection whose stream
	// ends is closed, not served again.
	stopping atomic.Bool
	// idle lists the connections that wait for their next request after
	// a stream (idleWait), linked through their relayState, under mu.
	mu   sync.Mutex
	idle *coarseConn
}

func (r *relays) start() { r.n.Add(1) }
func (r *relays) done()  { r.n.Add(-1) }

// StopStreams closes each client connection whose relayed stream ends from
// now on, rather than serving its next request; call it before the
// server's Shutdown.
//
// It also ends, at once, the wait of every connection idle after its
// relayed stream: they close, as fasthttp's Shutdown closes its own idle
// ones.
func (h *Handler) StopStreams() {
	r := &h.relays
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping.Store(true)
	for c := r.idle; c != nil; c = c.relay.next {
		// Recorded as set, so that a request that came just before,
		// and is served, has its own deadline set again.
		c.read.mu.Lock()
		c.read.set.Store(unixNano(aLongTimeAgo))
		c.Conn.SetReadDeadline(aLongTimeAgo)
		c.read.mu.Unlock()
	}
}

// aLongTimeAgo is a read deadline that ends a wait at once.
var aLongTimeAgo = time.Unix(1, 0)

// StreamsDone waits until no connection is held by a relay, or ctx is
// done: a stream being relayed, or a request that came after one. The
// server's Shutdown does not wait for them, as their connections are not
// its own until ServeConn takes them back.
func (h *Handler) StreamsDone(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for h.relays.n.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
