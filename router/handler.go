package router

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// Config is the handler's part of the command line.
type Config struct {
	Policy Policy
	// MaxSends is how many replicas one request may be sent to when the
	// earlier ones could not be reached (default 2, as in the seed).
	MaxSends int
	// BufferLimit is the largest non-streamed response body read whole
	// before it is written; larger ones are streamed (default 1 MiB).
	BufferLimit int
	Logger      *slog.Logger
}

// Handler is the proxy's fasthttp handler.
type Handler struct {
	cfg     Config
	set     *upstream.Set
	pins    *prefixcache.PinMap
	m       *Metrics
	counter atomic.Uint64
	log     *slog.Logger
}

// New returns a handler that routes over set with pins.
func New(cfg Config, set *upstream.Set, pins *prefixcache.PinMap, m *Metrics) *Handler {
	if cfg.MaxSends < 1 {
		cfg.MaxSends = 2
	}
	if cfg.BufferLimit <= 0 {
		cfg.BufferLimit = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler{cfg: cfg, set: set, pins: pins, m: m, log: cfg.Logger}
}

// exchange is the per-request scratch space, pooled.
type exchange struct {
	chain []prefixcache.Link
	head  []byte
}

var exchangePool = sync.Pool{New: func() any {
	return &exchange{chain: make([]prefixcache.Link, 0, 64), head: make([]byte, 0, 1024)}
}}

var (
	strHealth         = []byte("/health")
	strChatPath       = []byte("/chat/completions")
	headerReplica     = []byte("X-Warmroute-Replica")
	headerRoute       = []byte("X-Warmroute-Route")
	strEventStream    = []byte("text/event-stream")
	reasonBytes       [len(ReasonNames)][]byte
	bodyHealthOK      = []byte(`{"status":"ok"}`)
	bodyHealthNoLive  = []byte(`{"status":"no live replica"}`)
	replicaNone       = []byte("none")
	strRetryAfter     = []byte("Retry-After")
	retryAfterSeconds [31][]byte
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
	start := time.Now()
	if ctx.IsGet() && bytes.Equal(ctx.Path(), strHealth) {
		h.health(ctx)
		return
	}
	defer h.survive(ctx)
	x := exchangePool.Get().(*exchange)
	defer exchangePool.Put(x)

	body := ctx.PostBody()
	req := Request{}
	if len(body) > 0 && ctx.IsPost() && bytes.HasSuffix(ctx.Path(), strChatPath) {
		chain, err := prefixcache.AppendChain(x.chain[:0], body)
		x.chain = chain
		if err != nil && err != prefixcache.ErrNotChat {
			// Malformed JSON is the replica's to reject; it is spread.
			h.m.malformed.Inc()
		}
		req.Chain = chain
	}

	var tried uint64
	var failed *upstream.Replica
	var failErr error
	staleRetry := true // one resend on a fresh connection after a stale one
	for send := 0; ; send++ {
		req.Avail = h.set.LiveMask() &^ tried
		idx, reason := Pick(h.cfg.Policy, req, h.pins, &h.counter)
		if failed != nil {
			h.logFailover(failed, failErr, idx, start)
			if idx >= 0 {
				reason = Failover
				h.m.failovers.Inc()
			}
		}
		if idx < 0 {
			h.unavailable(ctx, start)
			return
		}
		r := h.set.Replicas[idx]
		tried |= 1 << uint(idx)

		c, err := r.Acquire(start)
		phase := upstream.PhaseDial
		reused := false
		if err == nil {
			reused = c.Reused
			x.head = appendRequestHead(x.head[:0], &ctx.Request, r, ctx.RemoteAddr(), len(body))
			sent := time.Now()
			h.m.overhead.Update(sent.Sub(start).Seconds())
			r.Begin()
			phase = upstream.PhaseWrite
			if err = c.Write(x.head, body); err == nil {
				phase = upstream.PhaseAwait
				if err = c.AwaitResponse(ctx.Conn(), sent); err == nil {
					h.m.ttfb.Update(since(start))
					h.respond(ctx, c, r, reason, req.Chain, start)
					return
				}
			}
			c.Close()
			r.End()
		}
		fault := upstream.Classify(phase, reused, err)
		h.m.send(idx, fault)
		if staleRetry && upstream.Stale(fault, phase, reused, err) {
			// The replica had closed this keep-alive connection: not a
			// send, not a failover. Its other idle ones go too, and the
			// request is picked again onto a fresh connection.
			staleRetry = false
			r.DropIdle()
			tried &^= 1 << uint(idx)
			send--
			continue
		}
		if upstream.Demotes(fault, phase, reused, err) {
			r.Demote(err, time.Now())
		}
		if fault == upstream.NotSent && send+1 < h.cfg.MaxSends {
			failed, failErr = r, err
			continue
		}
		if fault == upstream.NotSent {
			// Out of sends: the request reached no replica.
			h.logFailover(r, err, -1, start)
			h.unavailable(ctx, start)
			return
		}
		h.fail(ctx, idx, reason, fault, start)
		return
	}
}

// survive keeps a bug in one request from taking every other request and
// stream down with the process, as net/http does for its handlers: it logs
// the panic with its stack, answers 500 if it still can, and closes the
// client's connection.
func (h *Handler) survive(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		h.log.Error("panic serving a request; the connection is closed", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		writeError(ctx, fasthttp.StatusInternalServerError, errBodyInternal)
		ctx.SetConnectionClose()
	}
}

// respond relays the replica's answer: the head now, the body whole or as a
// stream. c holds at least one response byte.
func (h *Handler) respond(ctx *fasthttp.RequestCtx, c *upstream.Conn, r *upstream.Replica, reason Reason, chain []prefixcache.Link, start time.Time) {
	resp := &ctx.Response
	if !c.HeadBuffered() {
		// The head came in pieces: allow it the response timeout, not
		// what is left of Await's poll interval.
		c.SetReadDeadline(time.Now().Add(h.set.Config().ResponseTimeout))
	}
	if err := resp.Header.Read(c.Reader); err != nil {
		h.abort(ctx, c, r, reason, upstream.PhaseResponse, err, start)
		return
	}
	if resp.Header.ConnectionClose() {
		// The replica closes its connection; the client keeps its own.
		c.MarkBroken()
		resp.Header.ResetConnectionClose()
	}
	if hasResponseHopByHop(&resp.Header) {
		for _, k := range responseHopByHop {
			resp.Header.Del(k)
		}
	}
	resp.Header.SetCanonical(headerReplica, r.NameBytes)
	resp.Header.SetCanonical(headerRoute, reasonBytes[reason])
	status := resp.StatusCode()
	if status >= 200 && status < 300 && len(chain) > 0 && h.cfg.Policy != RoundRobin {
		// The next turn looks this prefix up.
		h.pins.Put(chain[len(chain)-1], r.Index)
	}
	if ctx.IsHead() || status < 200 || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified {
		resp.SkipBody = true
		h.finish(c, r, reason, status, upstream.OK, start)
		return
	}
	cl := resp.Header.ContentLength()
	if cl < 0 || cl > h.cfg.BufferLimit || bytes.HasPrefix(resp.Header.ContentType(), strEventStream) {
		s := acquireStream(h, c, r, ctx, reason, status, start)
		resp.ImmediateHeaderFlush = true
		if cl >= 0 {
			resp.SetBodyStream(s, cl)
		} else {
			resp.SetBodyStream(s, -1)
		}
		return
	}
	if c.Reader.Buffered() < cl {
		// The rest of the body is still on its way: allow it the response
		// timeout, not what is left of Await's poll interval.
		c.SetReadDeadline(time.Now().Add(h.set.Config().ResponseTimeout))
	}
	if err := resp.ReadBody(c.Reader, 0); err != nil {
		h.abort(ctx, c, r, reason, upstream.PhaseResponse, err, start)
		return
	}
	h.finish(c, r, reason, status, upstream.OK, start)
}

// abort answers for a replica that failed after it had the request.
func (h *Handler) abort(ctx *fasthttp.RequestCtx, c *upstream.Conn, r *upstream.Replica, reason Reason, phase upstream.Phase, err error, start time.Time) {
	c.Close()
	r.End()
	fault := upstream.Classify(phase, true, err)
	h.m.send(r.Index, fault)
	h.log.Warn("replica failed after it had the request; not retried", "replica", r.Name, "cause", err.Error(), "phase", phase.String())
	h.fail(ctx, r.Index, reason, fault, start)
}

// finish counts a completed exchange and gives the connection back.
func (h *Handler) finish(c *upstream.Conn, r *upstream.Replica, reason Reason, status int, fault upstream.Fault, start time.Time) {
	if fault == upstream.OK {
		c.Release()
	} else {
		c.Close()
	}
	r.End()
	h.m.send(r.Index, fault)
	class := classOf(status)
	if fault == upstream.ClientGone {
		class = classClientGone
	}
	h.m.request(r.Index, reason, class)
	h.m.total.Update(since(start))
}

// fail answers a request that got no response from a replica.
func (h *Handler) fail(ctx *fasthttp.RequestCtx, idx int, reason Reason, fault upstream.Fault, start time.Time) {
	status := fasthttp.StatusBadGateway
	switch fault {
	case upstream.TimedOut:
		status = fasthttp.StatusGatewayTimeout
		writeError(ctx, status, errBodyTimeout)
	case upstream.ClientGone:
		// Nobody is there to read an answer.
		ctx.Response.Reset()
		ctx.SetStatusCode(499)
		ctx.SetConnectionClose()
		h.m.request(idx, reason, classClientGone)
		h.m.total.Update(since(start))
		return
	default:
		writeError(ctx, status, errBodyBadGateway)
	}
	ctx.Response.Header.SetCanonical(headerReplica, h.set.Replicas[idx].NameBytes)
	ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[reason])
	h.m.request(idx, reason, classOf(status))
	h.m.total.Update(since(start))
}

