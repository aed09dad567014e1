package router

import (
	"errors"
	"sync"
	"time"

	"github.com/warmroute/warmroute/rawsock"
	"github.com/warmroute/warmroute/upstream"
)

// A relay's waits for its replica's next byte, the first of a relayed wait
// (awaitAnswer) and a stream's between two events (writeStream), are parked
// on one poller for the whole process: the relay's worker goes back to its
// pool as the wait begins, and the poller's wake hands the exchange to a
// worker again, which resumes the relay where it left (relayOnce). In a
// burst of thousands of streams, a relay's goroutine parked in its wait held
// a 4 KiB stack each: 4.2-4.6 of the 17.5-18.0 KiB a stream cost
// (scripts/streams.sh). Where no poller can start (not Linux), or a socket
// cannot be parked, the wait blocks its goroutine as before. So do the
// waits inside a read, short and rare: the rest of a head or of a chunk's
// size line split across packets, and the final answer after a 1xx.

// parkTick is how often the poller asks a parked wait whether its replica
// was found hung or its client left (exchange.Due): upstream's poll interval.
const parkTick = 250 * time.Millisecond

var (
	pollerOnce sync.Once
	poller     *rawsock.Poller
	pollerErr  error
	// parkWaits, when false, makes the relays' waits of the handlers made
	// from then on block, as where there is no poller: tests compare the
	// two.
	parkWaits = true
)

// relayPoller returns the process's poller, started at its first use, or
// nil where none can start.
func relayPoller() *rawsock.Poller {
	pollerOnce.Do(func() { poller, pollerErr = rawsock.NewPoller(parkTick) })
	return poller
}

// warnNoPoller logs why relays' waits block their goroutine, where a poller
// should have started (Linux) and did not.
func (h *Handler) warnNoPoller() {
	if (h.cfg.RelayAbove >= 0 || h.cfg.RelayWaitingAbove >= 0) && relayPoller() == nil && !errors.Is(pollerErr, errors.ErrUnsupported) {
		h.log.Warn("relays' waits block a goroutine each: no poller", "err", pollerErr)
	}
}

// errParked is what a relay's wait returns when it parked x: x is the
// poller's until its wake, and nothing may touch it on the way out.
var errParked = errors.New("router: the wait is parked")

// awaitParked awaits, for a relay, the next byte of x's answer in phase,
// counted from start: it returns nil when one is buffered, the wait's
// error, or errParked.
func (x *exchange) awaitParked(phase upstream.Phase, start time.Time) error {
	p := relayPoller()
	if p == nil || x.h.blockWaits || !x.c.Parkable() {
		return x.awaitBlocking(phase, start)
	}
	due := x.park.due
	x.park.due = false
	for {
		if ready, err := x.c.Poll(x.client, phase, start, due); ready {
			return err
		}
		parked, err := x.c.Park(p, x, phase, start)
		switch {
		case err != nil:
			return x.awaitBlocking(phase, start)
		case parked:
			return errParked
		}
		// Bytes came between the poll and the park.
	}
}

// awaitBlocking is awaitParked's wait on its own goroutine.
func (x *exchange) awaitBlocking(phase upstream.Phase, start time.Time) error {
	if phase == upstream.PhaseAwait {
		return x.c.AwaitFirstParked(x.client, start)
	}
	return x.c.AwaitMore(x.client, phase)
}

// Due is x's rawsock.Waiter method: a parked wait ends when its replica
// was found hung or its client left, as a blocking one does at its polls.
func (x *exchange) Due() bool { return x.c.Hung() || upstream.PeerClosed(x.client) }

// Wake is x's rawsock.Waiter method: the relay resumes on a worker.
func (x *exchange) Wake(due bool) {
	x.park.due = due
	relayWorkers.do(x)
}
