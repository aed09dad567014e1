package router

import (
	"bytes"
	"io"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/tracing"
	"github.com/warmroute/warmroute/upstream"
)

// A request's life, in the order it runs: acquire, shape, choose, send,
// respond (a whole answer, or a stream that fasthttp reads after Serve
// returns), finish, release. The exchange owns the request's state from
// start to end, whole or streamed. The helpers it calls sit below or in
// files named for what they hold; none of them calls back into this file.

// exchange is one request's way through the proxy: the request and its
// chains, the replica it is leased to, why it went there, and since when.
// It is pooled. A streamed answer's body is the exchange itself (Read),
// and it is released when fasthttp closes that stream.
type exchange struct {
	h     *Handler
	ctx   *fasthttp.RequestCtx
	body  []byte
	start time.Time
	req   Request

	r      *upstream.Replica // the replica of the current send
	lease  upstream.Lease    // its hold on r: counts, connection, stream
	reason Reason
	top    int // the request's rendezvous placement (Decision.Top)
	status int
	tried  upstream.Mask // the replicas that had this request, or failed to take it
	sends  int
	// fresh marks a send again on a fresh connection to the same replica,
	// after a stale keep-alive one (upstream.Fresh).
	fresh bool
	model uint64 // the key of the body's model, 0 for none
	// responses marks a Responses API request: the answer's id is
	// recorded (responses.go).
	responses bool
	// ends are the events that end a stream of the request's API, one of
	// which a stream ended by the replica's close must have sent
	// (whole.go); nil for an API not known.
	ends [][]byte
	// prevResponse is the previous_response_id that the request follows
	// to the one replica holding it (body bytes), nil for none.
	prevResponse []byte
	serves       upstream.Mask // the replicas that serve the model
	// firstByte is when the answer's head came (the access log).
	firstByte time.Time
	// work is the prefill that the policy expects the request to cost on
	// its replica (the bytes of its prompt not cached there), queued on
	// the replica until the first byte (upstream.Lease).
	work int64
	// predictedCached is the prompt tokens that the policy expected the
	// replica's cache to hold, checked against what the replica reports
	// (usage.go); -1 when the policy made no prediction.
	predictedCached int32
	// What the replica was believed to hold of the prompt when it was
	// sent (held.go): its bytes, its links, and the stamp of its oldest
	// link (0: no correction possible); heldTick is the stamp that the
	// send recorded, 0 for none.
	heldBytes           int64
	heldFrom            int
	heldStamp, heldTick uint64
	pinned              bool // the answer's pins were recorded (firstData)
	// The prompt and cached tokens that the replica reported (usage.go),
	// -1 when it reported none; verdict is the failure that ended the
	// request, empty for none. Both are for its trace span (trace.go).
	promptTokens, cachedTokens int64
	verdict                    string
	span                       tracing.Span

	stream streamState

	buffers
}

// buffers are what an exchange keeps across uses: they grow to what the
// requests need and stay grown in the pool, so that a busy proxy
// allocates none.
type buffers struct {
	chains prefixcache.Chains // req.Chain's and req.Blocks' storage
	head   []byte             // the request head for the replica
	// tail holds the last bytes that a stream relayed, where its usage is
	// (usage.go); usageWindow bytes.
	tail []byte
	// modelName is the body's model as written, copied for the access
	// log and the trace span: a streamed answer outlives its body, which
	// goes to the next large request (dropBody).
	modelName []byte
	// traceparent is the trace context sent to the replica when tracing
	// is on: the request's span as the parent.
	traceparent []byte
}

var exchangePool = sync.Pool{New: func() any {
	return &exchange{buffers: buffers{tail: make([]byte, usageWindow), head: make([]byte, 0, 512)}}
}}

