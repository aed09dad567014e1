package benchmarks

import (
	"container/list"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// The peers' routers read the prompt's text, not its messages: SGLang's
// router matches characters in a radix tree, llm-d's scheduler hashes the
// prompt in blocks of 64 characters. A peerRouter runs their rules as
// they run, in a router of their own in front of the replicas: it hashes
// a request's rendered text every chunkBytes, asks the rule (a
// router.Policy over that chain) for a replica, and counts the request
// on it, waiting until its first token and in flight until its end.
const chunkBytes = 64

// chatText is the text a router reads of a chat request: each message's
// role and content in order, as a ChatML template lays them out.
func chatText(msgs []workload.Message) []byte {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 24
	}
	b := make([]byte, 0, n)
	for _, m := range msgs {
		b = append(b, "<|im_start|>"...)
		b = append(b, m.Role...)
		b = append(b, '\n')
		b = append(b, m.Content...)
		b = append(b, "<|im_end|>\n"...)
	}
	return b
}

// chunkChain links text every chunk bytes: link i covers the first
// (i+1)*chunk bytes, its hash chained over them. A last part shorter than
// chunk gets no link.
func chunkChain(text []byte, chunk int) []prefixcache.Link {
	n := len(text) / chunk
	chain := make([]prefixcache.Link, n)
	var d xxhash.Digest
	var prev [8]byte
	for i := range chain {
		d.Reset()
		d.Write(prev[:])
		d.Write(text[i*chunk : (i+1)*chunk])
		h := d.Sum64()
		for j := range prev {
			prev[j] = byte(h >> (8 * j))
		}
		chain[i] = prefixcache.Link{Hash: h, Check: uint64(i+1)<<40 | uint64((i+1)*chunk)}
	}
	return chain
}

// peerRouter routes requests by a peer's rule over their text's chunks.
type peerRouter struct {
	policy  router.Policy
	avail   upstream.Mask
	counter atomic.Uint64
	mu      sync.Mutex
	loads   router.Loads
}

func newPeerRouter(p router.Policy, replicas int) *peerRouter {
	pr := &peerRouter{policy: p}
	for r := 0; r < replicas; r++ {
		pr.avail.Add(r)
	}
	return pr
}

// route picks the replica for text and counts the request on it: first
// is to be called at its first token, done at its end.
func (pr *peerRouter) route(text []byte) (r int, first, done func()) {
	chain := chunkChain(text, chunkBytes)
	pr.mu.Lock()
	loads := pr.loads
	pr.mu.Unlock()
	d := router.Choose(pr.policy, router.Request{Chain: chain, Avail: pr.avail, Size: int64(len(text)), Load: &loads}, nil, &pr.counter)
	r = d.Replica
	pr.mu.Lock()
	pr.loads[r].Waiting++
	pr.loads[r].InFlight++
	pr.mu.Unlock()
	var once sync.Once
	first = func() {
		once.Do(func() {
			pr.mu.Lock()
			pr.loads[r].Waiting--
			pr.mu.Unlock()
		})
	}
	done = func() {
		first()
		pr.mu.Lock()
		pr.loads[r].InFlight--
		pr.mu.Unlock()
	}
	return r, first, done
}

// llm-d's approximate prefix-cache scorer, after the prefix plugin of its
// scheduler (kubernetes-sigs/gateway-api-inference-extension) with its
// documented defaults: the prompt hashed in 64-character blocks, at most
// the first 256 of them, and for each server an LRU of the block hashes
// of the requests scheduled there, 31,250 blocks long. A server's score
// is the share of the request's blocks that its LRU holds from the first
// on; the request's blocks are added to the chosen server's LRU when it
// is scheduled. As in llm-d's default profile, the prefix score weighs 3
// and the queue score (llmdPolicy's) 2.
const (
	llmdMaxBlocks   = 256
	llmdLRUCapacity = 31_250
)

type llmdApproxPolicy struct{ idx *llmdIndex }

// llmdIndex is each server's LRU of block hashes.
type llmdIndex struct {
	mu   sync.Mutex
	lrus [upstream.MaxReplicas]*blockLRU
}

// blockLRU is a set of block hashes that forgets the least recently
// added past its capacity.
type blockLRU struct {
	order *list.List // of uint64, most recent first
	at    map[uint64]*list.Element
}

func (l *blockLRU) has(h uint64) bool { _, ok := l.at[h]; return ok }

func (l *blockLRU) add(h uint64) {
	if e, ok := l.at[h]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[h] = l.order.PushFront(h)
	if l.order.Len() > llmdLRUCapacity {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.at, old.Value.(uint64))
	}
}

func newLLMDApprox() router.Policy { return llmdApproxPolicy{&llmdIndex{}} }

func (llmdApproxPolicy) String() string { return "llmd-approx" }

func (llmdApproxPolicy) Needs() router.Needs { return router.Needs{Load: true} }

// fresh returns the policy with empty LRUs.
func (llmdApproxPolicy) fresh() router.Policy { return newLLMDApprox() }

