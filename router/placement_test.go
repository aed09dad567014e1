package router

import (
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// instance is one warmroute's view of a fleet: the same replicas under the
// slots it happened to give them, with its own pins, counter and loads.
type instance struct {
	pins    *prefixcache.PinMap
	counter atomic.Uint64
	loads   Loads
	slotOf  map[string]int
	names   []string
}

func newInstance(names []string, order []int) *instance {
	in := &instance{pins: prefixcache.NewPinMap(4096, upstream.MaxReplicas), slotOf: map[string]int{}}
	in.names = make([]string, len(names))
	for slot, i := range order {
		in.slotOf[names[i]] = slot
		in.names[slot] = names[i]
		in.loads[slot].ID = xxhash.Sum64String(names[i])
	}
	return in
}

func (in *instance) choose(p Policy, chain []prefixcache.Link) string {
	req := Request{Chain: chain, Avail: upstream.Mask{1<<len(in.names) - 1}, Size: ChainSize(chain, 0), Load: &in.loads, Rendezvous: true}
	d := Choose(p, req, in.pins, &in.counter)
	return in.names[d.Replica]
}

// Two instances that number the replicas differently place every fresh
// conversation on the same replica, by name, under adaptive and cost.
func TestRendezvousAgreesAcrossInstances(t *testing.T) {
	names := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}
	a := newInstance(names, []int{0, 1, 2, 3})
	b := newInstance(names, []int{3, 1, 0, 2})
	seen := map[string]int{}
	for _, p := range []Policy{Adaptive, Cost} {
		for c := 0; c < 200; c++ {
			chain := sized(c, 2, 0, 1000)
			ra, rb := a.choose(p, chain), b.choose(p, chain)
			if ra != rb {
				t.Fatalf("%s: conversation %d placed on %s by one instance and %s by the other", p, c, ra, rb)
			}
			seen[ra]++
		}
	}
	for _, n := range names {
		if seen[n] < 40 {
			t.Errorf("rendezvous placed %d of 400 conversations on %s: %v", seen[n], n, seen)
		}
	}
}

// A burst that shares its first message is spread within one request of
// even by the load bound, however many arrive.
func TestRendezvousBurstSpreads(t *testing.T) {
	names := []string{"a:1", "b:1", "c:1"}
	for _, p := range []Policy{Adaptive, Cost} {
		in := newInstance(names, []int{0, 1, 2})
		for i := 0; i < 31; i++ {
			chain := sized(i, 2, 1, 1000) // all share message 0
			r := in.slotOf[in.choose(p, chain)]
			in.loads[r].InFlight++ // the request is in flight as the next arrives
			if p == Cost {
				in.loads[r].Queued += 2000
			}
			lo, hi := in.loads[0].InFlight, in.loads[0].InFlight
			for _, l := range in.loads[:3] {
				lo, hi = min(lo, l.InFlight), max(hi, l.InFlight)
			}
			if hi-lo > 1 {
				t.Fatalf("%s: after %d requests the replicas hold %d..%d", p, i+1, lo, hi)
			}
		}
	}
}

// A replica that leaves moves only the conversations that it held: the
// others keep their placement (the property that makes rendezvous hashing
// fit a fleet whose replicas come and go).
func TestRendezvousMovesOnlyTheLeaversConversations(t *testing.T) {
	names := []string{"a:1", "b:1", "c:1", "d:1"}
	in := newInstance(names, []int{0, 1, 2, 3})
	before := map[int]string{}
	for c := 0; c < 300; c++ {
		before[c] = in.choose(Adaptive, sized(c, 2, 0, 100))
	}
	req := func(chain []prefixcache.Link) string {
		r := Request{Chain: chain, Avail: upstream.Mask{0b1011}, Load: &in.loads, Rendezvous: true} // c:1 left
		return in.names[Choose(Adaptive, r, in.pins, &in.counter).Replica]
	}
	moved := 0
	for c := 0; c < 300; c++ {
		now := req(sized(c, 2, 0, 100))
		switch {
		case before[c] == "c:1":
			moved++
		case now != before[c]:
			t.Fatalf("conversation %d moved from %s to %s although its replica stayed", c, before[c], now)
		}
	}
	if moved == 0 {
		t.Fatal("no conversation was on the replica that left")
	}
}