// Serve proxies one request: the front door's checks, then the request's
// exchange, whose answer is relayed whole before Serve returns or, when
// streamed, after it.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	start := ctx.Time() // fasthttp read the clock as it called Serve
	if start.IsZero() {
		start = time.Now()
	}
	var held int64
	if h.budget != nil {
		if held, _ = h.budget.claim(&ctx.Request.Header); held > 0 {
			defer h.dropBody(ctx, held)
		}
	}
	if !admit(ctx) {
		return
	}
	path := targetPath(ctx.Request.Header.RequestURI())
	if ctx.IsGet() && bytes.Equal(path, strHealth) {
		h.health(ctx)
		return
	}
	if !h.authorized(ctx) {
		return
	}
	if !h.forwards(path) {
		writeError(ctx, fasthttp.StatusNotFound, errBodyNotForwarded)
		return
	}
	if ctx.IsGet() && bytes.Equal(path, strModelsPath) && h.models(ctx) {
		return
	}
	x := exchangePool.Get().(*exchange)
	x.h, x.ctx, x.body, x.start = h, ctx, ctx.PostBody(), start
	x.predictedCached, x.promptTokens, x.cachedTokens = -1, -1, -1
	defer h.survive(x)
	if h.cfg.AccessLog || h.cfg.Tracer != nil {
		x.modelName = append(x.modelName[:0], modelOf(x.body)...)
	}
	if h.cfg.Tracer != nil {
		x.startSpan()
	}
	x.shape()
	switch {
	case x.serves.Empty():
		h.noSuchModel(x)
	case x.responses && !h.followResponse(x):
	case x.run():
		return // streamed: fasthttp reads the answer, then CloseWithError
	}
	x.end(upstream.OK)
}

// shape reads what the policy routes by from the request: every JSON
// body's model, a chat, Messages, Responses or completions request's
// prefix chains, its session, and the replicas that serve its model.
func (x *exchange) shape() {
	h, ctx := x.h, x.ctx
	if len(x.body) > 0 && ctx.IsPost() {
		c := &x.chains
		err := c.Read(x.body, h.cfg.PromptChunk)
		x.model = c.Model
		chained := true
		switch path := ctx.Path(); {
		case bytes.HasSuffix(path, strResponsesPath):
			x.responses, x.ends = true, endsResponses
		case bytes.HasSuffix(path, strChatPath) || bytes.HasSuffix(path, strMessagesPath):
			if err != nil && err != prefixcache.ErrNotChat {
				// Malformed JSON is the replica's to reject; it is spread.
				h.m.malformed.Inc()
			}
			x.ends = endsChat
			if bytes.HasSuffix(path, strMessagesPath) {
				x.ends = endsMessages
			}
		case bytes.HasSuffix(path, strCompletionsPath):
			x.ends = endsChat
			x.req.Prompt = err == nil
			chained = err == nil
		default:
			chained = false
		}
		if chained {
			x.req.Chain, x.req.Blocks = c.Messages, c.Blocks
		}
	}
	x.req.Size = ChainSize(x.req.Blocks, len(x.body))
	x.req.Rendezvous = h.cfg.Rendezvous
	x.req.Session = h.sessionOf(&ctx.Request.Header, &x.chains)
	x.serves = h.set.ModelMask(x.model)
}

// run sends the request until a replica answers or no other may get it:
// choose a replica, send, and on a failure the verdict of upstream.Judge,
// which decides every resend and is asked nowhere else. It reports whether
// the answer is streamed; otherwise the client's answer is complete, the
// replica's or the proxy's own.
func (x *exchange) run() bool {
	h := x.h
	if !x.choose() {
		h.unavailable(x)
		return false
	}
	for {
		streamed, e := x.send()
		if e == nil {
			return streamed
		}
		from := x.r
		v := upstream.Judge(e, x.attempt())
		h.m.send(from.Index, v.Result)
		if v.Demote {
			from.Demote(e, time.Now())
		}
		if v.Skip > 0 {
			from.Skip(v.Skip, time.Now())
		}
		x.fresh = v.Resend == upstream.Fresh
		switch {
		case x.fresh:
			// The replica had closed this keep-alive connection: not a
			// send, not a failover. Its other idle ones go too, and the
			// request goes to it again.
			from.DropIdle()
			x.lease.Take(from, x.work)
			x.hold()
		case v.Resend == upstream.Other:
			ok := x.choose()
			to := -1
			if ok {
				to, x.reason = x.r.Index, Failover
				h.m.failovers.Inc()
			}
			h.logFailover(from, e, to, x.start)
			if !ok {
				h.unavailable(x)
				return false
			}
		case v.Status == fasthttp.StatusServiceUnavailable:
			// It reached no replica, and none other may get it.
			x.verdict = v.Result.String()
			h.logFailover(from, e, -1, x.start)
			h.unavailable(x)
			return false
		default:
			h.fail(x, v, e)
			return false
		}
	}
}

