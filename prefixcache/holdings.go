package prefixcache

import (
	"sync"
	"sync/atomic"
)

// Holdings is what the proxy believes each replica's KV cache holds: for
// every replica, an LRU of the Blocks links (Chains) of the prompts it
// prefilled, each with the bytes of rendering since the link before it.
// An engine caches a prompt by blocks chained from its first token, and
// evicts the least recently used; Holdings keeps its links the same way,
// so that a replica's question "how much of this prompt do you hold" is
// answered by a binary search over the prompt's links.
//
// What a replica holds is kept prefix-closed: Insert touches a prompt's
// links from its last to its first, so that a link is never more recently
// used than the links before it in any prompt that has it, and eviction
// from the least recently used end takes the tail of a prefix before its
// head. The first link that a replica lacks is found in about log2(n)
// lookups, under one lock per replica.
//
// Each replica's LRU is bounded twice: by entries, a fixed memory budget
// allocated when the replica first prefills a prompt; and by bytes, the
// replica's KV capacity as Insert is told it (0 for no bound but the
// entries). Each Insert is a tick of the replica's clock, and each link
// keeps the tick that last touched it, its stamp: how old what a replica
// holds is, so that Forget can drop what is older than a link it lost.
// Every method is safe for concurrent use and allocates nothing once the
// replica's LRU exists.
type Holdings struct {
	entries  int // per replica
	replicas []holding
}

type holding struct {
	mu    sync.Mutex
	s     *shard[uint64] // nil until the replica's first Insert; values are stamp<<16 | span
	bytes int64          // the spans held
	clock uint64         // Inserts so far
	// held mirrors bytes for readers without the lock (/replicas).
	held      atomic.Int64
	evictions uint64 // entries evicted for the byte bound or the entry bound
	dropped   uint64 // entries evicted by Forget
	_         [32]byte
}

// HoldingEntryBytes is the memory of one held link, for sizing the budget.
const HoldingEntryBytes = entryBytes + 6

// NewHoldings returns holdings for replica indexes below replicas, each
// replica's LRU taking up to memory bytes (at least 64 entries).
func NewHoldings(replicas int, memory int64) *Holdings {
	return &Holdings{entries: max(int(memory/HoldingEntryBytes), 64), replicas: make([]holding, replicas)}
}

// A held link's value: the tick that last touched it above, the bytes it
// adds below (saturated).
const spanBits = 16

func span(v uint64) int64 { return int64(v & (1<<spanBits - 1)) }

// Longest returns the bytes of blocks' longest prefix that replica r holds
// (the Bytes of its last held link) and how many of blocks that is. It
// does not make what it finds more recently used: being asked is not
// being used.
func (h *Holdings) Longest(r int, blocks []Link) (int64, int) {
	b, n, _ := h.Recall(r, blocks)
	return b, n
}

// Recall is Longest, and the stamp of the last held link: the oldest of
// the prefix held, since a link is never more recent than those before it.
// Forget takes it.
func (h *Holdings) Recall(r int, blocks []Link) (bytes int64, n int, stamp uint64) {
	if len(blocks) == 0 {
		return 0, 0, 0
	}
	o := &h.replicas[r]
	o.mu.Lock()
	if o.s != nil {
		if n = o.s.heldPrefix(blocks); n > 0 {
			_, e := o.s.find(blocks[n-1].Hash)
			stamp = o.s.vals[e] >> spanBits
		}
	}
	o.mu.Unlock()
	if n == 0 {
		return 0, 0, 0
	}
	return int64(blocks[n-1].Bytes()), n, stamp
}

