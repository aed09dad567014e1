package router

import (
	"math"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// The cost policy estimates, for each available replica, how long the
// request would wait for its first token there, in bytes of prefill (bytes
// stand for tokens; no tokenizer): the prefill already queued on it (the
// requests the proxy sent that have had no byte yet), plus the part of this
// prompt that it does not hold (weighed more while every replica has a
// queue: busyPrefillWeight), plus a little for each request it is
// decoding, whose steps slow every prefill. What a replica holds is the
// longest prefix of the prompt's blocks that it is believed to hold
// (prefixcache.Holdings: what it was sent, bounded by a few times its KV
// capacity, heldLifetimes, and corrected by what it reports), or the
// longest prefix that the pin map places there, which another instance
// may have written, whichever is longer. The cheapest wins; equal costs
// go in turn, so idle replicas share fresh work as the counter would.
//
// A conversation stays on its pinned replica unless another is cheaper by
// more than moveMargin: its cached prefix already counts in the pinned
// replica's favour, so it moves only when the queue there is longer than
// the prefill that a move costs. Then the pin moves with it (Served), and
// the next turn stays on the new replica: no flapping.
//
// A session (Request.Session) is such a conversation whatever its
// prefixes: its replica, the one that served its last request, counts as
// holding the whole prompt. An agent that compacts its history sends a
// shorter or rewritten prompt that no replica holds, and its next turns
// extend that prompt wherever it goes: the session stays, and so do its
// later turns' caches, unless its replica is down or busier by more than
// the whole prefill and moveMargin. The prediction (Decision.Cached) stays
// what the replica is believed to hold.
const (
	// bytesPerToken turns the policy's bytes into the tokens that replicas
	// report, for the estimate's error (metrics): about four bytes of
	// English or code a token for the usual tokenizers.
	bytesPerToken = 4
	// decodeWeight is the prefill bytes that one request in flight counts
	// for: a decoding sequence adds a few tokens' worth to every engine
	// step (vLLM's default scheduler batches decodes with prefill chunks).
	decodeWeight = 64
	// busyPrefillWeight is what a byte of prefill counts for, against a
	// byte already queued, while every replica has a queue: the prefill
	// a request adds to a busy replica delays each request that comes
	// after it there, so a prompt that a replica holds is worth more
	// than the wait it saves this request alone. With an idle replica
	// the weight is 1, so that a burst spreads. docs/routing.md gives
	// the trace replay runs it was chosen by.
	busyPrefillWeight = 8
	// moveMargin is how much cheaper (about 1k tokens of prefill, tens of
	// milliseconds) another replica must be before a conversation leaves
	// its pin: less than that is noise in the estimate.
	moveMargin = 4096
)

// Matches is what the pin map knows of one request: the longest pinned
// prefix (first, its replica and bytes) and the replica holding its first
// message (a shared system prompt), with no allocation. The benchmarks'
// re-implementations of the peers' policies read the pins through it.
type Matches struct {
	n int
	r [2]int
	b [2]int64
}

// Scan looks the chain up from its last link back (at most MaxLookback
// links, stopping at the first pin) and then its first link.
func (m *Matches) Scan(chain []prefixcache.Link, pins *prefixcache.PinMap) {
	n := len(chain)
	if n == 0 {
		return
	}
	if r, i, ok := lookup(chain, n-1, pins); ok {
		m.add(r, int64(chain[i].Bytes()))
		if i == 0 {
			return
		}
	}
	if r, ok := pins.Get(chain[0]); ok {
		m.add(r, int64(chain[0].Bytes()))
	}
}

func (m *Matches) add(r int, b int64) {
	for i := 0; i < m.n; i++ {
		if m.r[i] == r {
			return
		}
	}
	m.r[m.n], m.b[m.n] = r, b
	m.n++
}

// On returns the bytes of the longest prefix pinned to replica r.
func (m *Matches) On(r int) int64 {
	for i := 0; i < m.n; i++ {
		if m.r[i] == r {
			return m.b[i]
		}
	}
	return 0
}

// costPolicy is the cost policy (above).
type costPolicy struct{}

func (costPolicy) String() string { return "cost" }

func (costPolicy) Needs() Needs {
	return Needs{Pins: true, FirstMessage: true, Load: true, Held: true, Sessions: true}
}

func (costPolicy) Choose(req Request) Decision {
	var m Matches
	m.Scan(req.Chain, req.Pins)
	if m.n == 0 && req.Rendezvous && !opens(&req) {
		// A later turn that no pin places was placed at its rendezvous
		// top (place): the top holds its earlier turns.
		if _, top := rendezvous(req.Chain[0].Hash, req.Avail, req.Load); top >= 0 {
			m.add(top, int64(req.Chain[len(req.Chain)-2].Bytes()))
		}
	}
	var held [upstream.MaxReplicas]int64
	req.Avail.Each(func(r int) {
		held[r] = m.On(r)
		if req.Held != nil {
			b, _ := req.Held.Longest(r, req.Blocks)
			held[r] = max(held[r], b)
		}
	})
	// While some replica has nothing queued, prefill sent anywhere costs
	// only this request's wait; once every replica has a queue, each
	// byte of prefill also delays the requests behind it there.
	w := int64(busyPrefillWeight)
	req.Avail.Each(func(r int) {
		if l := &req.Load[r]; l.Queued+l.Foreign == 0 {
			w = 1
		}
	})
	sess := sessionReplica(&req) // -1 for none
	cost := func(r int) int64 {
		l, h := &req.Load[r], held[r]
		if r == sess {
			h = req.Size
		}
		return l.Queued + l.Foreign + w*max(req.Size-h, 0) + l.InFlight*decodeWeight
	}
	// The cheapest wins. Equal costs go in turn, or, for rendezvous
	// placement, to the replica that every instance would pick. In turn
	// is the counter's turn among the cheapest, so that requests picked
	// at once from one view of the queues (a burst whose connections are
	// still being dialled) are spread as the counter spreads them, not
	// sent together to the first of the cheapest.
	lo, tied := int64(math.MaxInt64), upstream.Mask{}
	req.Avail.Each(func(r int) {
		switch c := cost(r); {
		case c < lo:
			lo, tied = c, upstream.Mask{}
			tied.Add(r)
		case c == lo:
			tied.Add(r)
		}
	})
	best := tied.Nth(req.Counter.Add(1) - 1)
	if req.Rendezvous && len(req.Chain) > 0 {
		var bestW uint64
		best = -1
		tied.Each(func(r int) {
			if w := weight(req.Chain[0].Hash, req.Load[r].ID); best < 0 || w > bestW {
				best, bestW = r, w
			}
		})
	}
	bestCost := lo
	// The replica that the request stays on unless a move pays: its
	// session's, else the one of its longest pinned prefix.
	pinned, kept := -1, Pinned
	if sess >= 0 {
		pinned, kept = sess, Session
	} else if m.n > 0 {
		pinned = m.r[0]
	}
	if pinned >= 0 {
		if !req.Avail.Has(pinned) {
			return decision(best, Repinned, held[best])
		}
		if pinned != best {
			if cost(pinned) <= bestCost+moveMargin {
				return decision(pinned, kept, held[pinned])
			}
			return decision(best, Balanced, held[best])
		}
		if kept == Session {
			return decision(best, Session, held[best])
		}
	}
	if cached := held[best]; cached > 0 {
		return decision(best, Pinned, cached)
	}
	return decision(best, Spread, 0)
}
