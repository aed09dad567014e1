package prefixcache

// shard is one LRU of fixed capacity, without locks: PinMap wraps each shard
// in a mutex, Holdings each replica's. Entries live in parallel arrays
// indexed by int32, found through an open-addressing table with linear
// probing, so that nothing is allocated after construction and the garbage
// collector has no pointers to scan. A pin's value is a replica index; a
// held link's, its stamp and span (holdings.go).
type shard[V uint16 | uint64] struct {
	keys   []uint64
	checks []uint64
	vals   []V
	prev   []int32
	next   []int32
	table  []int32 // entry index + 1; 0 is an empty slot
	mask   uint64
	head   int32 // most recently used, -1 when empty
	tail   int32 // least recently used
	n      int32

	hits, misses, evictions, collisions uint64
}

// entryBytes is the memory of one pin map entry: key, check, value, two
// list links and two table slots (the table is kept at most half full);
// a held link's value takes six bytes more.
const entryBytes = 8 + 8 + 2 + 4 + 4 + 2*4

func newShard[V uint16 | uint64](capacity int) *shard[V] {
	if capacity < 1 {
		capacity = 1
	}
	size := 1
	for size < 2*capacity {
		size <<= 1
	}
	return &shard[V]{
		keys:   make([]uint64, capacity),
		checks: make([]uint64, capacity),
		vals:   make([]V, capacity),
		prev:   make([]int32, capacity),
		next:   make([]int32, capacity),
		table:  make([]int32, size),
		mask:   uint64(size - 1),
		head:   -1,
		tail:   -1,
	}
}

// home is the first table slot for key. The shard index uses the key's top
// bits, so the table uses the bottom ones.
func (s *shard[V]) home(key uint64) uint64 { return key & s.mask }

// find returns the table slot and entry index of key, or -1 for the entry.
func (s *shard[V]) find(key uint64) (uint64, int32) {
	for i := s.home(key); ; i = (i + 1) & s.mask {
		e := s.table[i] - 1
		if e < 0 {
			return i, -1
		}
		if s.keys[e] == key {
			return i, e
		}
	}
}

// get returns the value stored for key. A key whose check differs is a hash
// collision between two different prefixes: it is counted and reported as a
// miss.
func (s *shard[V]) get(key, check uint64) (V, bool) {
	_, e := s.find(key)
	if e < 0 {
		s.misses++
		return 0, false
	}
	if s.checks[e] != check {
		s.collisions++
		s.misses++
		return 0, false
	}
	s.hits++
	s.touch(e)
	return s.vals[e], true
}

// put stores val for key and reports the value it displaced, if any: the
// key's old value, or the value of the least recently used entry that was
// evicted to make room.
func (s *shard[V]) put(key, check uint64, val V) (old V, displaced bool) {
	slot, e := s.find(key)
	if e >= 0 {
		old = s.vals[e]
		s.checks[e] = check
		s.vals[e] = val
		s.touch(e)
		return old, true
	}
	if int(s.n) == len(s.keys) {
		e = s.tail
		old, displaced = s.vals[e], true
		s.evictions++
		s.unlink(e)
		s.remove(s.keys[e])
		slot, _ = s.find(key) // the removal may have shifted slots
	} else {
		e = s.n
		s.n++
	}
	s.keys[e], s.checks[e], s.vals[e] = key, check, val
	s.table[slot] = e + 1
	s.pushFront(e)
	return old, displaced
}

// remove deletes key from the table with backward-shift deletion, which keeps
// every probe sequence unbroken without tombstones.
func (s *shard[V]) remove(key uint64) {
	i, e := s.find(key)
	if e < 0 {
		return
	}
	j := i
	for {
		j = (j + 1) & s.mask
		if s.table[j] == 0 {
			break
		}
		k := s.home(s.keys[s.table[j]-1])
		// The entry at j may move back to i only if its home is not
		// cyclically within (i, j].
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		s.table[i] = s.table[j]
		i = j
	}
	s.table[i] = 0
}

func (s *shard[V]) touch(e int32) {
	if s.head == e {
		return
	}
	s.unlink(e)
	s.pushFront(e)
}

func (s *shard[V]) unlink(e int32) {
	p, n := s.prev[e], s.next[e]
	if p >= 0 {
		s.next[p] = n
	} else {
		s.head = n
	}
	if n >= 0 {
		s.prev[n] = p
	} else {
		s.tail = p
	}
}

func (s *shard[V]) pushFront(e int32) {
	s.prev[e] = -1
	s.next[e] = s.head
	if s.head >= 0 {
		s.prev[s.head] = e
	}
	s.head = e
	if s.tail < 0 {
		s.tail = e
	}
}

// dropVal deletes every entry whose value is val: the pins of a replica
// that left. It walks the entries from the last, so that the entry moved
// into a freed place has been looked at already.
func (s *shard[V]) dropVal(val V) int {
	dropped := 0
	for e := s.n - 1; e >= 0; e-- {
		if s.vals[e] == val {
			s.drop(e)
			dropped++
		}
	}
	return dropped
}

// drop deletes entry e and moves the last entry into its place, so that
// entries stay dense.
func (s *shard[V]) drop(e int32) {
	s.unlink(e)
	s.remove(s.keys[e])
	last := s.n - 1
	if e != last {
		slot, _ := s.find(s.keys[last])
		s.keys[e], s.checks[e], s.vals[e] = s.keys[last], s.checks[last], s.vals[last]
		s.prev[e], s.next[e] = s.prev[last], s.next[last]
		if p := s.prev[e]; p >= 0 {
			s.next[p] = e
		} else {
			s.head = e
		}
		if n := s.next[e]; n >= 0 {
			s.prev[n] = e
		} else {
			s.tail = e
		}
		s.table[slot] = e + 1
	}
	s.n--
}
