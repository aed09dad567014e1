package trace

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

const sample = `{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [1, 2, 3]}

{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [1, 4]}
{"timestamp": 9000, "input_length": 1300, "output_length": 20, "hash_ids": [1, 2, 5]}
{"timestamp": 12000, "input_length": 1200, "output_length": 20, "hash_ids": [1, 2, 6]}
`

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(plain, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write([]byte(sample))
	w.Close()
	packed := filepath.Join(dir, "t.jsonl.gz")
	if err := os.WriteFile(packed, z.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{plain, packed} {
		reqs, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != 4 || reqs[1].At != 1500*time.Millisecond || reqs[2].Input != 1300 || reqs[2].Output != 20 ||
			len(reqs[2].Blocks) != 3 || reqs[2].Blocks[2] != 5 || reqs[0].Full() != 2 || reqs[1].Full() != 1 {
			t.Fatalf("%s: %+v", path, reqs)
		}
	}
	for _, bad := range []string{
		`{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}`, // too few ids
		`{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`,
		`{"timestamp": 0, "input_length": 10`,
	} {
		if _, err := Read(strings.NewReader(sample + bad + "\n")); err == nil || !strings.Contains(err.Error(), "line 6") {
			t.Errorf("%s: got %v, want an error on line 6", bad, err)
		}
	}
	if _, err := Load(filepath.Join(dir, "none.jsonl")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestWindow(t *testing.T) {
	reqs, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	w := Window(reqs, 1, 2, 0)
	if len(w) != 2 || w[0].At != 0 || w[1].At != 7500*time.Millisecond || w[0].Input != 600 {
		t.Fatalf("start 1, 2 requests: %+v", w)
	}
	if w := Window(reqs, 0, 0, 9*time.Second); len(w) != 3 || Span(w) != 9*time.Second {
		t.Fatalf("9 s: %+v", w)
	}
	if w := Window(reqs, 9, 1, 0); w != nil {
		t.Fatalf("past the end: %+v", w)
	}
	if reqs[1].At != 1500*time.Millisecond {
		t.Fatal("Window changed its input")
	}
}

func TestReachable(t *testing.T) {
	reqs, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	// Request 0: nothing earlier. 1: block 1 (512 tokens) was sent. 2
	// and 3: blocks 1 and 2 (1024); their last blocks are new.
	got := Reachable(reqs)
	want := Reach{Prompt: 1100 + 600 + 1300 + 1200, Shared: 512 + 1024 + 1024, Distinct: 1100 + 88 + 276 + 176}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// A block is reachable only after the same prefix: [4] under 1 is
	// not [4] under 9.
	other := []Request{{Input: 1024, Blocks: []uint64{1, 4}}, {Input: 1024, Blocks: []uint64{9, 4}}}
	if r := Reachable(other); r.Shared != 0 || r.Share() != 0 {
		t.Fatalf("different prefixes shared: %+v", r)
	}
}

func TestCachedPrefixes(t *testing.T) {
	reqs, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	// 1: block 1. 2: blocks 1 and 2. 3: blocks 1 and 2, not 6.
	if got, want := CachedPrefixes(reqs), []int{0, 512, 1024, 1024}; !equalInts(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// A short prompt that an earlier one covers is cached to its end.
	again := []Request{{Input: 1100, Blocks: []uint64{1, 2, 3}}, {Input: 700, Blocks: []uint64{1, 2}}}
	if got := CachedPrefixes(again); got[1] != 700 {
		t.Fatalf("got %v, want 700 for the second", got)
	}
}

func TestAppendText(t *testing.T) {
	long := AppendBlock(nil, 7, 3000)
	if len(long) != 3000 || !bytes.Equal(AppendBlock(nil, 7, 1000), long[:1000]) {
		t.Fatal("a shorter text is not a prefix of the longer")
	}
	if !bytes.Equal(AppendBlock([]byte("x"), 7, 10)[1:], long[:10]) {
		t.Fatal("appending changed the text")
	}
	// Different ids: texts apart within their first 64 bytes, the size of
	// a simulated KV block.
	for id := uint64(0); id < 2000; id++ {
		if a, b := AppendBlock(nil, id, 64), AppendBlock(nil, id+1, 64); bytes.Equal(a, b) {
			t.Fatalf("ids %d and %d: the same first 64 bytes %q", id, id+1, a)
		}
	}
	if len(words) != 64 {
		t.Fatalf("%d words: the text draws 6 bits a word", len(words))
	}
}

// chatML renders msgs as the simulator's template does (and vLLM's with a
// ChatML model): what an engine caches.
func chatML(msgs []workload.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	return b.String() + "<|im_start|>assistant\n"
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestRenderTurns(t *testing.T) {
	reqs, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	r := Render(reqs, Turns, 4)
	// Block 1 opens every request: the system prompt. 2 continues 0 (it
	// extends 0's whole blocks [1 2]); so does 3, which 2's whole blocks
	// [1 2] would fit too but is shorter than 2: a second branch of 0.
	if want := []int{-1, -1, 0, 0}; !equalInts(r.Parent, want) {
		t.Fatalf("parents %v, want %v", r.Parent, want)
	}
	for i, msgs := range r.Messages {
		if msgs[0].Role != "system" || len(msgs[0].Content) != BlockTokens*4 {
			t.Fatalf("request %d opens with %s of %d bytes", i, msgs[0].Role, len(msgs[0].Content))
		}
		if n := len(chatML(msgs)); n < reqs[i].Input*4 || n > reqs[i].Input*4+200 {
			t.Errorf("request %d: %d bytes rendered for %d tokens", i, n, reqs[i].Input)
		}
	}
	c := r.Messages[2]
	if len(c) != 4 || c[2].Role != "assistant" || c[3].Role != "user" {
		t.Fatalf("continuation: %+v", c)
	}
	// The continuation's rendering opens with its parent's whole.
	parent, child := chatML(r.Messages[0]), chatML(c)
	if !strings.HasPrefix(child, parent) {
		t.Fatalf("the continuation's rendering does not open with its parent's (%d of %d bytes shared)", commonPrefix(parent, child), len(parent))
	}
	// Two branches of one conversation share the parent and its answer.
	if a, b := r.Messages[2], r.Messages[3]; a[2] != b[2] || a[3] == b[3] {
		t.Fatal("the branches do not share the answer, or do not differ after it")
	}
	// Request 1 shares only the system prompt.
	if n := commonPrefix(chatML(r.Messages[0]), chatML(r.Messages[1])); n < BlockTokens*4 || n > BlockTokens*4+100 {
		t.Fatalf("requests 0 and 1 share %d bytes, want the system prompt's", n)
	}
}

func TestRenderOnePrompt(t *testing.T) {
	reqs, err := Read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	r := Render(reqs, OnePrompt, 2)
	for i, msgs := range r.Messages {
		if len(msgs) != 1 || msgs[0].Role != "user" || len(msgs[0].Content) != reqs[i].Input*2 || r.Parent[i] != -1 {
			t.Fatalf("request %d: %d messages, %d bytes", i, len(msgs), len(msgs[0].Content))
		}
	}
	// Equal leading blocks, equal leading text, and no more.
	text := func(i int) string { return r.Messages[i][0].Content }
	for _, c := range []struct{ a, b, blocks int }{{0, 1, 1}, {0, 2, 2}, {2, 3, 2}, {0, 3, 2}, {1, 2, 1}} {
		n := commonPrefix(text(c.a), text(c.b))
		want := c.blocks * BlockTokens * 2
		if n < want || n > want+32 {
			t.Errorf("requests %d and %d share %d bytes, want %d", c.a, c.b, n, want)
		}
	}
}

// On the checked-in trace, every continuation's rendering opens with its
// parent's, and a length scale shrinks the text, not the structure.
func TestRenderMooncake(t *testing.T) {
	all, err := Load("../traces/mooncake-conversation.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	reqs := Window(all, 0, 400, 0)
	full, small := Render(reqs, Turns, 4), Render(reqs, Turns, 0.25)
	if full.Continued() < 30 {
		t.Fatalf("%d continuations in 400 requests", full.Continued())
	}
	for j, p := range full.Parent {
		if small.Parent[j] != p {
			t.Fatalf("request %d: parent %d at full length, %d shrunk", j, p, small.Parent[j])
		}
		if p < 0 {
			continue
		}
		for _, r := range []Rendered{full, small} {
			if !strings.HasPrefix(chatML(r.Messages[j]), chatML(r.Messages[p])) {
				t.Fatalf("request %d does not open with its parent %d's rendering", j, p)
			}
		}
	}
	if r := Reachable(reqs); r.Share() < 0.1 || r.Share() > 0.3 || r.Distinct+r.Shared != r.Prompt {
		t.Fatalf("reach %+v", r)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
