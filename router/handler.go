package router

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
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
	Logger             *slog.Logger
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
		scrapes:   set.Scrapes()}
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

// Serve proxies one request: it reads the request's shape, then runs the
// loop of pick, round trip and judgement (run) until a replica answers or
// none may get it.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
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
	if h.cfg.AccessLog {
		x.modelName = append(x.modelName[:0], modelOf(x.body)...)
	}
	x.shape()
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

// shape reads what the policy routes by from the request: every JSON
// body's model, and a chat, Messages, Responses or completions request's
// prefix chain.
func (x *exchange) shape() {
	h, ctx := x.h, x.ctx
	if len(x.body) > 0 && ctx.IsPost() {
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
}

// run sends the request until a replica answers or no other may get it:
// pick a replica, round trip, and on a failure the verdict of
// upstream.Judge, which decides every resend. It reports whether the
// answer is streamed: x then belongs to fasthttp, which releases it when
// the stream is closed (stream.go).
func (x *exchange) run() bool {
	h := x.h
	for {
		if !x.fresh {
			if !x.choose() {
				return false
			}
		}
		streamed, err := x.send()
		if err == nil {
			return streamed
		}
		v := upstream.Judge(err, upstream.Attempt{Sends: x.sends, MaxSends: h.cfg.MaxSends, Fresh: x.fresh, Others: x.others()})
		h.m.send(x.r.Index, v.Result)
		if v.Demote {
			x.r.Demote(err, time.Now())
		}
		if v.Skip > 0 {
			x.r.Skip(v.Skip, time.Now())
		}
		x.fresh = v.Resend == upstream.Fresh
		switch {
		case x.fresh:
			// The replica had closed this keep-alive connection: not a
			// send, not a failover. Its other idle ones go too.
			x.r.DropIdle()
		case v.Resend == upstream.Other:
			x.failed, x.failErr = x.r, err
		case v.Status == fasthttp.StatusServiceUnavailable:
			// It reached no replica, and none other may get it.
			h.logFailover(x.r, err, -1, x.start)
			h.unavailable(x)
			return false
		default:
			h.fail(x, v, err)
			return false
		}
	}
}

// choose picks the replica of the next send, and reports false when none
// is left: the request is then answered 503.
func (x *exchange) choose() bool {
	h := x.h
	for {
		d := x.pick()
		idx, reason := d.Replica, d.Reason
		if x.failed != nil {
			h.logFailover(x.failed, x.failErr, idx, x.start)
			x.failed = nil
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
		x.reason, x.top = reason, d.Top
		x.work = max(x.req.Size-d.Cached, 0)
		if len(x.req.Chain) > 0 {
			// Bytes to tokens as the replicas count them, about four
			// bytes of text a token.
			x.predictedCached = int32(min(d.Cached/bytesPerToken, 1<<31-1))
		}
		x.tried.Add(idx)
		x.sends++
		return true
	}
}

// others reports whether a replica that has not had the request could take
// it: live, and serving its model.
func (x *exchange) others() bool {
	return !x.h.set.LiveMask().And(x.serves).AndNot(x.tried).Empty()
}

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
		r.End()
		return false, &upstream.Error{Phase: upstream.PhaseDial, Err: errRemoved}
	}
	c, err := r.Acquire(now)
	if err != nil {
		r.End()
		return false, err.(*upstream.Error)
	}
	x.c = c
	x.head = appendRequestHead(x.head[:0], &x.ctx.Request, r, x.ctx.RemoteAddr(), len(x.body), h.cfg.StripAuthorization)
	sent := x.clock()
	h.m.overhead.Update(sent.Sub(x.start).Seconds())
	// Queued until the first token: the load that the cost policy reads.
	// A replica served by uvicorn (vLLM, SGLang) sends a stream's head
	// before its prefill, so a stream stays queued until its first data
	// (stream.go); any other answer's head comes after it.
	r.Queue(x.work)
	x.queued = true
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
	x.unqueue()
	x.c.Close()
	x.r.End()
	x.c = nil
	return e
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

// respond relays the answer whose head is in the response: with no body,
// read whole, or as a stream (stream.go), which fasthttp reads after the
// handler returns.
func (x *exchange) respond() (bool, *upstream.Error) {
	h, c, r, ctx := x.h, x.c, x.r, x.ctx
	hd := &ctx.Response.Header
	hd.ResetConnectionClose() // the replica's: the client keeps its own
	dropResponseHopByHop(hd)
	hd.SetCanonical(headerReplica, r.NameBytes)
	hd.SetCanonical(headerRoute, reasonBytes[x.reason])
	if ctx.IsHead() || x.status == fasthttp.StatusNoContent || x.status == fasthttp.StatusNotModified {
		ctx.Response.SkipBody = true
		x.finish(upstream.OK)
		return false, nil
	}
	cl := hd.ContentLength()
	if cl < 0 && !ctx.Request.Header.IsHTTP11() {
		// An HTTP/1.0 client cannot read chunks, and fasthttp chunks a
		// body of unknown length: it is read whole, up to BufferLimit.
		if e := c.ReadWhole(&ctx.Response, h.cfg.BufferLimit); e != nil {
			return false, e
		}
		x.finish(upstream.OK)
		return false, nil
	}
	if cl < 0 || cl > h.cfg.BufferLimit || bytes.HasPrefix(hd.ContentType(), strEventStream) {
		x.startStream(cl)
		return true, nil
	}
	if e := c.ReadWhole(&ctx.Response, 0); e != nil {
		return false, e
	}
	if x.responses && x.status >= 200 && x.status < 300 {
		h.recordResponse(stringOf(ctx.Response.Body(), strIDKey), r.Index)
	}
	x.finish(upstream.OK)
	return false, nil
}

// dropBody gives a large body's bytes back to the budget once the request
// was sent (no resend can need it), and takes its buffer out of fasthttp's
// pool, so that the memory of a burst of large requests comes back to the
// heap, and then the system, without waiting for a pool to be flushed
// (bodyBudget.giveBack).
func (h *Handler) dropBody(ctx *fasthttp.RequestCtx, n int64) {
	// Done with, streamed or not: nothing reads a request's body once
	// it was sent (the access log has its own copy of the model).
	ctx.Request.SwapBody(nil)
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
	if x.c != nil {
		x.unqueue()
		if x.stream.active {
			x.stream.active = false
			x.r.EndStream()
		}
		x.c.Close()
		x.c = nil
		x.r.End()
	}
	writeError(x.ctx, fasthttp.StatusInternalServerError, errBodyInternal)
	x.ctx.SetConnectionClose()
}

// finish counts a completed exchange and gives its connection back. The
// one place where a replica's answer is recorded as served (pins, the pin
// store) is here, for a 2xx answer relayed whole.
func (x *exchange) finish(res upstream.Result) {
	if res == upstream.OK {
		// Recorded while the request still counts in flight: a replica
		// that left the set drops its pins when the last one ends.
		x.dataCame() // an answer without data is served when it ends
	}
	x.unqueue()
	now := x.clock()
	streamed := x.stream.active
	if streamed {
		x.stream.active = false
		x.r.EndStream()
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
		if !streamed {
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
		x.ctx.Response.Reset()
		x.ctx.SetStatusCode(499)
		x.ctx.SetConnectionClose()
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
	writeError(x.ctx, v.Status, body)
	x.ctx.Response.Header.SetCanonical(headerReplica, x.r.NameBytes)
	x.ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[x.reason])
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
	writeError(x.ctx, fasthttp.StatusServiceUnavailable, errBodyUnavailable)
	hd := &x.ctx.Response.Header
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
