package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// streamState is an exchange's relay of a response body that is not read
// whole: SSE, chunked, or large. fasthttp calls Read from the connection's
// goroutine after the handler returns and writes each result as one chunk,
// flushed at once, so the client gets what one read from the replica gave,
// without delay; then a chunked answer's trailers, read into the response
// header. A Read that fails returns a non-EOF error: fasthttp closes the
// client connection without the last chunk, and the client sees an error,
// never a clean end.
type streamState struct {
	body    *upstream.Body
	active  bool      // counted in the replica's streams
	done    bool      // the body ended whole
	written time.Time // when the client's write deadline was last moved
	sent    int64     // body bytes relayed, for the access log
	idSeen  bool      // a Responses stream's id was recorded
	// checkEnd is set for an SSE stream of a known API that ends when the
	// replica closes: it must send one of the exchange's ends (whole.go),
	// and ended records that it did.
	checkEnd, ended bool
	pinned          bool  // served was called
	kept            int64 // bytes written to the exchange's tail (keepTail)
	result          upstream.Result
	err             error
}

// startStream hands the body, of length cl as fasthttp reads it, to
// fasthttp as a stream that x reads from the replica.
func (x *exchange) startStream(cl int) {
	ctx := x.ctx
	s := &x.stream
	*s = streamState{result: upstream.OK, active: true, written: x.clock()}
	x.r.BeginStream()
	// The handler's own write deadline, which the stream moves on as it
	// flows (Read); fasthttp then also flushes the answer whole, its end
	// included, before it serves a request pipelined behind it.
	if t := x.h.writeTimeout; t > 0 {
		ctx.SetWriteDeadline(time.Now().Add(t))
	}
	s.checkEnd = cl == -2 && x.ends != nil && bytes.HasPrefix(ctx.Response.Header.ContentType(), strEventStream)
	s.body = x.c.Stream(cl, ctx.Conn(), &ctx.Response.Header)
	// No resend can need the request's body now: a stream must not keep
	// it alive past the body budget, which dropBody gives back.
	x.body = nil
	// The head goes at once, unless the body's first bytes are here
	// already: then it goes with them, in one write. A replica may send a
	// stream's head before its prefill, and the client learns that the
	// request was taken.
	ctx.Response.ImmediateHeaderFlush = !s.body.Ready()
	ctx.Response.SetBodyStream(x, max(cl, -1))
}

// errStreamCut is what the client's connection is closed with when the
// replica's stream broke.
var errStreamCut = errors.New("replica stream cut")

func (x *exchange) Read(p []byte) (_ int, err error) {
	defer x.contain(&err)
	s := &x.stream
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.body.Read(p)
	// The client's write deadline moves on as the stream flows, after the
	// wait for the replica and before fasthttp writes what came: only a
	// client that stops reading for the write timeout is cut, however long
	// the replica was silent.
	if t := x.h.writeTimeout; t > 0 {
		if now := x.clock(); now.Sub(s.written) > t/4 {
			x.ctx.SetWriteDeadline(time.Now().Add(t))
			s.written = now
		}
	}
	if n > 0 {
		if x.responses && !s.idSeen && s.sent < responseIDWithin {
			x.recordStreamedID(p[:n])
		}
		if s.checkEnd && !s.ended {
			s.ended = hasAny(p[:n], x.ends)
		}
		x.keepTail(p[:n]) // where the usage is, read when it ends (usage.go)
		s.sent += int64(n)
		x.dataCame()
	}
	switch {
	case err == io.EOF && s.checkEnd && !s.ended && !hasAny(x.streamTail(), x.ends):
		// Its last event may have come split across two reads; the
		// tail holds it whole.
		return n, x.cut(errStreamEnded)
	case err == io.EOF:
		s.done = true
		return n, io.EOF
	case err != nil:
		return n, x.cut(err.(*upstream.Error))
	}
	return n, nil
}

// dataCame records the answer's first data, once: the prefill is done, so
// the request leaves its replica's queue, and the prefix is in that
// replica's cache. A replica may send a stream's head before its prefill,
// so a stream is not recorded as served at its head.
func (x *exchange) dataCame() {
	x.unqueue()
	if !x.stream.pinned {
		x.stream.pinned = true
		x.served()
	}
}

// contain turns a panic in Read into a cut stream, logged with its stack
// as survive logs one in Serve: fasthttp, which calls Read after Serve
// returned, would recover it and log it at DEBUG alone. The replica's
// connection is closed (finish), and the proxy serves on.
func (x *exchange) contain(err *error) {
	v := recover()
	if v == nil {
		return
	}
	x.h.log.Error("panic relaying a stream; it is cut", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	x.stream.result, x.stream.err = upstream.MaybeRunning, errStreamCut
	*err = errStreamCut
}

func (x *exchange) cut(e *upstream.Error) error {
	s := &x.stream
	s.result = upstream.Judge(e, upstream.Attempt{}).Result
	switch {
	case s.result == upstream.ClientGone:
		s.err = upstream.ErrClientGone
	case x.h.cutting.Load():
		s.err = errStreamCut
		x.h.log.Debug("stream cut by the drain's deadline", "replica", x.r.Name, "cause", e.Error())
	default:
		s.err = errStreamCut
		if ok, held := x.r.CutLog.Allow(time.Now()); ok {
			x.h.log.Warn("replica stream cut; the client sees a truncated stream", "replica", x.r.Name, "cause", e.Error(), "suppressed", held)
		}
	}
	return s.err
}

// CloseWithError is called by fasthttp once the response is written or
// abandoned; writeErr is the error writing to the client, if any.
func (x *exchange) CloseWithError(writeErr error) error {
	res := x.stream.result
	if res == upstream.OK && (!x.stream.done || writeErr != nil) {
		// fasthttp stopped reading, or a write failed: the client went
		// away, or stopped reading for the write timeout.
		res = upstream.ClientGone
		if isTimeout(writeErr) {
			x.h.log.Debug("client stopped reading a stream; cut after the write timeout", "client", x.ctx.RemoteAddr().String(), "replica", x.r.Name)
		}
	}
	x.finish(res)
	releaseExchange(x)
	return nil
}
