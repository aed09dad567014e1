package prefixcache

import (
	"sync"
	"sync/atomic"
)

// shardCount is a power of two: enough shards that 2-16 cores rarely meet on
// one mutex, few enough that a small capacity still gives each shard room.
const shardCount = 64

// EntryBytes is the memory one pin map entry takes, for flag help and sizing.
const EntryBytes = entryBytes

// PinMap maps a prefix hash to the replica that served that prefix. It is an
// LRU of fixed capacity split into shards with a mutex each; every method is
// safe for concurrent use and allocates nothing.
type PinMap struct {
	shards [shardCount]struct {
		mu sync.Mutex
		s  *shard[uint16]
		_  [40]byte // keep neighbouring mutexes off one cache line
	}
	// perReplica counts the entries pinned to each replica, for /replicas.
	perReplica []atomic.Int64
}

// NewPinMap returns a pin map holding up to capacity entries (at least one
// per shard) for replica indexes below replicas.
func NewPinMap(capacity, replicas int) *PinMap {
	m := &PinMap{perReplica: make([]atomic.Int64, replicas)}
	per := (capacity + shardCount - 1) / shardCount
	for i := range m.shards {
		m.shards[i].s = newShard[uint16](per)
	}
	return m
}

func (m *PinMap) shard(key uint64) int { return int(key >> 58) } // top 6 bits: 64 shards

// Get returns the replica pinned to l, if any.
func (m *PinMap) Get(l Link) (int, bool) {
	sh := &m.shards[m.shard(l.Hash)]
	sh.mu.Lock()
	v, ok := sh.s.get(l.Hash, l.Check)
	sh.mu.Unlock()
	return int(v), ok
}

// Put pins l to replica, replacing an older pin of the same prefix.
func (m *PinMap) Put(l Link, replica int) {
	sh := &m.shards[m.shard(l.Hash)]
	sh.mu.Lock()
	old, displaced := sh.s.put(l.Hash, l.Check, uint16(replica))
	sh.mu.Unlock()
	if displaced {
		m.perReplica[old].Add(-1)
	}
	m.perReplica[replica].Add(1)
}

// Stats is a snapshot of the pin map's counters since construction.
type Stats struct {
	Size, Capacity                      int
	Hits, Misses, Evictions, Collisions uint64
}

// Stats sums the shards' counters. It takes each shard's lock in turn, so it
// is for scrapes, not for the request path.
func (m *PinMap) Stats() Stats {
	var st Stats
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		st.Size += int(sh.s.n)
		st.Capacity += len(sh.s.keys)
		st.Hits += sh.s.hits
		st.Misses += sh.s.misses
		st.Evictions += sh.s.evictions
		st.Collisions += sh.s.collisions
		sh.mu.Unlock()
	}
	return st
}

// DropReplica deletes every pin to replica: it left the set, and a replica
// that later takes its index must not inherit its conversations. It takes
// each shard's lock in turn and walks its entries: for a change of the
// replica set, not for the request path.
func (m *PinMap) DropReplica(replica int) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n := sh.s.dropVal(uint16(replica))
		sh.mu.Unlock()
		m.perReplica[replica].Add(-int64(n))
	}
}

// Pins returns how many entries are pinned to replica.
func (m *PinMap) Pins(replica int) int64 { return m.perReplica[replica].Load() }
