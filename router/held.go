package router

import "github.com/warmroute/warmroute/upstream"

// DefaultHeldMemory is the default of -held-memory: per replica, room for
// about 123,000 links of 256 bytes, what a replica with 7M tokens of KV
// cache holds.
const DefaultHeldMemory = 4 << 20

// learn records what x's replica holds once it answered x whole with a
// 2xx: the prompt's blocks, which it prefilled. First, when the replica
// reported (usage) that it found far less of the prompt cached than the
// policy predicted, the belief is corrected: the engine evicted what the
// proxy believed it held, and the least recently used before it
// (prefixcache.Holdings.Forget).
func (x *exchange) learn(prompt, cached int64, reported bool) {
	blocks := x.req.Blocks
	if x.req.Held == nil || len(blocks) == 0 {
		return
	}
	h, r := x.h, x.r.Index
	if reported && prompt > 0 && x.predictedBytes > 0 {
		// The reported tokens, in the bytes of this prompt's rendering.
		had := cached * x.req.Size / prompt
		if x.predictedBytes-had > max(x.predictedBytes/4, 4*int64(h.cfg.PromptChunk)) {
			h.m.forgotten.Add(x.req.Held.Forget(r, blocks, had+int64(h.cfg.PromptChunk)))
		}
	}
	x.req.Held.Insert(r, blocks, h.kvBytes(x.r))
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
