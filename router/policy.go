// Package router decides which replica serves a request and applies the
// decision: the policy is a pure function, the handler is the HTTP plumbing.
package router

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// Policy is a routing policy.
type Policy uint8

const (
	// Adaptive pins continuations to the replica that served their prefix
	// and spreads everything else. It is the default: in the seed it got
	// 1095 ms warm-turn TTFT (2676 ms round-robin) and 19.97 s for a cold
	// burst of 16 (18.6 s spread, 30.1 s pinned to one replica).
	Adaptive Policy = iota
	// Affinity pins every request, and a miss picks by the first message,
	// so that a same-prefix burst lands on one replica: kept to measure
	// the cost of pinning everything.
	Affinity
	// RoundRobin spreads every request by counter.
	RoundRobin
	// Cost sends a request to the replica where its first token is
	// estimated to come soonest: the prefill already queued there plus the
	// part of this prompt that the replica does not hold (cost.go).
	Cost
	// SGLang, LLMD, LeastLoad and PowerOfTwo are the peers' published
	// policies, re-implemented as baselines for the benchmarks
	// (baselines.go): they are measured beside ours in the same run.
	SGLang
	LLMD
	LeastLoad
	PowerOfTwo
)

// PolicyNames are the -routing values, in Policy order.
var PolicyNames = [...]string{"adaptive", "affinity", "roundrobin", "cost", "sglang", "llmd", "least", "p2c"}

// usesLoad reports whether p reads the replicas' load (Request.Load).
func (p Policy) usesLoad() bool { return p >= Cost }

func (p Policy) String() string { return PolicyNames[p] }

// ParsePolicy returns the policy named s, or an error listing the valid names.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range PolicyNames {
		if s == n {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown routing policy %q; valid: %s", s, strings.Join(PolicyNames[:], ", "))
}

// Reason says why a replica was picked; it is a metric label and a log field.
type Reason uint8

const (
	// Spread: picked by the counter (a fresh request, or a pin miss).
	Spread Reason = iota
	// Pinned: the replica that served the longest known prefix.
	Pinned
	// Repinned: the pinned replica is down; spread, and pinned anew on success.
	Repinned
	// Hashed: an affinity miss, picked by the hash of the first message.
	Hashed
	// Failover: the first pick could not be reached; this is the next one.
	Failover
	// NoReplica: every replica is down or already tried.
	NoReplica
	// Session: the replica that the request's session is pinned to.
	Session
	// Balanced: the cost policy moved a conversation off its pinned
	// replica, which was busier than the prefill a move costs.
	Balanced
)

// ReasonNames are the label values of the reasons, in order.
var ReasonNames = [...]string{"spread", "pinned", "repinned", "hashed", "failover", "none", "session", "balanced"}

func (r Reason) String() string { return ReasonNames[r] }

// MaxLookback bounds how many prefixes a continuation looks up, from
// h[n-2] back. One agent turn appends an assistant message and its tool
// results; 32 covers a turn with 30 parallel tool calls, while a request
// whose history was rewritten (compaction) costs at most 32 shard locks
// before it is spread.
const MaxLookback = 32

// Request is what the policy knows of one request.
type Request struct {
	// Chain has one link per message; empty for anything that is not a
	// chat request.
	Chain []prefixcache.Link
	// Avail holds each replica that may be picked: live, and
	// not yet tried for this request.
	Avail upstream.Mask
	// Prompt marks a chain of a completions prompt, one link per chunk:
	// its whole length may be cached already (the same prompt again), so
	// it is looked up from its last link, not from the one before.
	Prompt bool
	// Session is the key of the request's session header (SessionKey), 0
	// for none: a session stays on one replica whatever its prefixes.
	Session uint64
	// Size estimates the prompt's prefill work in bytes (ChainSize).
	Size int64
	// Load is each available replica's load, indexed by slot; nil when
	// the policy reads none (usesLoad) and placement is by counter.
	Load *Loads
	// Rendezvous places a request that no pin places by rendezvous hashing
	// (placement.go) instead of the counter, so that instances agree.
	Rendezvous bool
}

// Load is what the proxy knows of one replica's queue without asking it:
// the requests sent that have had no response byte, the prefill bytes they
// hold, and every request in flight (upstream.Replica.Waiting, InFlight).
type Load struct {
	Waiting, Queued, InFlight int64
	// Foreign is the prefill bytes that the replica's own report puts in
	// front of a request beyond the proxy's: requests that other callers
	// sent (upstream.Report.Foreign). 0 without scrapes.
	Foreign int64
	// ID is the replica's upstream.Replica.ID, the same in every instance.
	ID uint64
}

// Loads holds one Load per replica slot.
type Loads [upstream.MaxReplicas]Load

// Decision is a pick: the replica (-1 for none), why, and how many bytes
// of the prompt the policy expects that replica to hold already. Top is
// the rendezvous placement of the request (placement.go), -1 without
// rendezvous: where another instance would look first.
type Decision struct {
	Replica int
	Reason  Reason
	Cached  int64
	Top     int
}

