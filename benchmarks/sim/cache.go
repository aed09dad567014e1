package sim

// blockCache is an LRU of KV blocks keyed by the chained hash of the prompt
// up to and including the block, as vLLM's automatic prefix caching keys
// them. It is not safe for concurrent use; the engine holds its lock.
type blockCache struct {
	capacity int // blocks
	entries  map[uint64]*block
	head     *block // most recently used
	tail     *block
}

type block struct {
	key        uint64
	prev, next *block
}

func newBlockCache(capacity int) *blockCache {
	return &blockCache{capacity: max(capacity, 1), entries: make(map[uint64]*block)}
}

// prefix returns how many leading blocks of keys are cached, and marks them
// used, the last one first: a request's first block is its most recently
// used, so that its tail is evicted before its head, as vLLM frees a
// request's blocks tail first and SGLang evicts its radix tree's leaves.
// Evicting the head first would lose the whole prefix to one eviction.
func (c *blockCache) prefix(keys []uint64) int {
	n := 0
	for n < len(keys) && c.entries[keys[n]] != nil {
		n++
	}
	for i := n - 1; i >= 0; i-- {
		c.moveFront(c.entries[keys[i]])
	}
	return n
}

// insert caches keys, evicting the least recently used blocks past
// capacity; like prefix, it leaves the first key the most recently used.
func (c *blockCache) insert(keys []uint64) (evicted int) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if b, ok := c.entries[k]; ok {
			c.moveFront(b)
			continue
		}
		b := &block{key: k}
		c.entries[k] = b
		c.pushFront(b)
		if len(c.entries) > c.capacity {
			old := c.tail
			c.unlink(old)
			delete(c.entries, old.key)
			evicted++
		}
	}
	return evicted
}

func (c *blockCache) len() int { return len(c.entries) }

func (c *blockCache) moveFront(b *block) {
	if c.head == b {
		return
	}
	c.unlink(b)
	c.pushFront(b)
}

func (c *blockCache) unlink(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

func (c *blockCache) pushFront(b *block) {
	b.next = c.head
	if c.head != nil {
		c.head.prev = b
	}
	c.head = b
	if c.tail == nil {
		c.tail = b
	}
}
