package benchmarks

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
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
	sglang     router.Policy = newSGLang()
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
// the smallest tree. Load is requests in flight; the thresholds are its
// documented defaults. As in SGLang's router, the tree is the router's
// own: each request's prompt is inserted into the chosen worker's part of
// it when it is routed (not when it is answered), a tree size is the
// prompt bytes inserted, and a match is the longest chain prefix (whole
// messages) found there. The router's default max tree size (2^26
// characters) evicts nothing in these workloads, so nothing is evicted.
const (
	sglangBalanceAbs  = 64
	sglangBalanceRel  = 1.5
	sglangCacheThresh = 0.5
)

// sglangTree is the router's approximate radix tree: which workers hold
// each chain prefix, and the bytes inserted for each worker.
type sglangTree struct {
	mu      sync.Mutex
	holders map[uint64]upstream.Mask // link hash
	size    [upstream.MaxReplicas]int64
}

type sglangPolicy struct{ tree *sglangTree }

// newSGLang returns the SGLang policy with an empty tree, for one proxy.
func newSGLang() router.Policy {
	return sglangPolicy{&sglangTree{holders: map[uint64]upstream.Mask{}}}
}

func (sglangPolicy) String() string { return "sglang" }

func (sglangPolicy) Needs() router.Needs { return router.Needs{Load: true} }

func (p sglangPolicy) Choose(req router.Request) router.Decision {
	t := p.tree
	t.mu.Lock()
	defer t.mu.Unlock()
	off := req.Counter.Add(1) - 1
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].InFlight
		lo, hi = min(lo, n), max(hi, n)
	})
	d := router.Decision{Replica: -1, Reason: router.Spread}
	if hi-lo > sglangBalanceAbs && float64(hi) > float64(lo)*sglangBalanceRel {
		d = router.Decision{Replica: leastInFlight(req, off), Reason: router.Balanced}
	}
	// The longest match over the workers: the last link of the chain
	// that an available worker holds.
	matched, holders := -1, upstream.Mask{}
	for i := len(req.Chain) - 1; i >= 0 && d.Replica < 0; i-- {
		if h, ok := t.holders[req.Chain[i].Hash]; ok {
			if h = h.And(req.Avail); !h.Empty() {
				matched, holders = i, h
				break
			}
		}
	}
	if d.Replica < 0 && matched >= 0 && req.Size > 0 && float64(req.Chain[matched].Bytes())/float64(req.Size) > sglangCacheThresh {
		d = router.Decision{Replica: holders.Nth(off), Reason: router.Pinned, Cached: int64(req.Chain[matched].Bytes())}
	}
	if d.Replica < 0 {
		smallest := int64(math.MaxInt64)
		rotate(req.Avail, off, func(r int) {
			if t.size[r] < smallest {
				d.Replica, smallest = r, t.size[r]
			}
		})
	}
	// Insert the prompt into the chosen worker's part of the tree: what
	// it held of it already is what the pick expects cached.
	r := d.Replica
	d.Cached = 0
	for _, l := range req.Chain {
		h := t.holders[l.Hash]
		if h.Has(r) {
			d.Cached = int64(l.Bytes())
			continue
		}
		h.Add(r)
		t.holders[l.Hash] = h
	}
	t.size[r] += max(req.Size-d.Cached, 0)
	return d
}

// fresh returns the policy with an empty tree: each proxy has its own.
func (sglangPolicy) fresh() router.Policy { return newSGLang() }

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
	rotate(req.Avail, req.Counter.Add(1)-1, func(r int) {
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

// rotate visits each replica of avail once, starting at the one that
// avail.Nth(off) names, so that ties are broken in turn.
func rotate(avail upstream.Mask, off uint64, visit func(r int)) {
	k := avail.Len()
	if k == 0 {
		return
	}
	start := int(off % uint64(k))
	for pass := 0; pass < 2; pass++ {
		ord := 0
		for wi, w := range avail {
			for ; w != 0; w &= w - 1 {
				if (pass == 0) == (ord >= start) {
					visit(wi*64 + bits.TrailingZeros64(w))
				}
				ord++
			}
		}
	}
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
	rotate(req.Avail, off, func(r int) {
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
// prefixcache.Chains.Read links them (Check: count and cumulative bytes).
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
	all := upstream.Mask{0b111}
	pinnedTo := func(pins *prefixcache.PinMap, chain []prefixcache.Link, r int) {
		router.Served(llmd, router.Request{Chain: chain}, r, 200, pins)
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
		p := newSGLang()
		var loads router.Loads
		var counter atomic.Uint64
		steps := []struct {
			chain  []prefixcache.Link
			want   int
			reason router.Reason
			cached int64
		}{
			// Empty trees: the counter's turn among them.
			{chainOf(1, 4, 1000), 0, router.Spread, 0},
			// Replica 0's tree holds 4000 bytes: the others are smaller.
			{chainOf(2, 2, 1000), 1, router.Spread, 0},
			// 4000 of 6000 bytes on replica 0: over half.
			{chainOf(1, 6, 1000), 0, router.Pinned, 4000},
			// 2000 of 8000 bytes on replica 1: the smallest tree, 2.
			{chainOf(2, 8, 1000), 2, router.Spread, 0},
			// Inserted at routing: the same prompt again matches whole.
			{chainOf(2, 8, 1000), 2, router.Pinned, 8000},
		}
		for i, st := range steps {
			req := router.Request{Chain: st.chain, Avail: all, Size: int64(st.chain[len(st.chain)-1].Bytes()), Load: &loads}
			if d := router.Choose(p, req, nil, &counter); d.Replica != st.want || d.Reason != st.reason || d.Cached != st.cached {
				t.Fatalf("step %d: got %+v, want replica %d (%s), %d cached", i, d, st.want, st.reason, st.cached)
			}
		}
		loads[0] = router.Load{InFlight: 200}
		loads[1] = router.Load{InFlight: 100}
		req := router.Request{Chain: chainOf(1, 6, 1000), Avail: all, Size: 6000, Load: &loads}
		if d := router.Choose(p, req, nil, &counter); d.Replica != 2 || d.Reason != router.Balanced {
			t.Fatalf("imbalanced: got %+v, want replica 2, the least loaded", d)
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
			avail := upstream.Mask{uint64(i*37) % 256}
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