// unavailable answers 503 at once when no replica is live: a request never
// queues behind replicas that may not come back.
func (h *Handler) unavailable(ctx *fasthttp.RequestCtx, start time.Time) {
	writeError(ctx, fasthttp.StatusServiceUnavailable, errBodyUnavailable)
	secs := min(h.set.RetryAfter(start), len(retryAfterSeconds)-1)
	ctx.Response.Header.SetCanonical(strRetryAfter, retryAfterSeconds[secs])
	ctx.Response.Header.SetCanonical(headerReplica, replicaNone)
	ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[NoReplica])
	h.m.request(-1, NoReplica, classOf(fasthttp.StatusServiceUnavailable))
	h.m.total.Update(since(start))
}

// health answers the main listener's GET /health without touching a replica.
func (h *Handler) health(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentTypeBytes(strApplicationJSON)
	if h.set.LiveMask() == 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBody(bodyHealthNoLive)
		return
	}
	ctx.SetBody(bodyHealthOK)
}

// logFailover writes the one WARN line of a failover, throttled per replica.
func (h *Handler) logFailover(from *upstream.Replica, cause error, to int, now time.Time) {
	ok, held := from.FailoverLog.Allow(now)
	if !ok {
		return
	}
	dest := "none"
	if to >= 0 {
		dest = h.set.Replicas[to].Name
	}
	phase := upstream.PhaseDial
	var se *upstream.SendError
	if errors.As(cause, &se) {
		phase = se.Phase
	}
	h.log.Warn("failover", "replica", from.Name, "cause", cause.Error(), "phase", phase.String(), "to", dest, "suppressed", held)
}

// Pins returns the handler's pin map.
func (h *Handler) Pins() *prefixcache.PinMap { return h.pins }
