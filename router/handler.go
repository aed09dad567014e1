package router

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// Config is the handler's part of the command line.
type Config struct {
	Policy Policy
	// MaxSends is how many replicas one request may be sent to when the
	// earlier ones could not take it (default 2, as in the seed).
	MaxSends int
	// BufferLimit is the largest non-streamed response body read whole
	// before it is written; larger ones are streamed (default 1 MiB).
	BufferLimit int
	// PromptChunk is how many decoded bytes of a completions prompt make
	// one link of its chain (prefixcache.DefaultPromptChunk by default).
	PromptChunk int
	// SessionHeader names the header whose value pins a whole session to
	// one replica, ahead of prefix pins (X-Session-ID by default in
	// main); empty turns sessions off.
	SessionHeader string
	// AccessLog writes one INFO line per request: client, method, path,
	// model, replica, route, status, time to first byte, duration and
	// bytes.
	AccessLog bool
	// Rendezvous places requests that no pin places by rendezvous hashing
	// under a load bound instead of the counter (placement.go): set when
	// several instances serve one fleet, so they agree.
	Rendezvous bool
	// PinStore, when set, shares with other instances the pins that
	// rendezvous placement cannot compute (store.go); nil for local pins
	// only.
	PinStore *pinstore.Store
	// StripAuthorization keeps the client's Authorization and X-Api-Key
	// headers from the replicas (they are passed on by default: a replica
	// may check its own key).
	StripAuthorization bool
	// RelayAbove is how many streams may be open at once before the next
	// ones are relayed on the client's connection, taken over from
	// fasthttp (relay.go): a relayed stream holds about 6 KiB while it
	// waits for its replica, its wait parked with no goroutine on Linux
	// (park.go), where fasthttp's connection goroutine holds 33. 0 relays
	// every stream; negative, none.
	RelayAbove int
	// RelayWaitingAbove is how many requests may wait for their
	// replica's first byte at once before the next ones wait on a relay
	// too, the client's connection taken over as soon as the request is
	// sent (relay.go): such a wait holds neither fasthttp's read buffer
	// (8 KiB) nor its ctx nor, on Linux, a goroutine (park.go), and a
	// burst of requests that all wait at once leaves that much less
	// resident. 0 relays every wait; negative, none.
	RelayWaitingAbove int
	Logger            *slog.Logger
}

// Handler is the proxy's fasthttp handler.
type Handler struct {
	cfg     Config
	set     *upstream.Set
	pins    *prefixcache.PinMap
	m       *Metrics
	counter atomic.Uint64
	log     *slog.Logger
	// writeTimeout is the server's WriteTimeout, extended chunk by chunk
	// while a stream flows (stream.go).
	writeTimeout time.Duration
	// draining is set on SIGTERM: both /health endpoints answer 503 so
	// that load balancers stop sending, while requests are still served.
	draining atomic.Bool
	// cutting is set when the drain's deadline passed: a stream that ends
	// now was cut by the drain, not by its replica.
	cutting atomic.Bool
	// keys are the digests of the API keys, nil when none is required.
	keys atomic.Pointer[[][sha256.Size]byte]
	// budget bounds the large request bodies held at once; nil if off.
	budget *bodyBudget
	// sessionHeader is Config.SessionHeader, nil when off.
	sessionHeader []byte
	// responses maps each Responses API id that a replica returned to
	// that replica, which alone holds the stored response.
	responses *prefixcache.PinMap
	// scrapes is set when the replicas' own queues are read
	// (upstream.Config.ScrapeInterval); meanWork is then the mean prefill
	// bytes of the proxy's recent requests, what a request that another
	// caller queued is taken to cost.
	scrapes  bool
	meanWork atomic.Int64
	// relays are the streams relayed on connections taken over from
	// the server that Server made (relay.go).
	relays relays
	// streams counts the streams open, relayed or not.
	streams atomic.Int64
	// waiting counts the requests sent that wait for their first byte.
	waiting atomic.Int64
	// blockWaits makes relays' waits block their goroutine rather than
	// park (park.go): parkWaits false when h was made.
	blockWaits bool
	// relayBlank is a ctx's response header as the server hands it to
	// Serve: empty, with the server's NoDefaultContentType and
	// NoDefaultDate, which only CopyTo can give another header. A relay's
	// header starts as a copy (relay.go). It is taken before the handler
	// touches the ctx: later, the header may hold a replica's answer.
	relayBlank     fasthttp.ResponseHeader
	relayBlankOnce sync.Once
}