// attempt is how far the request has gone, as Judge weighs it.
func (x *exchange) attempt() upstream.Attempt {
	others := !x.h.set.LiveMask().And(x.serves).AndNot(x.tried).Empty()
	return upstream.Attempt{Sends: x.sends, MaxSends: x.h.cfg.MaxSends, Fresh: x.fresh, Others: others}
}

// choose picks the replica of the next send and leases it, and reports
// false when none is left.
func (x *exchange) choose() bool {
	for {
		d := x.pick()
		idx := d.Replica
		if idx < 0 {
			return false
		}
		if x.r = x.h.set.Replica(idx); x.r == nil || x.r != x.lease.Replica() {
			// It left the set since the pick read the masks (and
			// another may have joined in its slot: picked anew).
			x.lease.End(false, time.Time{})
			if x.r == nil {
				x.tried.Add(idx)
			}
			continue
		}
		x.reason, x.top = d.Reason, d.Top
		if len(x.req.Chain) > 0 {
			// Bytes to tokens as the replicas count them, about four
			// bytes of text a token.
			x.predictedCached = int32(min(d.Cached/bytesPerToken, 1<<31-1))
		}
		x.tried.Add(idx)
		x.sends++
		// What it will hold is recorded after it is counted queued: a
		// pick that sees the one sees the other.
		x.hold()
		return true
	}
}

// send sends the request on its lease and relays the answer. It reports
// whether the answer is streamed; an error means that nothing reached the
// client, and the lease was ended.
func (x *exchange) send() (bool, *upstream.Error) {
	h, r := x.h, x.r
	now := x.start
	if x.sends > 1 || x.fresh || h.cfg.PinStore != nil {
		// Pooled connections were released since x.start, or the shared
		// pin store was asked: a connection's idle time counts to now.
		now = x.clock()
	}
	c, e := x.lease.Connect(now)
	if e != nil {
		return x.abandon(e)
	}
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
		return x.abandon(e)
	}
	x.firstByte = x.clock()
	h.m.ttfb.Update(x.firstByte.Sub(x.start).Seconds())
	x.status = hd.StatusCode()
	if upstream.Rejects(x.status) && x.attempt().Elsewhere() {
		// Dropped unread: another replica gets the request. Otherwise
		// the refusal is the client's answer.
		e := upstream.RejectedError(x.status, hd.PeekBytes(strRetryAfter), c.Reused)
		c.Discard()
		hd.Reset()
		return x.abandon(e)
	}
	if e := x.respond(); e != nil {
		return x.abandon(e)
	}
	return x.stream.body != nil, nil
}

// abandon ends the lease of a send that failed before anything reached
// the client, and takes back what the replica was believed to hold of the
// request.
func (x *exchange) abandon(e *upstream.Error) (bool, *upstream.Error) {
	x.lease.End(false, time.Time{})
	x.unhold()
	return false, e
}

// respond relays the answer whose head is in the response: with no body,
// read whole, or as a stream that fasthttp reads after Serve returns.
func (x *exchange) respond() *upstream.Error {
	h, c, r, ctx := x.h, x.lease.Conn(), x.r, x.ctx
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
		return nil
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
		return nil
	}
	if e := c.ReadWhole(&ctx.Response, limit); e != nil {
		return e
	}
	if closedJSON && !jsonWhole(ctx.Response.Body()) {
		return errAnswerCut
	}
	if x.responses && x.status >= 200 && x.status < 300 {
		h.recordResponse(stringOf(ctx.Response.Body(), strIDKey), r.Index)
	}
	return nil
}

