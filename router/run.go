package router

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

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
		x.unhold()
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
		if x.r = h.set.Replica(idx); x.r == nil || x.queued && x.r != x.queuedOn {
			// It left the set since the pick read the masks (and
			// another may have joined in its slot: picked anew).
			x.unqueue()
			if x.r == nil {
				x.tried.Add(idx)
			}
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