// heldPrefix counts the links of blocks that s holds from the first on,
// by binary search: held is monotone along a prompt (prefix-closed).
func (s *shard[V]) heldPrefix(blocks []Link) int {
	lo, hi := 0, len(blocks) // blocks[:lo] held; blocks[hi:] not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.holds(blocks[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// holds reports whether s holds l, without touching it or counting it.
func (s *shard[V]) holds(l Link) bool {
	_, e := s.find(l.Hash)
	return e >= 0 && s.checks[e] == l.Check
}

// Insert records that replica r holds blocks: it was sent a prompt, whose
// prefill a later request there finds done. Then it evicts the least
// recently used links until the bytes it holds are within limit (0 for no
// bound but the entries). It returns the stamp it gave the links, 0 for
// no blocks.
func (h *Holdings) Insert(r int, blocks []Link, limit int64) uint64 {
	if len(blocks) == 0 {
		return 0
	}
	o := &h.replicas[r]
	o.mu.Lock()
	if o.s == nil {
		o.s = newShard[uint64](h.entries)
	}
	s := o.s
	o.clock++
	stamp := o.clock << spanBits
	for i := len(blocks) - 1; i >= 0; i-- {
		l := blocks[i]
		sp := l.Bytes()
		if i > 0 {
			sp -= blocks[i-1].Bytes()
		}
		sp = min(sp, 1<<spanBits-1)
		if _, e := s.find(l.Hash); e >= 0 {
			if s.checks[e] == l.Check {
				s.vals[e] = stamp | sp
				s.touch(e)
				continue
			}
			// A collision: the prefix of this prompt replaces the other.
			o.bytes -= span(s.vals[e])
			s.drop(e)
		}
		if int(s.n) == len(s.keys) {
			o.evictTail()
		}
		s.put(l.Hash, l.Check, stamp|sp)
		o.bytes += int64(sp)
	}
	for limit > 0 && o.bytes > limit && s.n > 1 {
		o.evictTail()
	}
	o.held.Store(o.bytes)
	tick := o.clock
	o.mu.Unlock()
	return tick
}

// Withdraw takes back the links of blocks that still have the stamp an
// Insert gave them: a prompt that the replica was sent and did not take.
// Give it the links past those the replica held before, so that what it
// holds stays prefix-closed.
func (h *Holdings) Withdraw(r int, blocks []Link, stamp uint64) {
	o := &h.replicas[r]
	o.mu.Lock()
	if s := o.s; s != nil {
		for _, l := range blocks {
			if _, e := s.find(l.Hash); e >= 0 && s.checks[e] == l.Check && s.vals[e]>>spanBits == stamp {
				o.bytes -= span(s.vals[e])
				s.drop(e)
			}
		}
	}
	o.held.Store(o.bytes)
	o.mu.Unlock()
}

// evictTail evicts the replica's least recently used link.
func (o *holding) evictTail() {
	s := o.s
	e := s.tail
	o.bytes -= span(s.vals[e])
	o.evictions++
	s.drop(e)
}

// Forget corrects the belief in replica r by what it reported: it had lost
// a link that it was believed to hold, whose stamp (Recall) was at least
// before. An engine evicts its least recently used blocks first, so it
// lost every link used less recently too: those go, and what was touched
// since stays, the prompt that found the loss among it. It returns the
// links forgotten.
func (h *Holdings) Forget(r int, before uint64) int {
	o := &h.replicas[r]
	o.mu.Lock()
	defer o.mu.Unlock()
	s, n := o.s, 0
	for s != nil && s.n > 0 && s.vals[s.tail]>>spanBits < before {
		o.bytes -= span(s.vals[s.tail])
		o.dropped++
		s.drop(s.tail)
		n++
	}
	o.held.Store(o.bytes)
	return n
}

// DropReplica forgets all that replica r holds: it left the set, and one
// that later takes its index holds nothing yet. Its memory is kept.
func (h *Holdings) DropReplica(r int) {
	o := &h.replicas[r]
	o.mu.Lock()
	if s := o.s; s != nil {
		for s.n > 0 {
			s.drop(s.tail)
		}
	}
	o.bytes = 0
	o.held.Store(0)
	o.mu.Unlock()
}

// Held returns the bytes of prompt that replica r is believed to hold.
func (h *Holdings) Held(r int) int64 { return h.replicas[r].held.Load() }

// HoldingStats is a snapshot of one replica's holdings.
type HoldingStats struct {
	Bytes     int64  `json:"bytes"`
	Links     int    `json:"links"`
	Capacity  int    `json:"capacity_links"`
	Evictions uint64 `json:"evicted_links"`
	Dropped   uint64 `json:"forgotten_links"`
}

// Stats returns replica r's holdings: for scrapes, not the request path.
func (h *Holdings) Stats(r int) HoldingStats {
	o := &h.replicas[r]
	o.mu.Lock()
	defer o.mu.Unlock()
	st := HoldingStats{Bytes: o.bytes, Evictions: o.evictions, Dropped: o.dropped, Capacity: h.entries}
	if o.s != nil {
		st.Links = int(o.s.n)
	}
	return st
}