func (p llmdApproxPolicy) Choose(req router.Request) router.Decision {
	blocks := req.Chain[:min(len(req.Chain), llmdMaxBlocks)]
	x := p.idx
	x.mu.Lock()
	defer x.mu.Unlock()
	lo, hi := int64(math.MaxInt64), int64(0)
	req.Avail.Each(func(r int) {
		n := req.Load[r].Waiting
		lo, hi = min(lo, n), max(hi, n)
	})
	matched := func(r int) int {
		l := x.lrus[r]
		n := 0
		for l != nil && n < len(blocks) && l.has(blocks[n].Hash) {
			n++
		}
		return n
	}
	best, top, bestMatch := -1, -1.0, 0
	rotate(req.Avail, req.Counter.Add(1)-1, func(r int) {
		queue := 1.0
		if hi > lo {
			queue = float64(hi-req.Load[r].Waiting) / float64(hi-lo)
		}
		m, prefix := matched(r), 0.0
		if len(blocks) > 0 {
			prefix = float64(m) / float64(len(blocks))
		}
		if s := llmdPrefixWeight*prefix + llmdQueueWeight*queue; s > top {
			best, top, bestMatch = r, s, m
		}
	})
	if x.lrus[best] == nil {
		x.lrus[best] = &blockLRU{order: list.New(), at: map[uint64]*list.Element{}}
	}
	for _, l := range blocks {
		x.lrus[best].add(l.Hash)
	}
	if bestMatch > 0 {
		return router.Decision{Replica: best, Reason: router.Pinned, Cached: int64(blocks[bestMatch-1].Bytes())}
	}
	return router.Decision{Replica: best, Reason: router.Spread}
}

func TestChunkChain(t *testing.T) {
	a := []byte(strings.Repeat("a", 200) + "xyz" + strings.Repeat("b", 100))
	b := []byte(strings.Repeat("a", 200) + "uvw" + strings.Repeat("b", 100))
	ca, cb := chunkChain(a, 64), chunkChain(b, 64)
	if len(ca) != len(a)/64 || len(ca) != 4 {
		t.Fatalf("%d links for %d bytes", len(ca), len(a))
	}
	for i := range ca {
		if ca[i].Bytes() != uint64((i+1)*64) {
			t.Errorf("link %d covers %d bytes", i, ca[i].Bytes())
		}
		// The texts part in their fourth chunk.
		if same := ca[i].Hash == cb[i].Hash; same != (i < 3) {
			t.Errorf("link %d: equal %v", i, same)
		}
	}
	// A chunk's hash depends on the chunks before it.
	c := chunkChain([]byte(strings.Repeat("c", 64)+strings.Repeat("a", 64)), 64)
	if c[1].Hash == chunkChain([]byte(strings.Repeat("a", 128)), 64)[1].Hash {
		t.Error("equal chunks after different prefixes hash the same")
	}
}

func TestLLMDApprox(t *testing.T) {
	all := upstream.Mask{0b111}
	text := func(seed int64, n int) []byte { return []byte(workload.Text(seed, n)) }
	p := newLLMDApprox()
	var loads router.Loads
	var counter atomic.Uint64
	choose := func(b []byte) router.Decision {
		return router.Choose(p, router.Request{Chain: chunkChain(b, chunkBytes), Avail: all, Size: int64(len(b)), Load: &loads}, nil, &counter)
	}
	a := text(1, 640)
	if d := choose(a); d.Replica != 0 || d.Reason != router.Spread {
		t.Fatalf("first request: %+v, want replica 0 by turn", d)
	}
	// Recorded when scheduled: the same prompt finds it whole.
	if d := choose(a); d.Replica != 0 || d.Reason != router.Pinned || d.Cached != 640 {
		t.Fatalf("again: %+v, want replica 0 with 640 bytes", d)
	}
	// Half the blocks held there: 3*0.5 + 2 beats 0 + 2.
	longer := append(append([]byte(nil), a...), text(2, 640)...)
	if d := choose(longer); d.Replica != 0 || d.Cached != 640 {
		t.Fatalf("extended: %+v, want replica 0", d)
	}
	// A queue there: 3*(1280/2560) + 0 against 0 + 2 elsewhere.
	loads[0].Waiting = 4
	if d := choose(append(longer, text(3, 1280)...)); d.Replica == 0 {
		t.Fatalf("queued: %+v, want another replica", d)
	}
	// Only the first 256 blocks are read.
	loads[0].Waiting = 0
	huge := text(4, 64*400)
	choose(huge)
	if c := chunkChain(huge, chunkBytes); len(c) != 400 {
		t.Fatal(len(c))
	}
	if d := choose(huge); d.Cached != 256*64 {
		t.Fatalf("400 blocks: %+v, want 256 blocks matched", d)
	}
	// Each server forgets past its capacity, least recent first.
	l := &blockLRU{order: list.New(), at: map[uint64]*list.Element{}}
	for h := uint64(0); h <= llmdLRUCapacity; h++ {
		l.add(h)
	}
	if l.has(0) || !l.has(1) || l.order.Len() != llmdLRUCapacity {
		t.Fatalf("past capacity: first kept %v, %d held", l.has(0), l.order.Len())
	}
}

// A peerRouter counts a request as waiting until its first token and in
// flight until its end.
func TestPeerRouterLoads(t *testing.T) {
	pr := newPeerRouter(newSGLang(), 2)
	r, first, done := pr.route([]byte(workload.Text(1, 1000)))
	if pr.loads[r].Waiting != 1 || pr.loads[r].InFlight != 1 {
		t.Fatalf("sent: %+v", pr.loads[r])
	}
	first()
	first()
	if pr.loads[r].Waiting != 0 || pr.loads[r].InFlight != 1 {
		t.Fatalf("first token: %+v", pr.loads[r])
	}
	done()
	if pr.loads[r] != (router.Load{}) {
		t.Fatalf("done: %+v", pr.loads[r])
	}
}
