package router

import "github.com/warmroute/warmroute/upstream"

// DefaultHeldMemory is the default of -held-memory: per replica, room for
// about 105,000 links of 256 bytes, 6.7M tokens, heldLifetimes of a
// replica with 1.7M tokens of KV cache.
const DefaultHeldMemory = 4 << 20

// hold records that x's replica, about to be sent x, holds x's prompt: by
// the time a later request sent there is prefilled, this one's prefill is
// done and in its cache. It first notes what the replica was believed to
// hold of it, for learn: the bytes, and the stamp of the prefix's oldest
// link, unless that stamp may be a request's still waiting for its
// prefill, whose blocks the engine may not have yet.
func (x *exchange) hold() {
	blocks := x.req.Blocks
	if x.req.Held == nil || len(blocks) == 0 || x.heldTick != 0 {
		return
	}
	r := x.r.Index
	bytes, n, stamp := x.req.Held.Recall(r, blocks)
	x.heldTick = x.req.Held.Insert(r, blocks, x.h.kvBytes(x.r))
	x.heldBytes, x.heldFrom, x.heldStamp = bytes, n, stamp
	// Requests sent there since the oldest that still waits are at most
	// the last waiting ticks: a stamp among them may not be in the
	// engine's cache yet, and a short report would not mean an eviction.
	if waiting, _ := x.r.Waiting(); stamp+uint64(waiting) > x.heldTick {
		x.heldStamp = 0
	}
}

// unhold takes back what hold recorded, for a request that the replica
// did not take (not sent, refused, answered non-2xx): the links of its
// prompt past what the replica held before, unless a later request
// recorded them since.
func (x *exchange) unhold() {
	if x.heldTick == 0 {
		return
	}
	x.req.Held.Withdraw(x.r.Index, x.req.Blocks[x.heldFrom:], x.heldTick)
	x.heldTick, x.heldStamp = 0, 0
}

// learn corrects what x's replica is believed to hold by what it reported
// of x's prompt (usage): when it found far less cached than it was
// believed to hold, its engine had evicted a block that the proxy believed
// it held, and, evicting the least recently used first, everything older
// too (prefixcache.Holdings.Forget).
func (x *exchange) learn(prompt, cached int64, reported bool) {
	if x.heldStamp == 0 || !reported || prompt <= 0 {
		return
	}
	// The reported tokens, in the bytes of this prompt's rendering.
	had := cached * x.req.Size / prompt
	if x.heldBytes-had > max(x.heldBytes/4, 4*int64(x.h.cfg.PromptChunk)) {
		x.h.m.forgotten.Add(x.req.Held.Forget(x.r.Index, x.heldStamp))
	}
}

// heldLifetimes is how many times its KV capacity a replica is believed
// to hold: what it was sent over its cache's last few lifetimes, not its
// cache alone. A prefix that the engine evicted still counts as its, so
// the prefix goes back there when it returns and is cached again on that
// replica alone, where a belief of the cache alone would send it to
// whichever replica is least busy then, and over time cache every shared
// prefix on each replica in turn, in room the replicas' caches could give
// to different ones; docs/routing.md has the trace replay that measured
// it. A report of a prompt found evicted still corrects the belief at
// once (learn), and takes the older lifetimes with it: the engine lost
// them too, and what the belief keeps of them only steers a prefix home
// until the replica's next such report.
const heldLifetimes = 4

// kvBytes bounds what replica r is believed to hold, in bytes of
// rendering: heldLifetimes times the KV capacity it publishes, or else
// Config.KVTokens, at about bytesPerToken bytes a token; 0 for no bound
// but HeldMemory.
func (h *Handler) kvBytes(r *upstream.Replica) int64 {
	tokens := r.KVTokens()
	if tokens <= 0 {
		tokens = h.cfg.KVTokens
	}
	return max(tokens, 0) * bytesPerToken * heldLifetimes
}