// ChainSize estimates a request's prompt bytes from its chain: the decoded
// text that its last link covers (prefixcache.Link.Bytes), or bodyLen for a
// request without a chain.
func ChainSize(chain []prefixcache.Link, bodyLen int) int64 {
	if len(chain) == 0 {
		return int64(bodyLen)
	}
	return int64(chain[len(chain)-1].Bytes())
}

// SessionKey returns the pin map key of a session id: apart from every
// prefix chain's, so that a session never meets a conversation's pin.
func SessionKey(id []byte) uint64 {
	return xxhash.Sum64(id) ^ sessionSeed | 1 // never 0, which is "none"
}

const sessionSeed = 0x5E55_10_4E_C0_FFEE

func sessionLink(key uint64) prefixcache.Link {
	return prefixcache.Link{Hash: key, Check: sessionSeed}
}

// Pick returns the replica for req and why. It reads the pin map and, when
// it spreads, advances counter; it does no I/O and reads no clock, so a test
// can replay any sequence of picks. With no replica available it returns
// -1 and NoReplica: the caller answers 503 rather than queueing.
func Pick(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) (int, Reason) {
	d := Choose(p, req, pins, counter)
	return d.Replica, d.Reason
}

// Choose is Pick with the bytes of the prompt that the pick is expected to
// find cached, which the metrics hold against what the replica reports.
func Choose(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) Decision {
	var d Decision
	switch p {
	case Cost:
		d = chooseCost(req, pins, counter)
	case Adaptive, Affinity, RoundRobin:
		d = pick(p, req, pins, counter)
	default:
		d = chooseBaseline(p, req, pins, counter)
	}
	d.Top = -1
	if req.Rendezvous && len(req.Chain) > 0 && req.Load != nil {
		_, d.Top = rendezvous(req.Chain[0].Hash, req.Avail, req.Load)
	}
	return d
}

func pick(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) Decision {
	if req.Avail.Empty() {
		return decision(-1, NoReplica, 0)
	}
	if p != RoundRobin {
		// A session outranks prefixes; a new one is placed as its
		// request would be, and pinned where it lands (Served).
		if d, ok := sessionPick(req, pins, counter); ok {
			return d
		}
	}
	n := len(req.Chain)
	from := -1
	switch {
	case p == Adaptive && req.Prompt && n > 0:
		// A prompt that extends one served before.
		from = n - 1
	case p == Adaptive && n > 1:
		// A continuation: its previous turn pinned a prefix that ends
		// before the newest messages.
		from = n - 2
	case p == Affinity && n > 0:
		if r, i, ok := lookup(req.Chain, n-1, pins); ok && req.Avail.Has(r) {
			return decision(r, Pinned, int64(req.Chain[i].Bytes()))
		} else if ok {
			return decision(req.Avail.Nth(req.Chain[0].Hash), Repinned, 0)
		}
		return decision(req.Avail.Nth(req.Chain[0].Hash), Hashed, 0)
	}
	if from >= 0 {
		if r, i, ok := lookup(req.Chain, from, pins); ok {
			if req.Avail.Has(r) {
				return decision(r, Pinned, int64(req.Chain[i].Bytes()))
			}
			return decision(place(&req, counter), Repinned, 0)
		}
	}
	if p == RoundRobin {
		return decision(spread(&req.Avail, counter), Spread, 0)
	}
	return decision(place(&req, counter), Spread, 0)
}

// Served records that replica r answered req with status: a 2xx makes r
// the replica that the next turn of the conversation finds. It is the other
// half of the policy, after Pick; round-robin keeps no pins.
func Served(p Policy, req Request, r, status int, pins *prefixcache.PinMap) {
	if status < 200 || status >= 300 || !p.keepsPins() {
		return
	}
	if n := len(req.Chain); n > 0 {
		pins.Put(req.Chain[n-1], r)
		if n > 1 && p.sharesPrefixes() {
			// The first message (a system prompt, a shared context) is
			// pinned too: a fresh request that starts with it finds the
			// replica that holds it. Adaptive must not: it would send a
			// burst that shares a system prompt to one replica.
			pins.Put(req.Chain[0], r)
		}
	}
	if req.Session != 0 {
		pins.Put(sessionLink(req.Session), r)
	}
}

// keepsPins reports whether p reads pins: round-robin and the load-only
// baselines keep none.
func (p Policy) keepsPins() bool { return p != RoundRobin && p != LeastLoad && p != PowerOfTwo }

// sharesPrefixes reports whether p weighs a fresh request's shared first
// message, so that Served pins it.
func (p Policy) sharesPrefixes() bool { return p == Cost || p == SGLang || p == LLMD }

// lookup finds the longest pinned prefix ending at or before from: its
// replica and its link's index.
func lookup(chain []prefixcache.Link, from int, pins *prefixcache.PinMap) (int, int, bool) {
	for i := from; i >= 0 && i > from-MaxLookback; i-- {
		if r, ok := pins.Get(chain[i]); ok {
			return r, i, true
		}
	}
	return 0, 0, false
}

func spread(avail *upstream.Mask, counter *atomic.Uint64) int {
	return avail.Nth(counter.Add(1) - 1)
}
