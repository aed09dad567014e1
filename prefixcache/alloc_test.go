//go:build !race

package prefixcache

import (
	"testing"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

func TestZeroAllocations(t *testing.T) {
	body := workload.Conversation(1, 40, 360_000)
	var c Chains
	if err := c.Read(body, DefaultPromptChunk); err != nil { // grows the chains once
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() {
		if err := c.Read(body, DefaultPromptChunk); err != nil || len(c.Messages) != 40 || len(c.Blocks) < 1000 {
			t.Fatalf("Read: %v, %d and %d links", err, len(c.Messages), len(c.Blocks))
		}
	}); n != 0 {
		t.Errorf("Read of a chat request allocates %.1f times per call, want 0", n)
	}
	prompt := codePrompt()
	if err := c.Read(prompt, DefaultPromptChunk); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() {
		if err := c.Read(prompt, DefaultPromptChunk); err != nil || len(c.Messages) < 300 {
			t.Fatalf("Read of a prompt: %v, %d links", err, len(c.Messages))
		}
	}); n != 0 {
		t.Errorf("Read of a prompt allocates %.1f times per call, want 0", n)
	}
	h := NewHoldings(2, 1<<20)
	h.Insert(0, c.Blocks, 0) // allocates replica 0's LRU
	if n := testing.AllocsPerRun(20, func() {
		_, k, stamp := h.Recall(0, c.Blocks)
		if k == 0 {
			t.Fatal("nothing held")
		}
		h.Insert(0, c.Blocks, 1<<20)
		h.Forget(0, stamp)
		h.Longest(1, c.Blocks)
	}); n != 0 {
		t.Errorf("holdings allocate %.1f times per request, want 0", n)
	}
	chain, _ := appendChain(nil, body)
	m := NewPinMap(1<<12, 4)
	if n := testing.AllocsPerRun(100, func() {
		m.Put(chain[39], 3)
		if r, ok := m.Get(chain[39]); !ok || r != 3 {
			t.Fatal("pin lost")
		}
	}); n != 0 {
		t.Errorf("pin map get/put allocates %.1f times per call, want 0", n)
	}
}
