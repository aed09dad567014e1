package benchmarks

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// The peers' policies, re-implemented from their published descriptions so
// that the policy table measures ours beside theirs in one run, on the same
// simulated replicas. They are router.Policy values, which the proxy under
// test runs as it runs its own, but no -routing value names them. The load
// each reads is the proxy's own view (router.Load): requests in flight, and
// those still waiting for a first byte.
var (
	sglang     router.Policy = sglangPolicy{}
	llmd       router.Policy = llmdPolicy{}
	leastLoad  router.Policy = leastPolicy{}
	powerOfTwo router.Policy = p2cPolicy{}
)

// SGLang's cache-aware policy, after the SGLang router's documentation
// (sgl-router README, "Cache-Aware Load-Balancing"): when the load is
// imbalanced (max-min above balance_abs_threshold and max above min times
// balance_rel_threshold) the least loaded worker gets the request;
// otherwise the worker with the longest prefix match gets it if the match
// covers more than cache_threshold of the prompt, and else the worker with
// the smallest radix tree (here: the fewest pins). Load is requests in
// flight; the thresholds are its documented defaults.
const (
	sglangBalanceAbs  = 64
	sglangBalanceRel  = 1.5
	sglangCacheThresh = 0.5
)

type sglangPolicy struct{}

func (sglangPolicy) String() string { return "sglang" }

func (sglangPolicy) Needs() router.Needs {
	return router.Needs{Pins: true, FirstMessage: true, Load: true}
}

func (sglangPolicy) Choose(req router.Request) router.Decision {
	off := req.Counter.Add(1) - 1
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].InFlight
		lo, hi = min(lo, n), max(hi, n)
	})
	if hi-lo > sglangBalanceAbs && float64(hi) > float64(lo)*sglangBalanceRel {
		return router.Decision{Replica: leastInFlight(req, off), Reason: router.Balanced}
	}
	var m router.Matches
	m.Scan(req.Chain, req.Pins)
	if req.Size > 0 {
		for i := 0; i < m.Len(); i++ {
			if r, b := m.At(i); req.Avail.Has(r) && float64(b)/float64(req.Size) > sglangCacheThresh {
				return router.Decision{Replica: r, Reason: router.Pinned, Cached: b}
			}
		}
	}
	best, fewest := -1, int64(math.MaxInt64)
	router.Rotate(req.Avail, off, func(r int) {
		if n := req.Pins.Pins(r); n < fewest {
			best, fewest = r, n
		}
	})
	return router.Decision{Replica: best, Reason: router.Spread, Cached: m.On(best)}
}

// llm-d's default scheduling profile, after the llm-d inference scheduler's
// documentation: a prefix-cache scorer (the fraction of the prompt cached
// on the endpoint) with weight 3 plus a queue scorer (min-max normalized
// waiting requests, 1 for the shortest queue) with weight 2; the highest
// total wins. The affinity filter's TTFT gate needs a latency predictor
// that the proxy does not have and is left out.
const (
	llmdPrefixWeight = 3
	llmdQueueWeight  = 2
)

type llmdPolicy struct{}

func (llmdPolicy) String() string { return "llmd" }

func (llmdPolicy) Needs() router.Needs {
	return router.Needs{Pins: true, FirstMessage: true, Load: true}
}

func (llmdPolicy) Choose(req router.Request) router.Decision {
	var m router.Matches
	m.Scan(req.Chain, req.Pins)
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].Waiting
		lo, hi = min(lo, n), max(hi, n)
	})
	best, top := -1, -1.0
	router.Rotate(req.Avail, req.Counter.Add(1)-1, func(r int) {
		queue := 1.0
		if hi > lo {
			queue = float64(hi-req.Load[r].Waiting) / float64(hi-lo)
		}
		prefix := 0.0
		if req.Size > 0 {
			prefix = min(float64(m.On(r))/float64(req.Size), 1)
		}
		if s := llmdPrefixWeight*prefix + llmdQueueWeight*queue; s > top {
			best, top = r, s
		}
	})
	if cached := m.On(best); cached > 0 {
		return router.Decision{Replica: best, Reason: router.Pinned, Cached: cached}
	}
	return router.Decision{Replica: best, Reason: router.Spread}
}

