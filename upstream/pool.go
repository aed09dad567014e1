package upstream

import (
	"slices"
	"time"
)

// Acquire returns an idle connection to r, or dials a new one (dial); now
// is the caller's clock reading. A pooled connection that sat idle longer than
// IdleTimeout is closed rather than used, before the replica's own
// keep-alive timeout can close it under a request; one that the replica
// closed anyway is found by a non-blocking peek, before anything is
// written, and dropped without blame. A dial error is in PhaseDial.
func (r *Replica) Acquire(now time.Time) (*Conn, *Error) {
	cfg := &r.set.cfg
	for {
		r.mu.Lock()
		n := len(r.idle)
		if n == 0 {
			r.mu.Unlock()
			break
		}
		c := r.idle[n-1]
		r.idle[n-1] = nil
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		idle := max(now.Sub(c.lastUse), 0) // released after the caller read its clock
		if idle >= cfg.IdleTimeout {
			// The pool is a stack: every connection under this one has
			// sat idle longer still.
			c.closeSocket()
			r.closeExpired(now)
			break
		}
		if idle < cfg.TrustIdle && !c.streamed || c.alive() {
			c.Reused, c.afterStream, c.streamed = true, c.streamed, false
			return c, nil
		}
		if c.streamed {
			r.closedAfterStream()
		}
		c.closeSocket()
	}
	return r.dial()
}

// Release returns c to its replica's pool, or closes it if it is broken,
// the replica is down, or the pool is full; now is the caller's clock
// reading, from which c's idle time counts. c must not be used afterwards.
func (c *Conn) Release(now time.Time) {
	r := c.r
	if c.broken || c.Buffered() > 0 || r.state.Load() != Live {
		c.closeSocket()
		return
	}
	c.dropReader()
	c.forgetClient()
	if c.streamed {
		switch r.afterStreams.Load() {
		case streamsUnknown:
			r.probeAfterStream(c)
			return
		case streamsClosed:
			c.closeSocket()
			return
		}
	}
	c.lastUse = now
	r.mu.Lock()
	if len(r.idle) < r.set.cfg.MaxIdleConns {
		r.idle = append(r.idle, c)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	c.closeSocket()
}

// DropIdle closes every idle connection to r (one of them turned out
// closed by the replica, and the others are likely to be too; r left or
// was demoted), under the lock: a Release that runs meanwhile appends into
// the same array.
func (r *Replica) DropIdle() {
	r.mu.Lock()
	for i, c := range r.idle {
		c.closeSocket()
		r.idle[i] = nil
	}
	r.idle = r.idle[:0]
	r.mu.Unlock()
}

// closeExpired closes the idle connections older than IdleTimeout, so that
// a quiet proxy does not hold connections that the replica will close.
func (r *Replica) closeExpired(now time.Time) {
	r.mu.Lock()
	n := 0
	for n < len(r.idle) && now.Sub(r.idle[n].lastUse) >= r.set.cfg.IdleTimeout {
		r.idle[n].closeSocket()
		n++
	}
	r.idle = slices.Delete(r.idle, 0, n) // clears what it drops
	r.mu.Unlock()
}