// Drain makes both /health endpoints answer 503 from now on, while the
// proxy goes on serving: the first step of a graceful stop.
func (h *Handler) Drain() { h.draining.Store(true) }

// Cut records that the drain's deadline passed and returns how many
// requests are still in flight: they are about to be cut, and are logged
// as cut by the drain rather than as replica faults.
func (h *Handler) Cut() int64 {
	h.cutting.Store(true)
	var n int64
	for _, r := range h.set.Replicas() {
		n += r.InFlight()
	}
	return n
}

// New returns a handler that routes over set with pins.
func New(cfg Config, set *upstream.Set, pins *prefixcache.PinMap, m *Metrics) *Handler {
	if cfg.MaxSends < 1 {
		cfg.MaxSends = 2
	}
	if cfg.BufferLimit <= 0 {
		cfg.BufferLimit = 1 << 20
	}
	if cfg.PromptChunk <= 0 {
		cfg.PromptChunk = prefixcache.DefaultPromptChunk
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A replica that leaves takes its pins: one that later gets its slot
	// must not inherit its conversations.
	set.Observe(upstream.Observer{Leave: func(r *upstream.Replica) { pins.DropReplica(r.Index) }})
	m.store = cfg.PinStore
	h := &Handler{cfg: cfg, set: set, pins: pins, m: m, log: cfg.Logger,
		responses: prefixcache.NewPinMap(responseCapacity, upstream.MaxReplicas),
		scrapes:   set.Scrapes(), blockWaits: !parkWaits}
	h.warnNoPoller()
	if cfg.SessionHeader != "" {
		h.sessionHeader = []byte(cfg.SessionHeader)
	}
	return h
}

var (
	strHealth          = []byte("/health")
	strChatPath        = []byte("/chat/completions")
	strCompletionsPath = []byte("/completions")
	strMessagesPath    = []byte("/v1/messages") // Anthropic's Messages API
	strResponsesPath   = []byte("/v1/responses")
	strModelsPath      = []byte("/v1/models")
	headerReplica      = []byte("X-Warmroute-Replica")
	headerRoute        = []byte("X-Warmroute-Route")
	strEventStream     = []byte("text/event-stream")
	reasonBytes        [len(ReasonNames)][]byte
	bodyHealthOK       = []byte(`{"status":"ok"}`)
	bodyHealthNoLive   = []byte(`{"status":"no live replica"}`)
	bodyHealthDrain    = []byte(`{"status":"draining"}`)
	replicaNone        = []byte("none")
	strRetryAfter      = []byte("Retry-After")
	strTrailer         = []byte("Trailer")
	retryAfterSeconds  [31][]byte
)

func init() {
	for i, n := range ReasonNames {
		reasonBytes[i] = []byte(n)
	}
	for i := range retryAfterSeconds {
		retryAfterSeconds[i] = strconv.AppendInt(nil, int64(i), 10)
	}
}

// Serve proxies one request.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	h.relayBlankOnce.Do(func() { ctx.Response.Header.CopyTo(&h.relayBlank) })
	h.serve(ctx)
	if h.relays.stopping.Load() {
		// fasthttp closes its own connections after their answer while
		// it shuts down, but not one that a relay handed back to it
		// after its Shutdown returned (relay.go). Asked once the answer
		// is made: an error answer resets the response, and a replica's
		// head replaces it. A relayed stream closes by itself.
		ctx.SetConnectionClose()
	}
}

