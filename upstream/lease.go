package upstream

import (
	"errors"
	"time"
)

// Lease is one request's hold on a replica, from its pick to its end: the
// request counted in flight, its prefill queued until the answer's first
// byte, a connection once it is sent, and a stream while its answer
// streams. End undoes whatever of it was taken, however the request ended,
// so a caller never balances the replica's counts by hand.
//
// A lease is taken in two steps because they run under different locks: a
// policy that reads the replicas' queues picks under one lock, and the
// request must be counted queued before the next pick reads them (Take),
// while a dial must not hold that lock (Connect).
type Lease struct {
	r         *Replica
	c         *Conn
	work      int64
	queued    bool
	streaming bool
}

// errRemoved is a pick of a replica that left the set as it was picked.
var errRemoved = errors.New("the replica left the set")

// Take counts a request on r: in flight, and work bytes of prefill queued
// in front of later requests until its first byte. A replica that left
// the set is let go (its pins dropped) only once nothing is in flight on
// it, so this count comes before Connect looks at its state.
func (l *Lease) Take(r *Replica, work int64) {
	r.inflight.Add(1)
	r.requests.Add(1)
	r.waiting.Add(1)
	r.queued.Add(work)
	*l = Lease{r: r, work: work, queued: true}
}

// Replica returns the leased replica, nil when none is.
func (l *Lease) Replica() *Replica { return l.r }

// Conn returns the lease's connection, nil before Connect.
func (l *Lease) Conn() *Conn { return l.c }

// Connect gives the lease a connection to its replica, pooled or dialled
// (Acquire); now is the caller's clock reading. A replica that left the
// set since the pick is an error in PhaseDial, as one that cannot be
// reached.
func (l *Lease) Connect(now time.Time) (*Conn, *Error) {
	if l.r.state.Load() == Removed {
		return nil, &Error{Phase: PhaseDial, Err: errRemoved}
	}
	c, err := l.r.Acquire(now)
	l.c = c
	return c, err
}

// FirstByte records the answer's first data: the prefill is done, and the
// request leaves the replica's queue. Only the first call counts.
func (l *Lease) FirstByte() {
	if l.queued {
		l.queued = false
		l.r.waiting.Add(-1)
		l.r.queued.Add(-l.work)
	}
}

// Stream records that the answer is streamed: bytes are expected from the
// replica all along, so its silence means something (the stall watch).
func (l *Lease) Stream() {
	l.streaming = true
	l.r.streams.Add(1)
}

// End ends the lease: the request off the queue and the streams, its
// connection back to the pool when ok (the answer was read to its end) or
// else closed (a replica sees a request whose client left end that way),
// and out of flight. It reports whether the answer was streaming. Ending
// a lease that holds nothing does nothing.
func (l *Lease) End(ok bool, now time.Time) (streamed bool) {
	r := l.r
	if r == nil {
		return false
	}
	l.FirstByte()
	if l.streaming {
		r.streams.Add(-1)
	}
	if l.c != nil {
		if ok {
			l.c.Release(now)
		} else {
			l.c.Close()
		}
	}
	streamed = l.streaming
	*l = Lease{}
	if r.inflight.Add(-1) == 0 && r.state.Load() == Removed {
		r.set.release(r)
	}
	return streamed
}
