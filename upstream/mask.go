package upstream

import "math/bits"

// Mask is a set of replica slots, one bit each: the live replicas, those
// that serve a model, those a request has tried. It is a value of a few
// words, copied and combined on the request path without allocating.
type Mask [MaxReplicas / 64]uint64

// Add puts slot i in m.
func (m *Mask) Add(i int) { m[i>>6] |= 1 << uint(i&63) }

// Has reports whether slot i is in m.
func (m Mask) Has(i int) bool { return m[i>>6]&(1<<uint(i&63)) != 0 }

// And returns the slots in both m and o.
func (m Mask) And(o Mask) Mask {
	for i := range m {
		m[i] &= o[i]
	}
	return m
}

// AndNot returns the slots in m and not in o.
func (m Mask) AndNot(o Mask) Mask {
	for i := range m {
		m[i] &^= o[i]
	}
	return m
}

// Or returns the slots in m or in o.
func (m Mask) Or(o Mask) Mask {
	for i := range m {
		m[i] |= o[i]
	}
	return m
}

// Empty reports whether m holds no slot.
func (m Mask) Empty() bool {
	for _, w := range m {
		if w != 0 {
			return false
		}
	}
	return true
}

// Len returns how many slots m holds.
func (m Mask) Len() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// Nth returns the slot that is (k mod Len)-th in m, counting up, or -1 for
// an empty mask.
func (m Mask) Nth(k uint64) int {
	n := m.Len()
	if n == 0 {
		return -1
	}
	k %= uint64(n)
	for i, w := range m {
		c := uint64(bits.OnesCount64(w))
		if k >= c {
			k -= c
			continue
		}
		for ; k > 0; k-- {
			w &= w - 1
		}
		return i*64 + bits.TrailingZeros64(w)
	}
	return -1
}

// Each calls f for every slot in m, in order.
func (m Mask) Each(f func(i int)) {
	for j, w := range m {
		for ; w != 0; w &= w - 1 {
			f(j*64 + bits.TrailingZeros64(w))
		}
	}
}
