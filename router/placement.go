package router

import (
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// Where the pin map, a session and the counter place a request, for the
// policies to share; none of it calls back into a policy.
//
// Placement of a request that no pin places. One instance spreads by its
// counter, exact and free. Several instances behind one load balancer must
// agree without talking, so that a conversation's next turn lands where
// its last one did whichever instance gets it: -placement rendezvous
// hashes its first message's link with the replicas' names (highest random
// weight), which every instance computes alike. A load bound keeps a burst
// that shares one system prompt spread (hashed without one, a cold burst of
// 16 such requests went to one replica: 30.1 s against 18.6 s spread): a replica is skipped
// while it has more requests in flight than the mean, rounded up, after
// this one. A placement that the bound moved is what other instances
// cannot compute: the pin store (-pin-store) carries it.

// weight is replica id's rendezvous weight for key.
func weight(key, id uint64) uint64 {
	return splitmix(key ^ id)
}

// rendezvous returns the replica of avail with the highest weight for key
// among those under the load bound, and the one with the highest weight
// regardless of load: the placement every instance computes.
func rendezvous(key uint64, avail upstream.Mask, load *Loads) (placed, top int) {
	k := int64(avail.Len())
	if k == 0 {
		return -1, -1
	}
	var total int64
	avail.Each(func(r int) { total += load[r].InFlight })
	bound := (total + k) / k // ceil((total+1)/k): the mean after this request
	placed, top = -1, -1
	var placedW, topW uint64
	avail.Each(func(r int) {
		wt := weight(key, load[r].ID)
		if top < 0 || wt > topW {
			top, topW = r, wt
		}
		if load[r].InFlight < bound && (placed < 0 || wt > placedW) {
			placed, placedW = r, wt
		}
	})
	return placed, top
}

// place spreads a request that no pin places: by rendezvous when req asks
// for it and has a chain, else by counter. Only a request that may open a
// conversation (one or two messages: a system prompt and a first user
// turn) is held to the load bound. A longer one is a later turn whose
// earlier turns were placed at its rendezvous top, or moved and recorded
// in the pin store, which was read before: it goes to the top, which every
// instance computes alike whatever load each of them sees.
func place(req *Request) int {
	if req.Rendezvous && len(req.Chain) > 0 && req.Load != nil {
		placed, top := rendezvous(req.Chain[0].Hash, req.Avail, req.Load)
		if opens(req) {
			return placed
		}
		return top
	}
	return spread(req)
}

// opens reports whether req may be the first turn of a conversation.
func opens(req *Request) bool { return len(req.Chain) <= 2 || req.Prompt }

func decision(r int, reason Reason, cached int64) Decision {
	return Decision{Replica: r, Reason: reason, Cached: cached, Top: -1}
}

// splitmix spreads a value over 64 bits (splitmix64's finalizer), so that
// the weights of one key on different replicas are independent.
func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}

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

// spread picks the next available replica by the counter.
func spread(req *Request) int {
	return req.Avail.Nth(req.Counter.Add(1) - 1)
}

// sessionReplica returns the replica that req's session is pinned to
// (available or not), -1 for a request without a session or a session
// that none has served.
func sessionReplica(req *Request) int {
	if req.Session == 0 {
		return -1
	}
	if r, ok := req.Pins.Get(sessionLink(req.Session)); ok {
		return r
	}
	return -1
}

func sessionLink(key uint64) prefixcache.Link {
	return prefixcache.Link{Hash: key, Check: sessionSeed}
}
