package router

import (
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// conv builds chains for conversations: conv(c, n) is conversation c's first
// n messages, where conversations share nothing.
func conv(c, n int) []prefixcache.Link {
	chain := make([]prefixcache.Link, n)
	for i := range chain {
		chain[i] = prefixcache.Link{Hash: uint64(c)*0xC2B2AE3D27D4EB4F ^ uint64(i+1)*0x9E3779B97F4A7C15, Check: uint64(i)}
	}
	return chain
}

func TestPickSequences(t *testing.T) {
	const all = 0b111
	// Where conversation 5 hashes to, with all three and without that one.
	burst := int(conv(5, 1)[0].Hash % 3)
	burstElsewhere := []int{1, 0, 0}[burst]
	if conv(5, 1)[0].Hash%2 == 1 {
		burstElsewhere = []int{2, 2, 1}[burst]
	}
	type step struct {
		chain  []prefixcache.Link
		avail  uint64
		want   int
		reason Reason
		serve  bool // pin the full chain to the pick, as a 2xx does
	}
	tests := []struct {
		name   string
		policy Policy
		steps  []step
	}{
		{"adaptive spreads fresh requests", Adaptive, []step{
			{conv(1, 1), all, 0, Spread, true},
			{conv(2, 1), all, 1, Spread, true},
			{conv(3, 1), all, 2, Spread, true},
			{nil, all, 0, Spread, false}, // not a chat request
			{conv(4, 1), all, 1, Spread, true},
		}},
		{"adaptive pins continuations", Adaptive, []step{
			{conv(1, 2), all, 0, Spread, true}, // two messages, no pin yet: spread
			{conv(2, 2), all, 1, Spread, true},
			{conv(2, 4), all, 1, Pinned, true}, // turn 2 of conversation 2
			{conv(1, 4), all, 0, Pinned, true},
			{conv(1, 7), all, 0, Pinned, true}, // three messages appended
			{conv(3, 4), all, 2, Spread, true}, // unknown conversation
		}},
		{"adaptive does not pin a single message", Adaptive, []step{
			{conv(1, 1), all, 0, Spread, true},
			{conv(1, 1), all, 1, Spread, true}, // the same fresh prompt spreads
		}},
		{"pinned replica down is repinned", Adaptive, []step{
			{conv(1, 2), all, 0, Spread, true},
			{conv(1, 4), 0b110, 2, Repinned, true},
			{conv(1, 6), all, 2, Pinned, true}, // follows the new pin
		}},
		{"down replicas are skipped by the counter", RoundRobin, []step{
			{conv(1, 1), 0b101, 0, Spread, false},
			{conv(1, 1), 0b101, 2, Spread, false},
			{conv(1, 1), 0b100, 2, Spread, false},
		}},
		{"roundrobin ignores pins", RoundRobin, []step{
			{conv(1, 2), all, 0, Spread, true},
			{conv(1, 4), all, 1, Spread, true},
			{conv(1, 6), all, 2, Spread, true},
		}},
		{"affinity sends a same-prefix burst to one replica", Affinity, []step{
			{conv(5, 1), all, burst, Hashed, true},
			{conv(5, 1), all, burst, Pinned, true},
			{conv(5, 3), all, burst, Pinned, true},
			{conv(5, 1), all &^ (1 << burst), burstElsewhere, Repinned, true},
		}},
		{"nothing available", Adaptive, []step{
			{conv(1, 2), 0, -1, NoReplica, false},
		}},
	}
	for _, tt := range tests {
		pins := prefixcache.NewPinMap(1024, 3)
		var counter atomic.Uint64
		for i, s := range tt.steps {
			got, reason := Pick(tt.policy, Request{Chain: s.chain, Avail: upstream.Mask{s.avail}}, pins, &counter)
			if got != s.want || reason != s.reason {
				t.Fatalf("%s: step %d: Pick = %d %v, want %d %v", tt.name, i, got, reason, s.want, s.reason)
			}
			if s.serve && len(s.chain) > 0 {
				pins.Put(s.chain[len(s.chain)-1], got)
			}
		}
	}
}

func TestLookbackIsBounded(t *testing.T) {
	pins := prefixcache.NewPinMap(1024, 2)
	var counter atomic.Uint64
	counter.Store(1) // the next spread picks replica 1
	long := conv(9, MaxLookback+3)
	pins.Put(long[0], 0)
	if r, reason := Pick(Adaptive, Request{Chain: long, Avail: upstream.Mask{0b11}}, pins, &counter); r != 1 || reason != Spread {
		t.Fatalf("a pin deeper than MaxLookback was used: %d %v", r, reason)
	}
	near := conv(9, MaxLookback+1)
	if r, reason := Pick(Adaptive, Request{Chain: near, Avail: upstream.Mask{0b11}}, pins, &counter); r != 0 || reason != Pinned {
		t.Fatalf("a pin within MaxLookback was missed: %d %v", r, reason)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, tt := range []struct {
		name string
		want Policy
	}{{"cost", Cost}, {"adaptive", Adaptive}, {"affinity", Affinity}, {"roundrobin", RoundRobin}} {
		if p, err := ParsePolicy(tt.name); err != nil || p != tt.want {
			t.Errorf("ParsePolicy(%q) = %v, %v", tt.name, p, err)
		}
	}
	// The peers' policies live in the benchmarks: not a -routing value.
	for _, name := range []string{"random", "sglang", "least", "llmd", "p2c", ""} {
		_, err := ParsePolicy(name)
		if want := `unknown routing policy "` + name + `"; valid: cost, adaptive, affinity, roundrobin`; err == nil || err.Error() != want {
			t.Errorf("ParsePolicy(%q) error = %v, want %s", name, err, want)
		}
	}
	if Default != Policies[0] || Default != Cost {
		t.Errorf("the default is %v, Policies lists %v first", Default, Policies[0])
	}
}

// Spreading reaches replicas in every word of the mask: with slots past 64
// live, fresh requests go round all of them.
func TestSpreadBeyondSixtyFour(t *testing.T) {
	var avail upstream.Mask
	slots := []int{3, 64, 130, 255}
	for _, i := range slots {
		avail.Add(i)
	}
	pins := prefixcache.NewPinMap(64, upstream.MaxReplicas)
	var counter atomic.Uint64
	for round := 0; round < 2; round++ {
		for _, want := range slots {
			if r, reason := Pick(Adaptive, Request{Avail: avail}, pins, &counter); r != want || reason != Spread {
				t.Fatalf("round %d: picked %d (%v), want %d", round, r, reason, want)
			}
		}
	}
	// A continuation pinned to slot 200 stays there.
	chain, _ := appendChain(nil, []byte(`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`))
	pins.Put(chain[1], 200)
	avail.Add(200)
	if r, reason := Pick(Adaptive, Request{Chain: chain, Avail: avail}, pins, &counter); r != 200 || reason != Pinned {
		t.Fatalf("pinned to 200: picked %d (%v)", r, reason)
	}
}

// A session outranks prefix pins, moves when its replica is not available,
// and round-robin ignores it.
func TestSessionPolicy(t *testing.T) {
	pins := prefixcache.NewPinMap(1024, upstream.MaxReplicas)
	var counter atomic.Uint64
	chain, _ := appendChain(nil, []byte(`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`))
	pins.Put(chain[1], 0) // the prefix says replica 0
	s := SessionKey([]byte("sess-1"))
	req := Request{Chain: chain, Avail: upstream.Mask{0b111}, Session: s}
	if r, reason := Pick(Adaptive, req, pins, &counter); r != 0 || reason != Pinned {
		t.Fatalf("a new session follows the prefix: %d %v", r, reason)
	}
	Served(Adaptive, Request{Session: s}, 2, 200, pins) // it was served by 2
	for _, p := range []Policy{Adaptive, Affinity} {
		if r, reason := Pick(p, req, pins, &counter); r != 2 || reason != Session {
			t.Fatalf("%v: the session's replica wins over the prefix: %d %v", p, r, reason)
		}
	}
	if r, reason := Pick(RoundRobin, req, pins, &counter); reason != Spread {
		t.Fatalf("round-robin followed a session: %d %v", r, reason)
	}
	req.Avail = upstream.Mask{0b011}
	if r, reason := Pick(Adaptive, req, pins, &counter); r == 2 || reason != Repinned {
		t.Fatalf("a session whose replica is down: %d %v", r, reason)
	}
	if SessionKey([]byte("sess-1")) == SessionKey([]byte("sess-2")) || SessionKey(nil) == 0 {
		t.Fatal("session keys")
	}
}

// A config that names no policy gets the default, in the pick and in what
// Served records alike.
func TestNoPolicyIsTheDefault(t *testing.T) {
	if p := (&Handler{}).policy(); p != Default {
		t.Errorf("a config without a policy picks with %v, want %v", p, Default)
	}
	if p := (&Handler{cfg: Config{Policy: RoundRobin}}).policy(); p != RoundRobin {
		t.Errorf("a config naming roundrobin picks with %v", p)
	}
}
