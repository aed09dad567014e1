package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

func fastConfig() Config {
	cfg := DefaultConfig()
	cfg.TimeScale = 200
	return cfg
}

func start(t *testing.T, cfg Config) *Replica {
	t.Helper()
	r, err := NewReplica("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

type completion struct {
	Choices []struct {
		Message struct{ Content string }
	}
	Usage Usage
}

func ask(t *testing.T, r *Replica, body []byte) completion {
	t.Helper()
	resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var c completion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRepeatedPromptIsCheaperOnTheSameReplica(t *testing.T) {
	// A slower clock than fastConfig's: the engine's times are wall time
	// scaled up, and at 200x a few milliseconds of scheduling delay on a
	// loaded machine read as a cold prefill.
	cfg := fastConfig()
	cfg.TimeScale = 20
	a, b := start(t, cfg), start(t, cfg)
	body := workload.Body("m", workload.AgentContext(1, 80_000), false, 8)
	first := ask(t, a, body)
	again := ask(t, a, body)
	other := ask(t, b, body)
	if first.Usage.PromptTokensDetails.CachedTokens != 0 || first.Usage.PromptTokens < 20_000 {
		t.Fatalf("first: %+v", first.Usage)
	}
	if again.Usage.PromptTokensDetails.CachedTokens < first.Usage.PromptTokens-32 {
		t.Fatalf("repeat on the same replica cached %d of %d tokens", again.Usage.PromptTokensDetails.CachedTokens, again.Usage.PromptTokens)
	}
	if again.Usage.Sim.TTFTMs*5 > first.Usage.Sim.TTFTMs {
		t.Fatalf("warm TTFT %.0f ms is not far below cold %.0f ms", again.Usage.Sim.TTFTMs, first.Usage.Sim.TTFTMs)
	}
	if other.Usage.PromptTokensDetails.CachedTokens != 0 || other.Usage.Sim.TTFTMs < first.Usage.Sim.TTFTMs*0.8 {
		t.Fatalf("the other replica had it cached: %+v", other.Usage)
	}
	if len(again.Choices) != 1 || again.Choices[0].Message.Content != strings.Repeat("tok ", 8) {
		t.Fatalf("choices %+v", again.Choices)
	}
}

func TestEvictionAtCapacity(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCapacityTokens = 30_000
	r := start(t, cfg)
	a := workload.Body("m", workload.AgentContext(1, 80_000), false, 1) // ~20k tokens
	b := workload.Body("m", workload.AgentContext(2, 80_000), false, 1)
	ask(t, r, a)
	if c := ask(t, r, a).Usage.PromptTokensDetails.CachedTokens; c == 0 {
		t.Fatal("a prompt that fits was not cached")
	}
	ask(t, r, b) // pushes the tail of a out
	// What is left of a is its head, as in vLLM, which evicts a request's
	// tail blocks first: about the 10k tokens that b left room for.
	if c := ask(t, r, a).Usage.PromptTokensDetails.CachedTokens; c > 12_000 || c < 8_000 {
		t.Fatalf("%d tokens of a half-evicted prompt were cached, want its 10k-token head", c)
	}
}

func TestStopAndRestart(t *testing.T) {
	r := start(t, fastConfig())
	body := workload.Body("m", workload.AgentContext(1, 8_000), false, 1)
	ask(t, r, body)
	r.Stop()
	if _, err := http.Get(r.URL() + "/health"); err == nil {
		t.Fatal("a stopped replica accepted a connection")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if c := ask(t, r, body).Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Fatalf("a restarted replica kept %d cached tokens", c)
	}
}

func TestStreamFormat(t *testing.T) {
	r := start(t, fastConfig())
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var events []string
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimPrefix(line, "data: "))
		}
	}
	// role chunk, 5 tokens, finish chunk, usage chunk, [DONE]
	if len(events) != 9 || events[8] != "[DONE]" {
		t.Fatalf("%d events: %v", len(events), events)
	}
	var chunk struct {
		Object  string
		Choices []struct {
			Delta struct{ Role, Content string }
		}
	}
	json.Unmarshal([]byte(events[1]), &chunk)
	if chunk.Object != "chat.completion.chunk" || chunk.Choices[0].Delta.Content != "tok " {
		t.Fatalf("token chunk %s", events[1])
	}
	var u struct{ Usage Usage }
	json.Unmarshal([]byte(events[7]), &u)
	if u.Usage.CompletionTokens != 5 || u.Usage.PromptTokens == 0 {
		t.Fatalf("usage chunk %s", events[7])
	}
}

func TestBatchingSharesSteps(t *testing.T) {
	// Two requests decoding together take about as long as one: a
	// continuous batch, not a queue.
	r := start(t, fastConfig())
	body := workload.Body("m", []workload.Message{{Role: "user", Content: "hi"}}, false, 200)
	one := ask(t, r, body).Usage.Sim.LatencyMs
	done := make(chan float64, 2)
	for i := 0; i < 2; i++ {
		go func() {
			resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				done <- -1
				return
			}
			var c completion
			json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
			done <- c.Usage.Sim.LatencyMs
		}()
	}
	for i := 0; i < 2; i++ {
		if l := <-done; l < 0 || l > one*1.5 {
			t.Fatalf("batched latency %.0f ms against %.0f ms alone", l, one)
		}
	}
	_ = time.Second
}

