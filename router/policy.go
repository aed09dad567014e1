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

// Policy is a routing policy: it picks a replica for a request from what
// the request carries (its prefix chain, the replicas available, the pin
// map, the load table), with no I/O and no clock, so that a test can
// replay any sequence of picks. The rules that every policy shares (no
// replica available, a pinned session unless the policy weighs sessions
// itself) are applied before it (Choose), and what a 2xx teaches the pin
// map is recorded after it (Served), as Needs says.
type Policy interface {
	// Choose picks a replica of req.Avail, which is not empty.
	Choose(req Request) Decision
	// Needs says what the policy reads besides the chain.
	Needs() Needs
	// String is the policy's -routing name and metric label.
	String() string
}

// Needs is what a policy reads besides the request's chain.
type Needs struct {
	// Pins: Served pins each answered conversation (its last link, its
	// session) to the replica that answered, and sessions stay there.
	Pins bool
	// FirstMessage: Served pins the first message too (a system prompt,
	// a shared context), which a fresh request may share.
	FirstMessage bool
	// Load: the caller fills Request.Load.
	Load bool
	// Held: the caller fills Request.Held, records in it each prompt as
	// held by the replica it is sent to (taken back if the replica does
	// not take it), and corrects it by the cached tokens replicas report.
	Held bool
	// Sessions: the policy weighs a session's replica itself (the cost
	// policy counts it as holding the session's prompt), where for the
	// others Choose sends a session there ahead of the policy.
	Sessions bool
}

// Default is the policy that -routing names by default: the cost policy,
// which weighs the prompt a replica holds against the work queued there
// (cost.go, docs/routing.md).
var Default Policy = Cost

// The policies that -routing selects. Adaptive was the default until the
// cost policy measured as good or better on every workload (docs/routing.md);
// it, affinity and round-robin stay so that users can measure them.
var (
	// Cost sends a request where its first token is estimated to come
	// soonest: the prefill queued there plus the part of the prompt that
	// the replica does not hold (cost.go).
	Cost Policy = costPolicy{}
	// Adaptive pins continuations to the replica that served their prefix
	// and spreads everything else (policy_adaptive.go).
	Adaptive Policy = adaptive{}
	// Affinity pins every request, and a miss picks by the first message,
	// so that a same-prefix burst lands on one replica
	// (policy_affinity.go).
	Affinity Policy = affinity{}
	// RoundRobin spreads every request by counter (policy_roundrobin.go).
	RoundRobin Policy = roundRobin{}
)

// Policies are the -routing values, the default first.
var Policies = [...]Policy{Cost, Adaptive, Affinity, RoundRobin}

// ParsePolicy returns the policy named s, or an error listing the valid names.
func ParsePolicy(s string) (Policy, error) {
	names := make([]string, len(Policies))
	for i, p := range Policies {
		if s == p.String() {
			return p, nil
		}
		names[i] = p.String()
	}
	return nil, fmt.Errorf("unknown routing policy %q; valid: %s", s, strings.Join(names, ", "))
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
	// Session: the replica that the request's session is pinned to
	// (under the cost policy, kept as no costlier than a move).
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
	// Blocks has a link every -prompt-chunk bytes of the prompt's
	// rendering and at each message end (prefixcache.Chains): what the
	// policy asks Held about.
	Blocks []prefixcache.Link
	// Avail holds each replica that may be picked: live, and
	// not yet tried for this request.
	Avail upstream.Mask
	// Prompt marks a chain of a completions prompt, one link per chunk:
	// its whole length may be cached already (the same prompt again), so
	// it is looked up from its last link, not from the one before.
	Prompt bool
	// Session is the key of the request's session (session.go: the
	// agents' session headers, or the body's prompt_cache_key), 0 for
	// none. The cost policy counts the session's replica as holding its
	// prompt, so that a history rewritten by compaction stays there;
	// adaptive and affinity keep a session on one replica whatever its
	// prefixes.
	Session uint64
	// Size estimates the prompt's prefill work in bytes (ChainSize).
	Size int64
	// Load is each available replica's load, indexed by slot; nil when
	// the policy reads none (Needs) and placement is by counter.
	Load *Loads
	// Rendezvous places a request that no pin places by rendezvous hashing
	// (placement.go) instead of the counter, so that instances agree.
	Rendezvous bool
	// Pins is the pin map that the policy reads and Served writes.
	Pins *prefixcache.PinMap
	// Held is what each replica is believed to hold, per block of the
	// prompt (Blocks); nil when the policy reads none (Needs).
	Held *prefixcache.Holdings
	// Counter spreads requests in turn: a policy that spreads, or breaks
	// a tie in turn, advances it.
	Counter *atomic.Uint64
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

// Choose returns p's pick for req, which reads pins and advances counter,
// after the rules that every policy shares: with no replica available it
// is -1 and NoReplica (the caller answers 503 rather than queueing), and a
// session pinned to a replica goes there for every policy that keeps pins
// and does not weigh sessions itself (Needs.Sessions).
// Decision.Top is the request's rendezvous placement when it asks for one.
func Choose(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) Decision {
	if req.Avail.Empty() {
		return decision(-1, NoReplica, 0)
	}
	req.Pins, req.Counter = pins, counter
	d, ok := sessionPick(&req, p.Needs())
	if !ok {
		d = p.Choose(req)
	}
	d.Top = -1
	if req.Rendezvous && len(req.Chain) > 0 && req.Load != nil {
		_, d.Top = rendezvous(req.Chain[0].Hash, req.Avail, req.Load)
	}
	return d
}

// sessionPick is the session rule: a session pinned to an available
// replica goes there; one whose replica is gone is spread, and pinned
// again where it lands (Served). A new session is placed as its request
// would be.
func sessionPick(req *Request, needs Needs) (Decision, bool) {
	if !needs.Pins || needs.Sessions {
		return Decision{}, false
	}
	r := sessionReplica(req)
	if r < 0 {
		return Decision{}, false
	}
	if req.Avail.Has(r) {
		return decision(r, Session, 0), true
	}
	return decision(spread(req), Repinned, 0), true
}

// Served records that replica r answered req with status: a 2xx makes r
// the replica that the next turn of the conversation finds, for a policy
// that keeps pins. It is the other half of every policy, after Choose, and
// the only place that writes the pin map's conversation pins.
func Served(p Policy, req Request, r, status int, pins *prefixcache.PinMap) {
	needs := p.Needs()
	if status < 200 || status >= 300 || !needs.Pins {
		return
	}
	if n := len(req.Chain); n > 0 {
		pins.Put(req.Chain[n-1], r)
		if n > 1 && needs.FirstMessage {
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
