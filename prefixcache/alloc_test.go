//go:build !race

package prefixcache

import (
	"testing"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

func TestZeroAllocations(t *testing.T) {
	body := workload.Conversation(1, 40, 360_000)
	chain := make([]Link, 0, 64)
	if n := testing.AllocsPerRun(20, func() {
		var err error
		chain, err = appendChain(chain[:0], body)
		if err != nil || len(chain) != 40 {
			t.Fatalf("AppendChain: %v, %d links", err, len(chain))
		}
	}); n != 0 {
		t.Errorf("AppendChain allocates %.1f times per call, want 0", n)
	}
	prompt := codePrompt()
	if n := testing.AllocsPerRun(20, func() {
		var err error
		chain, _, err = AppendRequestChain(chain[:0], prompt, DefaultPromptChunk)
		if err != nil || len(chain) < 300 {
			t.Fatalf("AppendRequestChain of a prompt: %v, %d links", err, len(chain))
		}
	}); n != 0 {
		t.Errorf("AppendRequestChain of a prompt allocates %.1f times per call, want 0", n)
	}
	chain, _ = appendChain(chain[:0], body)
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
