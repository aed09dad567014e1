package prefixcache

import (
	"math/rand"
	"testing"
)

func TestShardMatchesAModelLRU(t *testing.T) {
	const capacity = 50
	s := newShard[uint16](capacity)
	type entry struct {
		key uint64
		val uint16
	}
	var model []entry // most recent first
	rng := rand.New(rand.NewSource(1))
	modelFind := func(key uint64) int {
		for i, e := range model {
			if e.key == key {
				return i
			}
		}
		return -1
	}
	for op := 0; op < 20000; op++ {
		// A small key space with shared low bits forces probe chains
		// and backward shifts.
		key := uint64(rng.Intn(120)) << 3
		if rng.Intn(2) == 0 {
			val := uint16(rng.Intn(8))
			s.put(key, key^7, val)
			if i := modelFind(key); i >= 0 {
				model = append(model[:i], model[i+1:]...)
			} else if len(model) == capacity {
				model = model[:capacity-1]
			}
			model = append([]entry{{key, val}}, model...)
		} else {
			got, ok := s.get(key, key^7)
			i := modelFind(key)
			if ok != (i >= 0) {
				t.Fatalf("op %d: get(%d) ok=%v, model has it: %v", op, key, ok, i >= 0)
			}
			if ok {
				if got != model[i].val {
					t.Fatalf("op %d: get(%d)=%d, want %d", op, key, got, model[i].val)
				}
				e := model[i]
				model = append(model[:i], model[i+1:]...)
				model = append([]entry{e}, model...)
			}
		}
		if int(s.n) != len(model) {
			t.Fatalf("op %d: size %d, model %d", op, s.n, len(model))
		}
	}
}

func TestPinMap(t *testing.T) {
	m := NewPinMap(shardCount*2, 3)
	l := Link{Hash: 0xabc, Check: 1}
	if _, ok := m.Get(l); ok {
		t.Fatal("empty map has a pin")
	}
	m.Put(l, 2)
	if r, ok := m.Get(l); !ok || r != 2 {
		t.Fatalf("Get = %d %v, want 2 true", r, ok)
	}
	m.Put(l, 1)
	if m.Pins(2) != 0 || m.Pins(1) != 1 {
		t.Fatalf("pins per replica = %d %d, want 0 1", m.Pins(2), m.Pins(1))
	}
	if _, ok := m.Get(Link{Hash: 0xabc, Check: 9}); ok {
		t.Fatal("a link with another check must miss")
	}
	st := m.Stats()
	if st.Collisions != 1 || st.Hits != 1 || st.Misses != 2 || st.Size != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// Fill one shard past its capacity: the oldest entries go.
	for i := uint64(0); i < 3; i++ {
		m.Put(Link{Hash: 5<<58 | i, Check: i}, 0)
	}
	if _, ok := m.Get(Link{Hash: 5 << 58, Check: 0}); ok {
		t.Fatal("the least recently used entry was not evicted")
	}
	if st := m.Stats(); st.Evictions != 1 {
		t.Fatalf("evictions = %d, want 1", st.Evictions)
	}
	if m.Pins(0) != 2 {
		t.Fatalf("pins(0) = %d after eviction, want 2", m.Pins(0))
	}
}

// Dropping a replica's pins leaves no pin to it and every other pin in
// place, and the map goes on working (puts, gets) afterwards, checked
// against a plain map model.
func TestDropReplica(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	m := NewPinMap(shardCount*256, 4) // room for every key: no eviction hides a lost pin
	model := map[uint64]int{}
	link := func(k uint64) Link { return Link{Hash: k, Check: k * 31} }
	for round := 0; round < 20; round++ {
		for i := 0; i < 300; i++ {
			k := rng.Uint64()>>8 | uint64(rng.Intn(shardCount))<<58
			r := rng.Intn(4)
			m.Put(link(k), r)
			model[k] = r
		}
		gone := rng.Intn(4)
		m.DropReplica(gone)
		if n := m.Pins(gone); n != 0 {
			t.Fatalf("round %d: %d pins left to the dropped replica", round, n)
		}
		var sum int64
		for r := 0; r < 4; r++ {
			sum += m.Pins(r)
		}
		if st := m.Stats(); int64(st.Size) != sum {
			t.Fatalf("round %d: size %d, pins counted %d", round, st.Size, sum)
		}
		for k, r := range model {
			got, ok := m.Get(link(k))
			switch {
			case r == gone && ok:
				t.Fatalf("round %d: a pin to the dropped replica survived", round)
			case r != gone && (!ok || got != r):
				t.Fatalf("round %d: a pin to %d was lost or moved (%d %v)", round, r, got, ok)
			}
			if r == gone {
				delete(model, k)
			}
		}
	}
}

// After drops, a full map still evicts least recently used first.
func TestDropReplicaThenEvict(t *testing.T) {
	m := NewPinMap(shardCount*4, 2)
	for i := uint64(0); i < 4; i++ { // shard 0, four entries: full
		m.Put(Link{Hash: i, Check: i}, int(i%2))
	}
	m.DropReplica(1) // entries 1 and 3 go
	for i := uint64(4); i < 6; i++ {
		m.Put(Link{Hash: i, Check: i}, 0)
	}
	m.Put(Link{Hash: 6, Check: 6}, 0) // full again: the oldest, entry 0, goes
	for i, want := range map[uint64]bool{0: false, 1: false, 2: true, 3: false, 4: true, 5: true, 6: true} {
		if _, ok := m.Get(Link{Hash: i, Check: i}); ok != want {
			t.Errorf("entry %d present %v, want %v", i, ok, want)
		}
	}
}