func (h *Handler) serve(ctx *fasthttp.RequestCtx) {
	start := ctx.Time() // fasthttp read the clock as it called Serve
	if start.IsZero() {
		start = time.Now()
	}
	if ctx.IsGet() && bytes.Equal(ctx.Path(), strHealth) {
		h.health(ctx)
		return
	}
	var held int64
	if h.budget != nil {
		if held, _ = h.budget.claim(&ctx.Request.Header); held > 0 {
			defer h.dropBody(ctx, held)
		}
	}
	if !admit(ctx) || !h.authorized(ctx) {
		return
	}
	if ctx.IsGet() && bytes.Equal(ctx.Path(), strModelsPath) && h.models(ctx) {
		return
	}
	x := acquireExchange(h, ctx, start)
	defer h.survive(x)
	x.bodyHeld = held > 0 // dropBody takes it when serve returns
	if h.cfg.AccessLog {
		x.modelName = append(x.modelName[:0], modelOf(x.body)...)
	}
	if len(x.body) > 0 && ctx.IsPost() {
		// Every JSON body is read for its model; a chat request's
		// messages also make its prefix chain.
		chain, model, err := prefixcache.AppendRequestChain(x.chain[:0], x.body, h.cfg.PromptChunk)
		x.chain, x.model = chain, model
		switch path := ctx.Path(); {
		case bytes.HasSuffix(path, strResponsesPath):
			x.req.Chain, x.responses = chain, true
		case bytes.HasSuffix(path, strChatPath) || bytes.HasSuffix(path, strMessagesPath):
			if err != nil && err != prefixcache.ErrNotChat {
				// Malformed JSON is the replica's to reject; it is spread.
				h.m.malformed.Inc()
			}
			x.req.Chain = chain
		case bytes.HasSuffix(path, strCompletionsPath) && err == nil:
			x.req.Chain, x.req.Prompt = chain, true
		}
	}
	x.req.Size = ChainSize(x.req.Chain, len(x.body))
	x.req.Rendezvous = h.cfg.Rendezvous
	if h.sessionHeader != nil {
		if id := ctx.Request.Header.PeekBytes(h.sessionHeader); len(id) > 0 {
			x.req.Session = SessionKey(id)
		}
	}
	if x.serves = h.set.ModelMask(x.model); x.serves.Empty() {
		h.noSuchModel(x)
		releaseExchange(x)
		return
	}
	if x.responses && !h.followResponse(x) {
		releaseExchange(x)
		return
	}
	if !x.run() {
		releaseExchange(x)
	}
}

// run sends the request until a replica answers or no other may get it,
// and reports whether the answer is streamed, or awaited by a relay: x then
// belongs to fasthttp, which releases it when the stream is closed, or to
// the relay (relay.go).
func (x *exchange) run() bool { return x.route(nil) }

// route is run, from the judgement of pending when it is not nil: the
// error of a send that a relay awaited (relay.go).
func (x *exchange) route(pending *upstream.Error) bool {
	h := x.h
	same := false // the next send goes to x.r again
	var failed *upstream.Replica
	var failErr *upstream.Error
	for {
		err := pending
		pending = nil
		for err == nil {
			if !same {
				d := x.pick()
				idx, reason := d.Replica, d.Reason
				if failed != nil {
					h.logFailover(failed, failErr, idx, x.start)
					if idx >= 0 {
						reason = Failover
						h.m.failovers.Inc()
					}
				}
				if idx < 0 {
					h.unavailable(x)
					return false
				}
				if x.r = h.set.Replica(idx); x.r == nil {
					// It left the set since the pick read the masks.
					x.tried.Add(idx)
					continue
				}
				x.reason = reason
				x.top = d.Top
				x.work = max(x.req.Size-d.Cached, 0)
				if len(x.req.Chain) > 0 {
					// Bytes to tokens as the replicas count them, about
					// four bytes of text a token.
					x.predictedCached = int32(min(d.Cached/bytesPerToken, 1<<31-1))
				}
				x.tried.Add(idx)
				x.sends++
			}
			same = false
			var streamed bool
			if streamed, err = x.send(); err == nil {
				return streamed
			}
		}
		v := upstream.Judge(err)
		h.m.send(x.r.Index, v.Result)
		if v.Demote {
			x.r.Demote(err, time.Now())
		}
		if err.Sign == upstream.SignRejected {
			x.r.Skip(err.RetryAfter, time.Now())
		}
		switch {
		case v.Resend == upstream.Fresh && !x.staleResent:
			// The replica had closed this keep-alive connection: not a
			// send, not a failover. Its other idle ones go too, and the
			// request goes to it again on a fresh connection, once.
			x.staleResent, same = true, true
			x.r.DropIdle()
			continue
		case v.Resend != upstream.Never && x.sends < h.cfg.MaxSends:
			failed, failErr = x.r, err
			continue
		case v.Resend != upstream.Never:
			// Out of sends: the request reached no replica.
			h.logFailover(x.r, err, -1, x.start)
			h.unavailable(x)
			return false
		}
		h.fail(x, v, err)
		return false
	}
}

