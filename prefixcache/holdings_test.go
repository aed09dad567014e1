package prefixcache

import (
	"strings"
	"sync"
	"testing"
)

// blocksOf is the Blocks chain of a chat request of the given messages,
// a link every chunk bytes.
func blocksOf(t testing.TB, chunk int, msgs ...string) []Link {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"` + m + `"}`)
	}
	b.WriteString(`]}`)
	var c Chains
	if err := c.Read([]byte(b.String()), chunk); err != nil {
		t.Fatal(err)
	}
	return c.Blocks
}

func TestHoldingsLongest(t *testing.T) {
	doc := strings.Repeat("a shared document of many words ", 100) // 3,200 bytes
	a := blocksOf(t, 64, doc+"question one")
	b := blocksOf(t, 64, doc+"question two, longer than the first")
	other := blocksOf(t, 64, "another prompt "+doc)
	h := NewHoldings(4, 1<<20)
	h.Insert(1, a, 0)
	for _, c := range []struct {
		name   string
		r      int
		blocks []Link
		links  int
	}{
		{"the prompt itself", 1, a, len(a)},
		{"a prompt sharing its document", 1, b, len(doc) / 64},
		{"a prompt sharing no prefix", 1, other, 0},
		{"another replica", 2, a, 0},
		{"no blocks", 1, nil, 0},
	} {
		bytes, n := h.Longest(c.r, c.blocks)
		if n != c.links {
			t.Errorf("%s: %d links held, want %d", c.name, n, c.links)
			continue
		}
		if want := int64(0); n > 0 {
			want = int64(c.blocks[n-1].Bytes())
			if bytes != want || bytes < int64(len(doc))-64 {
				t.Errorf("%s: %d bytes held, want %d", c.name, bytes, want)
			}
		} else if bytes != want {
			t.Errorf("%s: %d bytes held, want 0", c.name, bytes)
		}
	}
	if got, want := h.Held(1), int64(a[len(a)-1].Bytes()); got != want {
		t.Errorf("replica holds %d bytes, want %d", got, want)
	}
}

// The byte bound evicts the least recently used prompt, from its tail:
// what is left of it is still a prefix, found by the binary search.
func TestHoldingsLimit(t *testing.T) {
	one := blocksOf(t, 64, strings.Repeat("first conversation ", 40))
	two := blocksOf(t, 64, strings.Repeat("second conversation ", 40))
	size := int64(one[len(one)-1].Bytes())
	h := NewHoldings(1, 1<<20)
	h.Insert(0, one, 0)
	h.Insert(0, two, 0)
	if _, n := h.Longest(0, one); n != len(one) {
		t.Fatalf("%d of %d links held with no bound", n, len(one))
	}
	limit := int64(two[len(two)-1].Bytes()) + size/2
	h.Insert(0, two, limit) // touches two: one is the least recently used
	if h.Held(0) > limit {
		t.Fatalf("holds %d bytes, bound %d", h.Held(0), limit)
	}
	if _, n := h.Longest(0, two); n != len(two) {
		t.Fatalf("the recent prompt lost links: %d of %d", n, len(two))
	}
	bytes, n := h.Longest(0, one)
	if n == 0 || n == len(one) || bytes > size/2+64 {
		t.Fatalf("the older prompt keeps %d of %d links, %d bytes: want its head, half or less", n, len(one), bytes)
	}
	for i := range one[:n] {
		if _, k := h.Longest(0, one[:i+1]); k != i+1 {
			t.Fatalf("link %d of the kept head is missing", i)
		}
	}
	if st := h.Stats(0); st.Evictions == 0 || st.Bytes != h.Held(0) {
		t.Fatalf("stats %+v, held %d", st, h.Held(0))
	}
}

// An entry bound smaller than a prompt keeps the prompt's head.
func TestHoldingsEntryBound(t *testing.T) {
	long := blocksOf(t, 8, strings.Repeat("x", 8*200))
	h := NewHoldings(1, 100*HoldingEntryBytes)
	h.Insert(0, long, 0)
	if _, n := h.Longest(0, long); n != 100 {
		t.Fatalf("%d links held, want the first 100", n)
	}
}

// Forget drops what is older than the stamp it is given, the oldest link
// of a prefix the replica lost; what was touched since stays.
func TestHoldingsForget(t *testing.T) {
	old := blocksOf(t, 64, strings.Repeat("an old conversation ", 30))
	conv := blocksOf(t, 64, strings.Repeat("the conversation ", 30))
	recent := blocksOf(t, 64, strings.Repeat("a recent one ", 30))
	h := NewHoldings(1, 1<<20)
	h.Insert(0, old, 0)
	h.Insert(0, conv, 0)
	h.Insert(0, recent, 0)
	// The conversation's next turn is sent: it is believed held whole.
	next := blocksOf(t, 64, strings.Repeat("the conversation ", 30), "and its next turn")
	bytes, n, stamp := h.Recall(0, next)
	if n != len(conv) || bytes != int64(conv[n-1].Bytes()) || stamp == 0 {
		t.Fatalf("the next turn finds %d links, %d bytes, stamp %d; want all %d of the first message", n, bytes, stamp, len(conv))
	}
	h.Insert(0, next, 0)
	// Its replica reports it found less: what was older than the
	// conversation goes, what was touched since stays.
	if got := h.Forget(0, stamp); got != len(old) {
		t.Fatalf("forgot %d links, want the older conversation's %d", got, len(old))
	}
	for _, c := range []struct {
		name   string
		blocks []Link
		held   int
	}{{"older", old, 0}, {"recent", recent, len(recent)}, {"corrected", next, len(next)}} {
		if _, n := h.Longest(0, c.blocks); n != c.held {
			t.Errorf("%s prompt: %d of %d links held, want %d", c.name, n, len(c.blocks), c.held)
		}
	}
	if got := h.Forget(0, stamp); got != 0 {
		t.Fatalf("forgot %d links again", got)
	}
	if st := h.Stats(0); st.Dropped != uint64(len(old)) {
		t.Fatalf("stats %+v", st)
	}
	h.DropReplica(0)
	if _, n := h.Longest(0, recent); n != 0 || h.Held(0) != 0 {
		t.Fatalf("%d links, %d bytes after the replica left", n, h.Held(0))
	}
}

// Readers and writers of one replica meet on its lock: run with -race.
func TestHoldingsConcurrent(t *testing.T) {
	h := NewHoldings(2, 1<<16)
	prompts := make([][]Link, 8)
	for i := range prompts {
		prompts[i] = blocksOf(t, 32, strings.Repeat("shared head ", 20), strings.Repeat(string(rune('a'+i)), 300))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := prompts[(g+i)%len(prompts)]
				h.Insert(i&1, p, 4000)
				if b, n := h.Longest(i&1, p); n != len(p) || b != int64(p[n-1].Bytes()) {
					t.Errorf("a prompt just inserted: %d of %d links", n, len(p))
					return
				}
			}
		}()
	}
	wg.Wait()
	for r := range 2 {
		if held := h.Held(r); held > 4000 || held <= 0 {
			t.Errorf("replica %d holds %d bytes, bound 4000", r, held)
		}
	}
}

// Withdraw takes back the links one Insert added past what was held, and
// leaves links that a later Insert stamped.
func TestHoldingsWithdraw(t *testing.T) {
	head := strings.Repeat("a shared head ", 20)
	first := blocksOf(t, 64, head)
	prompt := blocksOf(t, 64, head, strings.Repeat("a refused tail ", 20))
	h := NewHoldings(1, 1<<20)
	h.Insert(0, first, 0)
	before := h.Held(0)
	_, n, _ := h.Recall(0, prompt)
	stamp := h.Insert(0, prompt, 0)
	h.Withdraw(0, prompt[n:], stamp)
	if _, k := h.Longest(0, prompt); k != n || h.Held(0) != before {
		t.Fatalf("after the withdrawal: %d links, %d bytes held; want %d and %d", k, h.Held(0), n, before)
	}
	stamp = h.Insert(0, prompt, 0)
	h.Insert(0, prompt, 0) // another request of the same prompt
	h.Withdraw(0, prompt[n:], stamp)
	if _, k := h.Longest(0, prompt); k != len(prompt) {
		t.Fatalf("a withdrawal took %d links that a later request holds", len(prompt)-k)
	}
}