// leastPolicy sends each request to the replica with the fewest requests
// in flight, ties in turn: load balancing blind to caches.
type leastPolicy struct{}

func (leastPolicy) String() string { return "least" }

func (leastPolicy) Needs() router.Needs { return router.Needs{Load: true} }

func (leastPolicy) Choose(req router.Request) router.Decision {
	return router.Decision{Replica: leastInFlight(req, req.Counter.Add(1)-1), Reason: router.Spread}
}

func leastInFlight(req router.Request, off uint64) int {
	best, least := -1, int64(math.MaxInt64)
	router.Rotate(req.Avail, off, func(r int) {
		if n := req.Load[r].InFlight; n < least {
			best, least = r, n
		}
	})
	return best
}

// p2cPolicy is power of two choices: two distinct replicas drawn at
// random, the one with fewer requests in flight.
type p2cPolicy struct{}

func (p2cPolicy) String() string { return "p2c" }

func (p2cPolicy) Needs() router.Needs { return router.Needs{Load: true} }

func (p2cPolicy) Choose(req router.Request) router.Decision {
	k := req.Avail.Len()
	i := rand.IntN(k)
	a := req.Avail.Nth(uint64(i))
	if k == 1 {
		return router.Decision{Replica: a, Reason: router.Spread}
	}
	j := rand.IntN(k - 1) // of the k-1 others
	if j >= i {
		j++
	}
	if b := req.Avail.Nth(uint64(j)); req.Load[b].InFlight < req.Load[a].InFlight {
		a = b
	}
	return router.Decision{Replica: a, Reason: router.Spread}
}

// chainOf is conversation c's first n messages, each per bytes long, as
// prefixcache.AppendChain links them (Check: count and cumulative bytes).
func chainOf(c, n int, per uint64) []prefixcache.Link {
	chain := make([]prefixcache.Link, n)
	for i := range chain {
		chain[i] = prefixcache.Link{Hash: uint64(c)<<32 | uint64(i+1), Check: uint64(i+1)<<40 | per*uint64(i+1)}
	}
	return chain
}