// The engine reports its queue as vLLM does: a request past MaxRunning
// waits, and KV cache usage counts the blocks that running requests hold,
// not the cached blocks that no request holds (those are free to evict).
func TestQueueMetrics(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxRunning = 1
	cfg.KVCapacityTokens = 1600
	e := newEngine(cfg)
	defer e.close()
	blocks := func(base uint64) []uint64 {
		b := make([]uint64, 10)
		for i := range b {
			b[i] = base + uint64(i)
		}
		return b
	}
	long := e.submit(blocks(100), 160, 100_000)
	next := e.submit(blocks(200), 160, 1)
	<-long.tokens // prefilled, decoding: it holds its prompt's blocks
	st := e.stats()
	if st.running != 1 || st.waiting != 1 || st.kvUsage < 0.1 || st.kvUsage > 0.2 {
		t.Errorf("one decoding, one waiting: running %d, waiting %d, KV usage %.3f; want 1, 1, about 0.1", st.running, st.waiting, st.kvUsage)
	}
	e.abort(long)
	for range next.tokens {
	}
	st = e.stats()
	if st.running != 0 || st.waiting != 0 || st.kvUsage != 0 || st.cacheBlocks == 0 {
		t.Errorf("idle: running %d, waiting %d, KV usage %.3f, cached blocks %d; want 0, 0, 0 and some cached", st.running, st.waiting, st.kvUsage, st.cacheBlocks)
	}
}

// The metrics page publishes the KV capacity as vLLM does, and the
// counters that say what was cached; the answer's usage agrees.
func TestMetricsPublishCapacity(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCapacityTokens = 50_000
	r := start(t, cfg)
	body := workload.Body("m", workload.AgentContext(2, 8_000), false, 2)
	ask(t, r, body)
	again := ask(t, r, body)
	resp, err := http.Get(r.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	var blocks, size, hits int
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "vllm:cache_config_info{") {
			if !strings.HasSuffix(line, "} 1.0") {
				t.Fatalf("info gauge %q", line)
			}
			for _, l := range strings.Split(line[len("vllm:cache_config_info{"):strings.IndexByte(line, '}')], ",") {
				k, v, _ := strings.Cut(l, "=")
				switch k {
				case "num_gpu_blocks":
					blocks, _ = strconv.Atoi(strings.Trim(v, `"`))
				case "block_size":
					size, _ = strconv.Atoi(strings.Trim(v, `"`))
				}
			}
		}
		if v, ok := strings.CutPrefix(line, `vllm:prefix_cache_hits_total{model_name="sim-30b"} `); ok {
			hits, _ = strconv.Atoi(v)
		}
	}
	if blocks*size != 50_000 || size != 16 {
		t.Fatalf("capacity %d blocks of %d tokens, want 50000 tokens in blocks of 16:\n%s", blocks, size, page)
	}
	if c := again.Usage.PromptTokensDetails.CachedTokens; c == 0 || c != hits || c >= again.Usage.PromptTokens {
		t.Fatalf("the repeat found %d of %d tokens cached, the page counts %d hits", c, again.Usage.PromptTokens, hits)
	}
}

// PrefillBusy counts the steps that prefilled, not the decode steps after
// them, nor idle time.
func TestPrefillBusy(t *testing.T) {
	r := start(t, fastConfig())
	if b := r.PrefillBusy(); b != 0 {
		t.Fatalf("idle: %v", b)
	}
	msgs := []workload.Message{{Role: "user", Content: workload.Text(1, 80_000)}}
	c := ask(t, r, workload.Body("m", msgs, false, 200))
	b := r.PrefillBusy()
	// 20k tokens prefill in about 1.5 s of model time, in steps of the
	// prefill budget whose cost the config gives; the 200 decode steps
	// after take 4 s more. The TTFT also holds the engine's wake-up after
	// the request came, longer on a loaded machine, so the prefill is
	// checked against the steps' cost and is at most the TTFT.
	cfg := r.cfg
	var want time.Duration
	for pos, n := 0, c.Usage.PromptTokens; pos < n; pos += cfg.PrefillBudget {
		take := min(n-pos, cfg.PrefillBudget)
		want += cfg.StepBase + time.Duration(take)*cfg.PrefillPerToken +
			time.Duration(float64(take)*(float64(pos)+float64(take)/2)/1000*float64(cfg.PrefillAttention))
	}
	ttft := c.Usage.Sim.TTFTMs / 1000
	prefill, now := r.engine().busy()
	if math.Abs(prefill-want.Seconds()) > 0.01*want.Seconds() || prefill > ttft*1.001 || b <= 0 || b >= 0.5 || now <= prefill {
		t.Fatalf("prefill %.2f s (the steps cost %.2f s) of %.2f s (share %.2f); TTFT %.2f s", prefill, want.Seconds(), now, b, ttft)
	}
}
