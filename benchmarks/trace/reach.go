package trace

import "encoding/binary"

// Reach is what a window of a trace offers a router: the prompt tokens
// of its requests, and those that an earlier request of the window had
// sent before, the most that any router could find cached in replicas
// with room for the whole window.
type Reach struct {
	Prompt, Shared int
	// Distinct is the prompt tokens that no earlier request had sent:
	// the KV cache that holds the whole window.
	Distinct int
}

// Share is Shared over Prompt: the best cached share of prompt tokens.
func (r Reach) Share() float64 {
	if r.Prompt == 0 {
		return 0
	}
	return float64(r.Shared) / float64(r.Prompt)
}

// Reachable counts, over reqs in order, each block whose prefix (the ids
// up to and including it) an earlier request had: its tokens are
// shared. The last block of a prompt counts the tokens it covers.
func Reachable(reqs []Request) Reach {
	seen := map[uint64]struct{}{}
	var out Reach
	for _, r := range reqs {
		h := prefixSeed
		for i, id := range r.Blocks {
			h = extend(h, id)
			tokens := min(BlockTokens, r.Input-i*BlockTokens)
			out.Prompt += tokens
			if _, ok := seen[h]; ok {
				out.Shared += tokens
				continue
			}
			seen[h] = struct{}{}
			out.Distinct += tokens
		}
	}
	return out
}

// CachedPrefixes returns, for each of reqs in order, the tokens of its
// leading blocks whose prefixes an earlier request had: what a replica
// that had served every earlier request would find cached.
func CachedPrefixes(reqs []Request) []int {
	seen := map[uint64]struct{}{}
	out := make([]int, len(reqs))
	for j, r := range reqs {
		h := prefixSeed
		lead := true
		for i, id := range r.Blocks {
			h = extend(h, id)
			if _, ok := seen[h]; ok && lead {
				out[j] = min((i+1)*BlockTokens, r.Input)
				continue
			}
			lead = false
			seen[h] = struct{}{}
		}
	}
	return out
}

// prefixSeed starts the chained hash of a list of block ids.
const prefixSeed uint64 = 0x6a09e667f3bcc908

// extend returns the hash of the ids that h covers followed by id: an
// FNV-1a over the eight bytes of each id, chained, so that equal hashes
// mean equal lists of ids but for collisions, which 64 bits make
// negligible at a trace's size.
func extend(h, id uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	for _, c := range b {
		h ^= uint64(c)
		h *= 0x100000001b3
	}
	return h
}