// mayResend reports whether a request whose replica rejected it could go to
// another: a send is left and an untried replica is live.
func (x *exchange) mayResend() bool {
	if x.sends >= x.h.cfg.MaxSends {
		return false
	}
	return !x.h.set.LiveMask().And(x.serves).AndNot(x.tried).Empty()
}

// send sends the request to x.r and relays the answer. It reports whether
// the answer is streamed; an error means that nothing reached the client,
// and x holds no connection.
func (x *exchange) send() (bool, *upstream.Error) {
	h, r := x.h, x.r
	now := x.start
	if x.resend || h.cfg.PinStore != nil {
		// Pooled connections were released since x.start, or the shared
		// pin store was asked: a connection's idle time counts to now.
		now = x.clock()
	}
	x.resend = true
	// Counted in flight before anything else: a replica removed from the
	// set is let go (its pins dropped) only once nothing is in flight on
	// it, so one that was removed before this count is not used.
	r.Begin()
	if r.State() == upstream.Removed {
		r.End()
		return false, &upstream.Error{Phase: upstream.PhaseDial, Err: errRemoved}
	}
	c, err := r.Acquire(now)
	if err != nil {
		r.End()
		return false, err.(*upstream.Error)
	}
	x.c = c
	if x.ctx != nil {
		x.head = appendRequestHead(x.head[:0], &x.ctx.Request, r, x.ctx.RemoteAddr(), len(x.body), h.cfg.StripAuthorization)
	} else {
		// Sent again by a relay, which has no ctx: the head made for
		// the first send, for this replica.
		x.head = spliceHost(x.head, x.hostAt, x.hostLen, r.Host())
		x.hostLen = len(r.Host())
	}
	sent := x.clock()
	h.m.overhead.Update(sent.Sub(x.start).Seconds())
	// Queued until the first token: the load that the cost policy reads.
	// A replica served by uvicorn (vLLM, SGLang) sends a stream's head
	// before its prefill, so a stream stays queued until its first data
	// (stream.go); any other answer's head comes after it.
	r.Queue(x.work)
	if x.h.scrapes {
		// A moving mean over about 16 requests; a lost update between
		// two cores is harmless.
		if m := x.h.meanWork.Load(); m == 0 {
			x.h.meanWork.Store(x.work)
		} else {
			x.h.meanWork.Store(m + (x.work-m)/16)
		}
	}
	x.queued = true
	x.beginWait()
	if x.relayWaits() {
		// The wait goes to a relay, with the client's connection:
		// nothing of fasthttp's is held while the replica works.
		if err = c.Write(x.head, x.body); err == nil {
			x.sent = sent
			x.waitOnRelay()
			return true, nil
		}
	} else {
		err = c.Send(x.head, x.body, x.client, sent)
	}
	return x.answered(sent, err)
}

// answered relays the answer to the request sent at sent once its first
// byte came (err nil), as send does; an error, or one of respond's, leaves
// x with no connection.
func (x *exchange) answered(sent time.Time, err error) (bool, *upstream.Error) {
	x.endWait()
	if err == nil {
		x.firstByte = x.clock()
		x.h.m.ttfb.Update(x.firstByte.Sub(x.start).Seconds())
		var streamed bool
		if streamed, err = x.respond(sent); err == nil {
			return streamed, nil
		}
	}
	x.unqueue()
	x.c.Close()
	x.r.End()
	x.c = nil
	return false, err.(*upstream.Error)
}

// beginWait counts x in the requests that wait for their first byte, and
// endWait takes it out, once.
func (x *exchange) beginWait() {
	x.waiting = true
	x.h.waiting.Add(1)
}

func (x *exchange) endWait() {
	if x.waiting {
		x.waiting = false
		x.h.waiting.Add(-1)
	}
}

// unqueue takes the request off its replica's queue (Replica.Queue), once.
func (x *exchange) unqueue() {
	if x.queued {
		x.queued = false
		x.r.Unqueue(x.work)
	}
}

// errRemoved is a pick of a replica that left the set as it was picked.
var errRemoved = errors.New("the replica left the set")

