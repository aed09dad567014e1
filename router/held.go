package router

import "github.com/warmroute/warmroute/upstream"

// DefaultHeldMemory is the default of -held-memory: per replica, room for
// about 123,000 links of 256 bytes, what a replica with 7M tokens of KV
// cache holds.
const DefaultHeldMemory = 4 << 20

// hold records that x's replica, just picked, holds x's prompt: by the
// time a later request sent there is prefilled, this one's prefill is
// done and in its cache. It first notes the stamp of the oldest link of
// the prefix the replica was believed to hold, for learn.
func (x *exchange) hold() {
	blocks := x.req.Blocks
	if x.req.Held == nil || len(blocks) == 0 {
		return
	}
	r := x.r.Index
	_, _, x.heldStamp = x.req.Held.Recall(r, blocks)
	x.req.Held.Insert(r, blocks, x.h.kvBytes(x.r))
}

// learn corrects what x's replica is believed to hold by what it reported
// of x's prompt (usage): when it found far less cached than the policy
// predicted, its engine had evicted a block that the proxy believed it
// held, and, evicting the least recently used first, everything older
// too (prefixcache.Holdings.Forget).
func (x *exchange) learn(prompt, cached int64, reported bool) {
	if x.req.Held == nil || !reported || prompt <= 0 || x.heldStamp == 0 {
		return
	}
	// The reported tokens, in the bytes of this prompt's rendering.
	had := cached * x.req.Size / prompt
	if x.predictedBytes-had > max(x.predictedBytes/4, 4*int64(x.h.cfg.PromptChunk)) {
		x.h.m.forgotten.Add(x.req.Held.Forget(x.r.Index, x.heldStamp))
	}
}

// kvBytes bounds what replica r is believed to hold, in bytes of
// rendering: the KV capacity it publishes, or else Config.KVTokens, at
// about bytesPerToken bytes a token; 0 for no bound but HeldMemory.
func (h *Handler) kvBytes(r *upstream.Replica) int64 {
	tokens := r.KVTokens()
	if tokens <= 0 {
		tokens = h.cfg.KVTokens
	}
	return max(tokens, 0) * bytesPerToken
}
