package upstream

import (
	"net"
	"time"

	"github.com/warmroute/warmroute/rawsock"
)

// A wait for a byte of the answer can be parked on a rawsock.Poller rather
// than block its goroutine: Poll looks, without waiting, and Park hands the
// socket to the poller, whose wake calls Poll again. A burst of thousands
// of requests that wait for their first byte, or of streams between their
// events, then holds no goroutine and no read buffer per wait.

// Parkable reports whether c's waits can be parked: c is a socket.
func (c *Conn) Parkable() bool { return c.rc != nil }

// Poll is await without its wait. It returns true and nil when a byte is
// buffered, true and await's error when the wait failed, and false when
// nothing came yet: c then holds no read buffer, and the caller parks the
// wait (Park), or calls Poll again later. The wait is AwaitFirst's for
// PhaseAwait, AwaitFinal's for PhaseHead, and AwaitMore's for the others,
// counted from start. judge makes Poll look at what await looks at at each
// of its polls, when nothing came: the wait's end, the replica hung, the
// client gone; the caller passes it when its poller woke the wait for them
// (Waiter.Wake's due), not for a byte. Where the last read emptied the
// socket, Poll reads nothing and returns false: Park learns of whatever
// came since.
func (c *Conn) Poll(client net.Conn, phase Phase, start time.Time, judge bool) (bool, error) {
	if c.Buffered() > 0 {
		return true, nil
	}
	if c.rc == nil {
		return true, c.await(client, phase, start, c.timeout(phase), true)
	}
	if c.Reader != nil {
		readers.Put(c.Reader)
		c.Reader = nil
	}
	if c.src.drained && !judge {
		// The last read emptied the socket. What came since woke the
		// poller, or, on a socket that it does not have yet, is found by
		// the registration, which reports what the socket holds; the
		// Park that follows returns false for it, and the next Poll
		// reads. A stream saves, at each event, the read(2) that would
		// find nothing.
		c.src.drained, c.unread = false, true
		return false, nil
	}
	c.unread = false
	c.waitErr, c.polled = nil, false
	if err := c.rc.Control(c.pollFn); err != nil {
		c.takeReader()
		return true, c.readError(phase, err)
	}
	if c.Reader != nil || c.polled {
		// A read that follows, through the connection (the rest of a
		// head, or endRead's of the end of stream), is bounded as after
		// await's poll, not by a deadline that an earlier wait left
		// behind, passed by now on a connection that sat in the pool.
		c.src.due = pollInterval
	}
	switch {
	case c.Reader == nil && c.polled:
		if err := c.endRead(); err != nil {
			return true, c.readError(phase, err)
		}
		fallthrough
	case c.Reader != nil:
		c.r.progress.Add(1)
		return true, nil
	case !judge:
		return false, nil
	}
	if err := c.ended(client, phase, c.timeout(phase)-time.Since(start)); err != nil {
		c.takeReader()
		return true, err
	}
	return false, nil
}

// poll is Poll's RawConn function.
func (c *Conn) poll(fd uintptr) { c.polled = c.readable(fd) }

// Park parks on p the wait that Poll found with nothing, for w, until
// c's socket has bytes, its end or an error, or until the wait's end (from
// start, as Poll counts it). It reports false when something came
// meanwhile: the caller polls again. Once it returned true, the caller must
// not touch c or w: the wake may have come already. An error leaves the
// wait to the caller: Poll, or the Await methods, which block.
func (c *Conn) Park(p *rawsock.Poller, w rawsock.Waiter, phase Phase, start time.Time) (bool, error) {
	if c.pollSlot != 0 {
		p = c.poller // the one that has the socket
	} else {
		h, err := p.Register(c.fd)
		if err != nil {
			c.takeReader()
			return false, err
		}
		c.poller, c.pollSlot = p, h+1
	}
	parked, err := p.Park(c.pollSlot-1, w, start.Add(c.timeout(phase)), c.unread)
	if !parked {
		c.takeReader()
	}
	return parked, err
}

// closeSocket closes c's socket, which leaves its poller first.
func (c *Conn) closeSocket() {
	if c.pollSlot != 0 {
		c.poller.Forget(c.pollSlot - 1)
		c.pollSlot = 0
	}
	c.nc.Close()
}

// leavePoller takes c's socket out of its poller as c goes back to the
// pool: an idle connection's bytes, or those of its next request's answer
// read without a park (fasthttp's streams), would wake the poller for
// nothing.
func (c *Conn) leavePoller() {
	if c.pollSlot != 0 {
		c.poller.Unregister(c.pollSlot-1, c.fd)
		c.pollSlot = 0
	}
}

// Buffered is c.Reader.Buffered(), and 0 while a parked wait holds no
// buffer (Poll).
func (c *Conn) Buffered() int {
	if c.Reader == nil {
		return 0
	}
	return c.Reader.Buffered()
}

// Hung reports whether c's replica was demoted as hung: its waits end.
func (c *Conn) Hung() bool { return c.r.hung.Load() }

// timeout is the length of a wait in phase.
func (c *Conn) timeout(phase Phase) time.Duration {
	if phase == PhaseAwait || phase == PhaseHead {
		return c.r.set.cfg.FirstByteTimeout
	}
	return c.r.set.cfg.StreamIdleTimeout
}