// TestPeerPolicies checks each peer's rule on a table of its own, through
// router.Choose as the proxy runs it.
func TestPeerPolicies(t *testing.T) {
	all := upstream.MaskOf(0b111)
	pinnedTo := func(pins *prefixcache.PinMap, chain []prefixcache.Link, r int) {
		router.Served(sglang, router.Request{Chain: chain}, r, 200, pins)
	}
	t.Run("least in flight", func(t *testing.T) {
		var loads router.Loads
		loads[0], loads[1], loads[2] = router.Load{InFlight: 5}, router.Load{InFlight: 2}, router.Load{InFlight: 7}
		var counter atomic.Uint64
		for i := 0; i < 3; i++ {
			if d := router.Choose(leastLoad, router.Request{Avail: all, Load: &loads}, nil, &counter); d.Replica != 1 {
				t.Fatalf("got %d, want 1", d.Replica)
			}
		}
	})
	t.Run("power of two never picks the busier of its two", func(t *testing.T) {
		var loads router.Loads
		loads[0], loads[1], loads[2] = router.Load{InFlight: 0}, router.Load{InFlight: 10}, router.Load{InFlight: 20}
		var counter atomic.Uint64
		seen := [3]int{}
		for i := 0; i < 300; i++ {
			seen[router.Choose(powerOfTwo, router.Request{Avail: all, Load: &loads}, nil, &counter).Replica]++
		}
		if seen[2] != 0 || seen[0] == 0 || seen[1] == 0 {
			t.Fatalf("picks per replica %v: the busiest must never win, the others both must", seen)
		}
	})
	t.Run("sglang follows a match over half the prompt, else the smallest tree", func(t *testing.T) {
		pins := prefixcache.NewPinMap(1024, 3)
		var loads router.Loads
		var counter atomic.Uint64
		conv := chainOf(1, 4, 1000)
		pinnedTo(pins, conv[:3], 2)          // 3000 of 4000 bytes on replica 2
		pinnedTo(pins, chainOf(9, 2, 10), 0) // replica 0 holds more pins than 1
		req := router.Request{Chain: conv, Avail: all, Size: 4000, Load: &loads}
		if d := router.Choose(sglang, req, pins, &counter); d.Replica != 2 || d.Reason != router.Pinned {
			t.Fatalf("match of 75%%: got %+v", d)
		}
		other := chainOf(2, 4, 1000)
		if d := router.Choose(sglang, router.Request{Chain: other, Avail: all, Size: 4000, Load: &loads}, pins, &counter); d.Replica != 1 {
			t.Fatalf("no match: got %+v, want replica 1, the smallest tree", d)
		}
		loads[2] = router.Load{InFlight: 200}
		loads[1] = router.Load{InFlight: 100}
		if d := router.Choose(sglang, req, pins, &counter); d.Replica != 0 || d.Reason != router.Balanced {
			t.Fatalf("imbalanced: got %+v, want replica 0, the least loaded", d)
		}
	})
	t.Run("llm-d weighs the prefix 3 to the queue's 2", func(t *testing.T) {
		pins := prefixcache.NewPinMap(1024, 3)
		var loads router.Loads
		var counter atomic.Uint64
		conv := chainOf(1, 4, 1000)
		pinnedTo(pins, conv[:3], 2) // 75% cached on 2: 3*0.75 = 2.25
		loads[2] = router.Load{Waiting: 4}
		loads[0] = router.Load{Waiting: 0}
		loads[1] = router.Load{Waiting: 4}
		// 2: 2.25 + 0 = 2.25; 0: 0 + 2 = 2: the prefix wins.
		req := router.Request{Chain: conv, Avail: all, Size: 4000, Load: &loads}
		if d := router.Choose(llmd, req, pins, &counter); d.Replica != 2 {
			t.Fatalf("got %+v, want 2", d)
		}
		conv2 := chainOf(1, 8, 1000)
		// 3000 of 8000 cached on 2: 1.125 + 0 against 2 for the idle queue.
		if d := router.Choose(llmd, router.Request{Chain: conv2, Avail: all, Size: 8000, Load: &loads}, pins, &counter); d.Replica != 0 {
			t.Fatalf("got %+v, want 0", d)
		}
	})
	t.Run("never an unavailable replica", func(t *testing.T) {
		pins := prefixcache.NewPinMap(1024, 8)
		var counter atomic.Uint64
		var loads router.Loads
		for i := 0; i < 2000; i++ {
			for r := range 8 {
				loads[r] = router.Load{Waiting: int64(i*7+r) % 5, InFlight: int64(i*13+r*5) % 90}
			}
			avail := upstream.MaskOf(uint64(i*37) % 256)
			chain := chainOf(i%20, 1+i%7, uint64(100+i%3000))
			for _, p := range []router.Policy{sglang, llmd, leastLoad, powerOfTwo} {
				d := router.Choose(p, router.Request{Chain: chain, Avail: avail, Size: int64(chain[len(chain)-1].Bytes()), Load: &loads}, pins, &counter)
				if avail.Empty() != (d.Replica == -1) || d.Replica >= 0 && !avail.Has(d.Replica) {
					t.Fatalf("%s: picked %d of %b", p, d.Replica, avail[0])
				}
				router.Served(p, router.Request{Chain: chain}, (i*3)%8, 200, pins)
			}
		}
	})
}

// TestPeersAreNotRoutingValues: the peers' policies are measured, not
// offered; -routing names ours alone.
func TestPeersAreNotRoutingValues(t *testing.T) {
	for _, p := range []router.Policy{sglang, llmd, leastLoad, powerOfTwo} {
		if _, err := router.ParsePolicy(p.String()); err == nil {
			t.Errorf("-routing %s is accepted", p)
		}
	}
}
