package router

import (
	"bytes"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// send sends the request to x.r and relays the answer. It reports whether
// the answer is streamed; an error means that nothing reached the client,
// and x holds no connection.
func (x *exchange) send() (bool, *upstream.Error) {
	h, r := x.h, x.r
	now := x.start
	if x.sends > 1 || x.fresh || h.cfg.PinStore != nil {
		// Pooled connections were released since x.start, or the shared
		// pin store was asked: a connection's idle time counts to now.
		now = x.clock()
	}
	// Counted in flight before anything else: a replica removed from the
	// set is let go (its pins dropped) only once nothing is in flight on
	// it, so one that was removed before this count is not used.
	r.Begin()
	if r.State() == upstream.Removed {
		x.unqueue()
		r.End()
		return false, &upstream.Error{Phase: upstream.PhaseDial, Err: errRemoved}
	}
	if !x.queued {
		x.queue(r)
	}
	// What it will hold is recorded after it is counted queued: a pick
	// that sees the one sees the other.
	x.hold()
	c, err := r.Acquire(now)
	if err != nil {
		x.unqueue()
		r.End()
		return false, err.(*upstream.Error)
	}
	x.c = c
	x.head = appendRequestHead(x.head[:0], &x.ctx.Request, r, x.ctx.RemoteAddr(), len(x.body), h.cfg.StripAuthorization)
	sent := x.clock()
	h.m.overhead.Update(sent.Sub(x.start).Seconds())
	if h.scrapes {
		// A moving mean over about 16 requests; a lost update between
		// two cores is harmless.
		if m := h.meanWork.Load(); m == 0 {
			h.meanWork.Store(x.work)
		} else {
			h.meanWork.Store(m + (x.work-m)/16)
		}
	}
	hd := &x.ctx.Response.Header
	if e := c.RoundTrip(x.head, x.body, hd, x.ctx.Conn(), x.ctx, sent); e != nil {
		return false, x.drop(e)
	}
	x.firstByte = x.clock()
	h.m.ttfb.Update(x.firstByte.Sub(x.start).Seconds())
	x.status = hd.StatusCode()
	if upstream.Rejects(x.status) {
		e := upstream.RejectedError(x.status, hd.PeekBytes(strRetryAfter), c.Reused)
		if upstream.Judge(e, upstream.Attempt{Sends: x.sends, MaxSends: h.cfg.MaxSends, Others: x.others()}).Resend != upstream.Never {
			c.Discard()
			hd.Reset()
			return false, x.drop(e)
		}
	}
	streamed, e := x.respond()
	if e != nil {
		return false, x.drop(e)
	}
	return streamed, nil
}

// drop lets go of x's connection after a failed send, and returns its
// error.
func (x *exchange) drop(e *upstream.Error) *upstream.Error {
	x.letGo(false, time.Time{})
	return e
}

// queue counts the request on r's queue, as picked: queued until the first
// token, the load that the cost policy reads. It is counted when the
// request is picked (under the pick's lock, when the policy reads the
// load) or at the latest before the connection is had, so that the
// requests picked while this one dials see it. A replica served by
// uvicorn (vLLM, SGLang) sends a stream's head before its prefill, so a
// stream stays queued until its first data (stream.go); any other
// answer's head comes after it.
func (x *exchange) queue(r *upstream.Replica) {
	r.Queue(x.work)
	x.queued, x.queuedOn = true, r
}

// unqueue takes the request off its replica's queue (Replica.Queue), once.
func (x *exchange) unqueue() {
	if x.queued {
		x.queued = false
		x.queuedOn.Unqueue(x.work)
	}
}

// errRemoved is a pick of a replica that left the set as it was picked.
var errRemoved = errors.New("the replica left the set")

// respond relays the answer whose head is in the response: with no body,
// read whole, or as a stream (stream.go), which fasthttp reads after the
// handler returns.
func (x *exchange) respond() (bool, *upstream.Error) {
	h, c, r, ctx := x.h, x.c, x.r, x.ctx
	hd := &ctx.Response.Header
	hd.ResetConnectionClose() // the replica's: the client keeps its own
	if !bytes.Equal(hd.Protocol(), strHTTP11Proto) {
		// An HTTP/1.0 replica's: the answer's version is the proxy's, or
		// the client would close a connection that the proxy keeps.
		hd.SetProtocol(strHTTP11Proto)
	}
	dropResponseHopByHop(hd)
	hd.SetCanonical(headerReplica, r.NameBytes)
	hd.SetCanonical(headerRoute, reasonBytes[x.reason])
	if ctx.IsHead() || x.status == fasthttp.StatusNoContent || x.status == fasthttp.StatusNotModified {
		ctx.Response.SkipBody = true
		x.finish(upstream.OK)
		return false, nil
	}
	cl := hd.ContentLength()
	// A JSON answer that ends when the replica closes is read whole, up to
	// BufferLimit, so that one cut short gets a 502 rather than a stream
	// whose end looks clean (whole.go).
	closedJSON := cl == -2 && bytes.HasPrefix(hd.ContentType(), strApplicationJSON)
	limit := 0
	switch {
	case cl < 0 && (closedJSON || !ctx.Request.Header.IsHTTP11()):
		// An HTTP/1.0 client cannot read chunks, and fasthttp chunks a
		// body of unknown length: it is read whole too.
		limit = h.cfg.BufferLimit
	case cl < 0 || cl > h.cfg.BufferLimit || bytes.HasPrefix(hd.ContentType(), strEventStream):
		x.startStream(cl)
		return true, nil
	}
	if e := c.ReadWhole(&ctx.Response, limit); e != nil {
		return false, e
	}
	if closedJSON && !jsonWhole(ctx.Response.Body()) {
		return false, errAnswerCut
	}
	if x.responses && x.status >= 200 && x.status < 300 {
		h.recordResponse(stringOf(ctx.Response.Body(), strIDKey), r.Index)
	}
	x.finish(upstream.OK)
	return false, nil
}
