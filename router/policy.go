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
)

// PolicyNames are the -routing values, in Policy order.
var PolicyNames = [...]string{"adaptive", "affinity", "roundrobin"}

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
)

// ReasonNames are the label values of the reasons, in order.
var ReasonNames = [...]string{"spread", "pinned", "repinned", "hashed", "failover", "none", "session"}

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
	if req.Avail.Empty() {
		return -1, NoReplica
	}
	if req.Session != 0 && p != RoundRobin {
		// A session outranks prefixes; a new one is placed as its
		// request would be, and pinned where it lands (Served).
		if r, ok := pins.Get(sessionLink(req.Session)); ok {
			if req.Avail.Has(r) {
				return r, Session
			}
			return spread(&req.Avail, counter), Repinned
		}
	}
	n := len(req.Chain)
	switch {
	case p == Adaptive && req.Prompt && n > 0:
		// A prompt that extends one served before.
		if r, ok := lookup(req.Chain, n-1, pins); ok {
			if req.Avail.Has(r) {
				return r, Pinned
			}
			return spread(&req.Avail, counter), Repinned
		}
	case p == Adaptive && n > 1:
		// A continuation: its previous turn pinned a prefix that ends
		// before the newest messages.
		if r, ok := lookup(req.Chain, n-2, pins); ok {
			if req.Avail.Has(r) {
				return r, Pinned
			}
			return spread(&req.Avail, counter), Repinned
		}
	case p == Affinity && n > 0:
		if r, ok := lookup(req.Chain, n-1, pins); ok {
			if req.Avail.Has(r) {
				return r, Pinned
			}
			return req.Avail.Nth(req.Chain[0].Hash), Repinned
		}
		return req.Avail.Nth(req.Chain[0].Hash), Hashed
	}
	return spread(&req.Avail, counter), Spread
}

// Served records that replica r answered req with status: a 2xx makes r
// the replica that the next turn of the conversation finds. It is the other
// half of the policy, after Pick; round-robin keeps no pins.
func Served(p Policy, req Request, r, status int, pins *prefixcache.PinMap) {
	if status < 200 || status >= 300 || p == RoundRobin {
		return
	}
	if len(req.Chain) > 0 {
		pins.Put(req.Chain[len(req.Chain)-1], r)
	}
	if req.Session != 0 {
		pins.Put(sessionLink(req.Session), r)
	}
}

// lookup finds the longest pinned prefix ending at or before from.
func lookup(chain []prefixcache.Link, from int, pins *prefixcache.PinMap) (int, bool) {
	for i := from; i >= 0 && i > from-MaxLookback; i-- {
		if r, ok := pins.Get(chain[i]); ok {
			return r, true
		}
	}
	return 0, false
}

func spread(avail *upstream.Mask, counter *atomic.Uint64) int {
	return avail.Nth(counter.Add(1) - 1)
}