// startStream hands the body, of length cl as fasthttp reads it, to
// fasthttp as a stream that x reads from the replica (Read).
func (x *exchange) startStream(cl int) {
	ctx := x.ctx
	s := &x.stream
	*s = streamState{result: upstream.OK, written: x.clock()}
	x.lease.Stream()
	// The handler's own write deadline, which the stream moves on as it
	// flows (Read); fasthttp then also flushes the answer whole, its end
	// included, before it serves a request pipelined behind it.
	if t := x.h.writeTimeout; t > 0 {
		ctx.SetWriteDeadline(time.Now().Add(t))
	}
	s.checkEnd = cl == -2 && x.ends != nil && bytes.HasPrefix(ctx.Response.Header.ContentType(), strEventStream)
	s.body = x.lease.Conn().Stream(cl, ctx.Conn(), &ctx.Response.Header)
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

// Read relays the stream's next bytes from the replica. fasthttp calls it
// from the connection's goroutine after Serve returned and writes each
// result as one chunk, flushed at once, so the client gets what one read
// from the replica gave, without delay; then a chunked answer's trailers,
// read into the response header. A Read that fails returns a non-EOF
// error: fasthttp closes the client connection without the last chunk,
// and the client sees an error, never a clean end.
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
			s.idSeen = x.h.recordStreamedID(p[:n], x.r.Index)
		}
		if s.checkEnd && !s.ended {
			s.ended = hasAny(p[:n], x.ends)
		}
		x.keepTail(p[:n]) // where the usage is, read when it ends (usage.go)
		s.sent += int64(n)
		x.firstData()
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

// firstData records the answer's first data, once: the prefill is done,
// so the request leaves its replica's queue, and the prefix is in that
// replica's cache. A replica may send a stream's head before its prefill,
// so a stream is not recorded as served at its head.
func (x *exchange) firstData() {
	x.lease.FirstByte()
	if !x.pinned {
		x.pinned = true
		x.recordPins()
	}
}

// CloseWithError is called by fasthttp once the streamed answer is
// written or abandoned; writeErr is the error writing to the client, if
// any.
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
	x.end(res)
	return nil
}

// end finishes the exchange, if a replica answered it, with res, and
// releases it.
func (x *exchange) end(res upstream.Result) {
	if x.lease.Replica() != nil {
		x.finish(res)
	}
	k := x.buffers
	k.head = k.head[:0]
	*x = exchange{buffers: k}
	exchangePool.Put(x)
}

// finish counts a completed exchange and ends its lease. An answer is
// recorded as served (pins, the pin store) at its first data, or here for
// a 2xx answer with none.
func (x *exchange) finish(res upstream.Result) {
	if x.status < 200 || x.status >= 300 {
		x.unhold() // the replica refused it: it prefilled nothing
	}
	if res == upstream.OK {
		// Recorded while the request still counts in flight: a replica
		// that left the set drops its pins when the last one ends.
		x.firstData()
	}
	now := x.clock()
	idx, name := x.r.Index, x.r.Name
	streamed := x.lease.End(res == upstream.OK, now)
	x.h.m.send(idx, res)
	class, status, n := classOf(x.status), x.status, x.stream.sent
	if res == upstream.ClientGone {
		class, status = classClientGone, 499
	}
	if res != upstream.OK {
		x.verdict = res.String()
	}
	if !streamed {
		n = int64(len(x.ctx.Response.Body()))
	}
	x.countAnswer(res, streamed) // before the request: a test that saw it counted sees both
	x.record(idx, class, status, n, name, now)
}

// clock reads the clock for x: x.start plus the monotonic time since, one
// clock read where time.Now makes two (wall and monotonic).
func (x *exchange) clock() time.Time { return x.start.Add(time.Since(x.start)) }

// logFailover writes the one WARN line of a failover, throttled per replica.
func (h *Handler) logFailover(from *upstream.Replica, cause *upstream.Error, to int, now time.Time) {
	ok, held := from.FailoverLog.Allow(now)
	if !ok {
		return
	}
	dest := "none"
	if to >= 0 {
		if r := h.set.Replica(to); r != nil {
			dest = r.Name
		}
	}
	h.log.Warn("failover", "replica", from.Name, "cause", cause.Error(), "phase", cause.Phase.String(), "to", dest, "suppressed", held)
}
