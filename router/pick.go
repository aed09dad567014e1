package router

import (
	"sync"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// foreign returns the prefill bytes that r's last fresh report puts in
// front of a new request beyond the proxy's own: each request that another
// caller queued there as one of the proxy's mean size, each one it runs as
// a sequence decoding; 0 without a fresh report.
func (h *Handler) foreign(r *upstream.Replica, now time.Time) int64 {
	rep, fresh := r.Reported(now)
	if !fresh {
		return 0
	}
	running, waiting := rep.Foreign()
	return waiting*h.meanWork.Load() + running*decodeWeight
}

// pick chooses the next replica among those not yet tried (live, and not
// skipped for a Retry-After unless every live one is) and leases it.
func (x *exchange) pick() Decision {
	h := x.h
	avail, live := h.set.Avail(x.start)
	if avail = avail.And(x.serves).AndNot(x.tried); avail.Empty() {
		avail = live.And(x.serves).AndNot(x.tried)
	}
	x.req.Avail = avail
	if h.cfg.PinStore != nil && x.sends == 0 {
		h.sharedPin(&x.req)
	}
	policy := h.policy()
	if policy.Needs().Held {
		x.req.Held = h.held
	}
	if !policy.Needs().Load && !h.cfg.Rendezvous {
		d := Choose(policy, x.req, h.pins, &h.counter)
		x.take(d)
		return d
	}
	// Picks that read the load are one at a time, each with the
	// requests picked before it counted on their replicas' queues: a
	// burst picked at once from one view of the queues would pile onto
	// the replica that looked cheapest to all of it.
	h.pickMu.Lock()
	defer h.pickMu.Unlock()
	// The table is held for the pick alone, not while the request waits
	// for its answer: at most a few are in use at once, however many
	// requests are.
	loads := loadsPool.Get().(*Loads)
	avail.Each(func(i int) {
		loads[i] = Load{}
		if r := h.set.Replica(i); r != nil {
			waiting, queued := r.Waiting()
			loads[i] = Load{Waiting: waiting, Queued: queued, InFlight: r.InFlight(), ID: r.ID}
			if h.scrapes {
				loads[i].Foreign = h.foreign(r, x.start)
			}
		}
	})
	x.req.Load = loads
	d := Choose(policy, x.req, h.pins, &h.counter)
	x.req.Load = nil
	loadsPool.Put(loads)
	x.take(d)
	return d
}

// take leases the replica that d picked, with the prefill that the
// request is expected to cost there.
func (x *exchange) take(d Decision) {
	if d.Replica < 0 {
		return
	}
	if r := x.h.set.Replica(d.Replica); r != nil {
		x.work = max(x.req.Size-d.Cached, 0)
		x.lease.Take(r, x.work)
	}
}

// loadsPool holds the load tables of the policies that read load
// (req.Load), taken for a pick alone (pick): only the available replicas'
// rows are written.
var loadsPool = sync.Pool{New: func() any { return new(Loads) }}