// maxInterim bounds the 1xx answers read before the final one.
const maxInterim = 8

var errBadInterim = fmt.Errorf("replica sent 101 Switching Protocols or more than %d interim answers", maxInterim)

// respond relays the replica's answer: the head now, the body whole or as a
// stream. x.c holds at least one response byte. Interim answers are
// consumed (100, 102) or forwarded (103 Early Hints) until the final one.
// For a request that a relay awaited (x.early), the relay writes any
// answer, as a stream does.
func (x *exchange) respond(sent time.Time) (bool, error) {
	h, c, r := x.h, x.c, x.r
	hd := x.answerHeader()
	for interim := 0; ; interim++ {
		c.PrepareHead()
		if err := hd.Read(c.Reader); err != nil {
			return false, c.Fail(upstream.PhaseHead, err)
		}
		status := hd.StatusCode()
		if status >= 200 {
			break
		}
		if status == fasthttp.StatusSwitchingProtocols || interim == maxInterim {
			return false, c.Fail(upstream.PhaseHead, errBadInterim)
		}
		if status == fasthttp.StatusEarlyHints {
			x.earlyHints(hd) // a client that left is found below
		}
		if err := c.AwaitFinal(x.client, sent); err != nil {
			return false, err
		}
	}
	x.status = hd.StatusCode()
	if (x.status == fasthttp.StatusServiceUnavailable || x.status == fasthttp.StatusTooManyRequests) && x.mayResend() {
		c.MarkBroken() // its body is not read
		return false, upstream.RejectedError(x.status, hd.PeekBytes(strRetryAfter), c.Reused)
	}
	if hd.ConnectionClose() {
		// The replica closes its connection; the client keeps its own.
		c.MarkBroken()
		hd.ResetConnectionClose()
	}
	dropResponseHopByHop(hd)
	hd.SetCanonical(headerReplica, r.NameBytes)
	hd.SetCanonical(headerRoute, reasonBytes[x.reason])
	if x.clientHead() || x.status == fasthttp.StatusNoContent || x.status == fasthttp.StatusNotModified {
		x.served()
		if x.early {
			// Its head alone, with the length that the replica gave.
			x.answer.body, x.answer.ready = nil, true
		} else {
			x.ctx.Response.SkipBody = true
		}
		x.finish(upstream.OK)
		return false, nil
	}
	cl := hd.ContentLength()
	if !x.early && cl < 0 && !x.ctx.Request.Header.IsHTTP11() {
		// An HTTP/1.0 client cannot read chunks, and fasthttp chunks a
		// body of unknown length: it is read whole, up to BufferLimit.
		// (A relay awaits an HTTP/1.1 client's requests alone.)
		resp := &x.ctx.Response
		c.PrepareWhole()
		if err := resp.ReadBody(c.Reader, h.cfg.BufferLimit); err != nil {
			return false, c.Fail(upstream.PhaseBody, err)
		}
		if cl == -1 {
			c.MarkBroken() // its trailers are not read
		}
		hd.DelBytes(strTrailer)
		x.served()
		x.finish(upstream.OK)
		return false, nil
	}
	if cl < 0 || cl > h.cfg.BufferLimit || bytes.HasPrefix(hd.ContentType(), strEventStream) {
		// Pinned at the first data, not here: a replica may send a
		// stream's head before its prefill, and a pin says that the
		// prefix is in that replica's cache (stream.go).
		x.startStream(cl)
		x.stream.pin = true
		if x.early {
			x.giveBodyBack() // no send follows, and a stream holds none
			x.relayHead(hd, cl)
			return true, nil
		}
		if x.ctx.Request.Header.IsHTTP11() && x.relayStream(cl) {
			return true, nil
		}
		// The head goes at once, unless the body's first bytes are
		// here already: then it goes with them, in one write.
		resp := &x.ctx.Response
		resp.ImmediateHeaderFlush = !x.dataBuffered()
		// The end goes in the last data's write where fasthttp's end is
		// "0\r\n\r\n": no trailer declared, whose value, the
		// replica's or one of the proxy's own headers, would go there.
		x.stream.endInData = x.stream.chunked && len(hd.PeekBytes(strTrailer)) == 0
		resp.SetBodyStream(x, max(cl, -1))
		return true, nil
	}
	if x.early {
		// Read whole, as fasthttp's way reads it: a body that the
		// replica cuts gets a clean 502, and the pin waits for all of
		// it. It goes into the request body's buffer, which no send
		// needs now.
		c.PrepareBody()
		x.body = slices.Grow(x.body[:0], cl)[:cl]
		if _, err := io.ReadFull(c.Reader, x.body); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return false, c.Fail(upstream.PhaseBody, err)
		}
		x.answer.body, x.answer.ready = x.body, true
		x.served()
		x.finish(upstream.OK)
		return false, nil
	}
	resp := &x.ctx.Response
	c.PrepareBody()
	if err := resp.ReadBody(c.Reader, 0); err != nil {
		return false, c.Fail(upstream.PhaseBody, err)
	}
	if x.responses && x.status >= 200 && x.status < 300 {
		h.recordResponse(stringOf(resp.Body(), strIDKey), r.Index)
	}
	x.served()
	x.finish(upstream.OK)
	return false, nil
}

