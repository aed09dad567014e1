package router

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// finish counts a completed exchange and gives its connection back. The
// one place where a replica's answer is recorded as served (pins, the pin
// store) is here, for a 2xx answer relayed whole.
func (x *exchange) finish(res upstream.Result) {
	if x.status < 200 || x.status >= 300 {
		x.unhold() // the replica refused it: it prefilled nothing
	}
	if res == upstream.OK {
		// Recorded while the request still counts in flight: a replica
		// that left the set drops its pins when the last one ends.
		x.dataCame() // an answer without data is served when it ends
	}
	now := x.clock()
	idx, name := x.r.Index, x.r.Name
	streamed := x.letGo(res == upstream.OK, now)
	x.h.m.send(idx, res)
	class, status, n := classOf(x.status), x.status, x.stream.sent
	if res == upstream.ClientGone {
		class, status = classClientGone, 499
	}
	if !streamed {
		n = int64(len(x.ctx.Response.Body()))
	}
	x.countAnswer(res, streamed) // before the request: a test that saw it counted sees both
	x.counted(idx, class, status, n, name, now)
}

// letGo ends x's hold on its replica: off its queue and its streams, its
// connection pooled (ok) or closed. It reports whether x was streaming.
func (x *exchange) letGo(ok bool, now time.Time) bool {
	x.unqueue()
	streamed := x.stream.active
	if streamed {
		x.stream.active = false
		x.r.EndStream()
	}
	if ok {
		x.c.Release(now)
	} else {
		x.c.Close()
	}
	x.c = nil
	x.r.End()
	return streamed
}

// counted counts an answer given by replica (-1: none) and logs it.
func (x *exchange) counted(replica, class, status int, n int64, name string, now time.Time) {
	x.h.m.request(replica, x.reason, class)
	x.h.m.total.Update(now.Sub(x.start).Seconds())
	if x.h.cfg.AccessLog {
		x.logAccess(status, n, name, now)
	}
}

// answerOwn answers x with the proxy's own error: no replica took it.
func (x *exchange) answerOwn(status int, body []byte) {
	writeError(x.ctx, status, body)
	x.ctx.Response.Header.SetCanonical(headerReplica, replicaNone)
	x.ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[NoReplica])
	x.reason = NoReplica
	x.counted(-1, classOf(status), status, int64(len(body)), "none", time.Now())
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
		x.counted(idx, classClientGone, 499, 0, x.r.Name, time.Now())
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
	x.counted(idx, classOf(v.Status), v.Status, int64(len(body)), x.r.Name, time.Now())
}

// unavailable answers 503 at once when no replica is live: a request never
// queues behind replicas that may not come back.
func (h *Handler) unavailable(x *exchange) {
	if x.prevResponse != nil {
		h.responseGone(x, x.prevResponse)
		return
	}
	x.answerOwn(fasthttp.StatusServiceUnavailable, errBodyUnavailable)
	secs := min(h.set.RetryAfter(x.start), len(retryAfterSeconds)-1)
	x.ctx.Response.Header.SetCanonical(strRetryAfter, retryAfterSeconds[secs])
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
		x.letGo(false, time.Time{})
	} else {
		x.unqueue() // picked, not yet sent
	}
	writeError(x.ctx, fasthttp.StatusInternalServerError, errBodyInternal)
	x.ctx.SetConnectionClose()
}
