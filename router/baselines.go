package router

import (
	"math"
	"sync/atomic"

	"github.com/warmroute/warmroute/prefixcache"
)

// The peers' policies, re-implemented from their published descriptions so
// that the benchmarks measure ours beside theirs in one run, on the same
// simulated replicas. The load each reads is the proxy's own view (Load):
// requests in flight, and those still waiting for a first byte.

// SGLang's cache-aware policy, after the SGLang router's documentation
// (sgl-router README, "Cache-Aware Load-Balancing"): when the load is
// imbalanced (max-min above balance_abs_threshold and max above min times
// balance_rel_threshold) the least loaded worker gets the request;
// otherwise the worker with the longest prefix match gets it if the match
// covers more than cache_threshold of the prompt, and else the worker with
// the smallest radix tree (here: the fewest pins). Load is requests in
// flight; the thresholds are the ones the issue names as its defaults.
const (
	sglangBalanceAbs  = 64
	sglangBalanceRel  = 1.5
	sglangCacheThresh = 0.5
)

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

func chooseBaseline(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) Decision {
	if req.Avail.Empty() {
		return decision(-1, NoReplica, 0)
	}
	off := counter.Add(1) - 1
	switch p {
	case SGLang:
		return chooseSGLang(req, pins, off)
	case LLMD:
		return chooseLLMD(req, pins, off)
	case PowerOfTwo:
		// Two distinct replicas drawn at random (a hash of the counter),
		// the one with fewer requests in flight.
		k := uint64(req.Avail.Len())
		h := mixCounter(off)
		a := req.Avail.Nth(h % k)
		if k == 1 {
			return decision(a, Spread, 0)
		}
		b := req.Avail.Nth(h%k + 1 + (h>>32)%(k-1))
		if req.Load[b].InFlight < req.Load[a].InFlight {
			a = b
		}
		return decision(a, Spread, 0)
	}
	return decision(leastInFlight(req, off), Spread, 0) // LeastLoad
}

func leastInFlight(req Request, off uint64) int {
	best, least := -1, int64(math.MaxInt64)
	rotate(req.Avail, off, func(r int) {
		if n := req.Load[r].InFlight; n < least {
			best, least = r, n
		}
	})
	return best
}

func chooseSGLang(req Request, pins *prefixcache.PinMap, off uint64) Decision {
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].InFlight
		lo, hi = min(lo, n), max(hi, n)
	})
	if hi-lo > sglangBalanceAbs && float64(hi) > float64(lo)*sglangBalanceRel {
		return decision(leastInFlight(req, off), Balanced, 0)
	}
	var m matches
	m.scan(req.Chain, pins)
	if m.n > 0 && req.Size > 0 {
		for i := 0; i < m.n; i++ {
			if req.Avail.Has(m.r[i]) && float64(m.b[i])/float64(req.Size) > sglangCacheThresh {
				return decision(m.r[i], Pinned, m.b[i])
			}
		}
	}
	best, fewest := -1, int64(math.MaxInt64)
	rotate(req.Avail, off, func(r int) {
		if n := pins.Pins(r); n < fewest {
			best, fewest = r, n
		}
	})
	return decision(best, Spread, m.on(best))
}

func chooseLLMD(req Request, pins *prefixcache.PinMap, off uint64) Decision {
	var m matches
	m.scan(req.Chain, pins)
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].Waiting
		lo, hi = min(lo, n), max(hi, n)
	})
	best, top := -1, -1.0
	rotate(req.Avail, off, func(r int) {
		queue := 1.0
		if hi > lo {
			queue = float64(hi-req.Load[r].Waiting) / float64(hi-lo)
		}
		prefix := 0.0
		if req.Size > 0 {
			prefix = min(float64(m.on(r))/float64(req.Size), 1)
		}
		if s := llmdPrefixWeight*prefix + llmdQueueWeight*queue; s > top {
			best, top = r, s
		}
	})
	if cached := m.on(best); cached > 0 {
		return decision(best, Pinned, cached)
	}
	return decision(best, Spread, 0)
}

// mixCounter spreads a counter value over 64 bits (splitmix64's finalizer),
// the random draw of power of two choices, repeatable in tests.
func mixCounter(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}