// answerHeader is where the replica's answer head is read: the response's,
// or, for a request that a relay awaited, whose ctx is fasthttp's again,
// x's own.
func (x *exchange) answerHeader() *fasthttp.ResponseHeader {
	if !x.early {
		return &x.ctx.Response.Header
	}
	return x.ownHeader()
}

// clientHead reports whether the client's request is a HEAD.
func (x *exchange) clientHead() bool {
	if x.early {
		return x.headRequest
	}
	return x.ctx.IsHead()
}

// earlyHints forwards a 103 answer's Link headers to the client.
func (x *exchange) earlyHints(hd *fasthttp.ResponseHeader) {
	if !x.early {
		x.ctx.EarlyHints()
		return
	}
	if t := x.h.writeTimeout; t > 0 {
		x.client.SetWriteDeadline(time.Now().Add(t))
	}
	b := relayBufs.Get().(*relayBuf)
	w := append(b[:0], strEarlyHints...)
	links := len(w)
	for k, v := range hd.All() {
		if string(k) == "Link" && len(v) > 0 && len(w)+len(k)+len(v)+6 <= len(b) {
			w = append(w, k...)
			w = append(w, strColonSpace...)
			w = append(w, v...)
			w = append(w, strCRLF...)
		}
	}
	if len(w) > links { // as fasthttp, none without a link
		w = append(w, strCRLF...)
		x.client.Write(w) // a client that left is found by the wait after it
	}
	relayBufs.Put(b)
}

var strEarlyHints = []byte("HTTP/1.1 103 Early Hints\r\n")

// dropBody gives a large body's bytes back to the budget once the request
// was sent (no resend can need it), and takes its buffer out of fasthttp's
// pool, so that the memory of a burst of large requests comes back to the
// heap, and then the system, without waiting for a pool to be flushed. The
// buffer is kept in the budget's spare ones for the next large body, until
// the burst is over (bodyBudget.giveBack).
func (h *Handler) dropBody(ctx *fasthttp.RequestCtx, n int64) {
	// Done with, streamed or not: nothing reads a request's body once
	// it was sent (the access log has its own copy of the model).
	h.budget.spare.put(ctx.Request.SwapBody(nil))
	h.budget.release(n)
}

// survive keeps a bug in one request from taking every other request and
// stream down with the process, as net/http does for its handlers: it logs
// the panic with its stack, closes the replica connection that x held (so
// that the in-flight count comes back), answers 500 if it still can, and
// closes the client's connection. x is not pooled again.
func (h *Handler) survive(x *exchange) {
	v := recover()
	if v == nil {
		return
	}
	h.log.Error("panic serving a request; the connection is closed", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	x.abandon()
	writeError(x.ctx, fasthttp.StatusInternalServerError, errBodyInternal)
	x.ctx.SetConnectionClose()
}

// finish counts a completed exchange and gives its connection back.
func (x *exchange) finish(res upstream.Result) {
	x.endWait()
	x.unqueue()
	now := x.clock()
	streamed := x.stream.active
	if streamed {
		x.stream.active = false
		x.r.EndStream()
		x.h.streams.Add(-1)
	}
	if res == upstream.OK {
		x.c.Release(now)
	} else {
		x.c.Close()
	}
	x.c = nil
	x.r.End()
	x.h.m.send(x.r.Index, res)
	class := classOf(x.status)
	if res == upstream.ClientGone {
		class = classClientGone
	}
	x.countAnswer(res, streamed) // before the request: a test that saw it counted sees both
	x.h.m.request(x.r.Index, x.reason, class)
	x.h.m.total.Update(now.Sub(x.start).Seconds())
	if x.h.cfg.AccessLog {
		status, n := x.status, x.stream.sent
		if res == upstream.ClientGone {
			status = 499
		}
		switch {
		case streamed:
		case x.early:
			n = int64(len(x.answer.body))
		default:
			n = int64(len(x.ctx.Response.Body()))
		}
		x.logAccess(status, n, x.r.Name, now)
	}
}

// fail answers a request that its replica may have run but did not answer:
// 502 or 504 with a JSON error, or 499 for a client that left.
func (h *Handler) fail(x *exchange, v upstream.Verdict, err *upstream.Error) {
	idx := x.r.Index
	if v.Result == upstream.ClientGone {
		// Nobody is there to read an answer.
		if x.early {
			x.answer.close = true
		} else {
			x.ctx.Response.Reset()
			x.ctx.SetStatusCode(499)
			x.ctx.SetConnectionClose()
		}
		h.m.request(idx, x.reason, classClientGone)
		h.m.total.Update(since(x.start))
		if h.cfg.AccessLog {
			x.logAccess(499, 0, x.r.Name, time.Now())
		}
		return
	}
	if ok, held := x.r.FailLog.Allow(time.Now()); ok && !h.cutting.Load() {
		h.log.Warn("replica failed after it had the request; not retried", "replica", x.r.Name,
			"cause", err.Error(), "phase", err.Phase.String(), "status", v.Status, "suppressed", held)
	}
	body := errBodyBadGateway
	if v.Status == fasthttp.StatusGatewayTimeout {
		body = errBodyTimeout
		if err.Sign == upstream.SignHung {
			body = errBodyHung
		}
	}
	hd := x.writeError(v.Status, body)
	hd.SetCanonical(headerReplica, x.r.NameBytes)
	hd.SetCanonical(headerRoute, reasonBytes[x.reason])
	h.m.request(idx, x.reason, classOf(v.Status))
	h.m.total.Update(since(x.start))
	if h.cfg.AccessLog {
		x.logAccess(v.Status, int64(len(body)), x.r.Name, time.Now())
	}
}

// unavailable answers 503 at once when no replica is live: a request never
// queues behind replicas that may not come back.
func (h *Handler) unavailable(x *exchange) {
	if x.prevResponse != nil {
		h.responseGone(x, x.prevResponse)
		return
	}
	hd := x.writeError(fasthttp.StatusServiceUnavailable, errBodyUnavailable)
	secs := min(h.set.RetryAfter(x.start), len(retryAfterSeconds)-1)
	hd.SetCanonical(strRetryAfter, retryAfterSeconds[secs])
	hd.SetCanonical(headerReplica, replicaNone)
	hd.SetCanonical(headerRoute, reasonBytes[NoReplica])
	h.m.request(-1, NoReplica, classOf(fasthttp.StatusServiceUnavailable))
	h.m.total.Update(since(x.start))
	if h.cfg.AccessLog {
		x.reason = NoReplica
		x.logAccess(fasthttp.StatusServiceUnavailable, int64(len(errBodyUnavailable)), "none", time.Now())
	}
}

// health answers the main listener's GET /health without touching a replica.
func (h *Handler) health(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentTypeBytes(strApplicationJSON)
	status, body := h.healthStatus()
	ctx.SetStatusCode(status)
	ctx.SetBody(body)
}

// healthStatus is the answer of both /health endpoints: 503 while draining
// or with no live replica, else 200.
func (h *Handler) healthStatus() (int, []byte) {
	switch {
	case h.draining.Load():
		return fasthttp.StatusServiceUnavailable, bodyHealthDrain
	case h.set.LiveMask().Empty():
		return fasthttp.StatusServiceUnavailable, bodyHealthNoLive
	}
	return fasthttp.StatusOK, bodyHealthOK
}

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

// Pins returns the handler's pin map.
func (h *Handler) Pins() *prefixcache.PinMap { return h.pins }
