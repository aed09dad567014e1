package benchmarks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// errTooLong is a request that the replicas' context cannot take: its
// prompt alone fills it. It is not sent.
var errTooLong = errors.New("the prompt does not fit the replicas' context")

// fit keeps the requests sent to real replicas within their context, so
// that a benchmark's prompts and answers that outgrow it are cut short or
// left out, and counted, rather than failing on the engine's 400.
type fit struct {
	// ctx is the smallest context, in tokens, that one of the replicas
	// publishes: any of them may get a request.
	ctx int
	// perByte is the most prompt tokens per request body byte that the
	// replicas have reported (usage.prompt_tokens over the body's
	// length), as math.Float64bits; startPerByte until the first answer.
	perByte         atomic.Uint64
	capped, skipped atomic.Int64
}

// startPerByte assumes 2 bytes a token before the replicas have counted
// any prompt: more tokens than any tokenizer makes of text.
const startPerByte = 0.5

func newFit(ctx int) *fit {
	f := &fit{ctx: ctx}
	f.perByte.Store(math.Float64bits(startPerByte))
	return f
}

// tokens estimates the prompt tokens of a request body of n bytes, with
// 5% and 16 tokens to spare.
func (f *fit) tokens(n int) int {
	return int(float64(n)*math.Float64frombits(f.perByte.Load())*1.05) + 16
}

// learn takes the prompt tokens that a replica counted in a body of n
// bytes.
func (f *fit) learn(n, prompt int) {
	if n == 0 || prompt == 0 {
		return
	}
	v := float64(prompt) / float64(n)
	for {
		old := f.perByte.Load()
		cur := math.Float64frombits(old)
		if cur != startPerByte && v <= cur {
			return
		}
		if f.perByte.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

// apply returns body with its max_tokens capped to what the context leaves
// after the prompt, or false when the prompt leaves no room.
func (f *fit) apply(body []byte) ([]byte, bool) {
	room := f.ctx - f.tokens(len(body))
	if room < 1 {
		f.skipped.Add(1)
		return body, false
	}
	key := []byte(`"max_tokens":`)
	i := bytes.LastIndex(body, key)
	if i < 0 {
		return body, true
	}
	i += len(key)
	j := i
	for j < len(body) && body[j] >= '0' && body[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(string(body[i:j]))
	if err != nil || n <= room {
		return body, true
	}
	f.capped.Add(1)
	return splice(body, i, j, strconv.Itoa(room)), true
}

// String says what the fit did, for the benchmarks' output.
func (f *fit) String() string {
	return fmt.Sprintf("context %d tokens: %d requests' max_tokens capped, %d not sent (prompt past the context)",
		f.ctx, f.capped.Load(), f.skipped.Load())
}

// contextOf reads the context length, in tokens, that a replica publishes
// for model: vLLM's (and SGLang's) max_model_len in /v1/models, or
// llama.cpp's n_ctx in /props (a slot's context); 0 when it publishes
// none.
func contextOf(c *http.Client, base, model string) int {
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if getJSON(c, base+"/v1/models", &models) == nil {
		for _, m := range models.Data {
			if m.MaxModelLen > 0 && (m.ID == model || len(models.Data) == 1) {
				return m.MaxModelLen
			}
		}
	}
	var props struct {
		NCtx     int `json:"n_ctx"`
		Defaults struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if getJSON(c, base+"/props", &props) == nil {
		if props.Defaults.NCtx > 0 {
			return props.Defaults.NCtx
		}
		return props.NCtx
	}
	return 0
}

func getJSON(c *http.Client, url string, v any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// fitOf returns the fit of the replicas at urls, nil when none publishes
// a context.
func fitOf(c *http.Client, urls []string, model string) *fit {
	ctx := 0
	for _, u := range urls {
		if n := contextOf(c, u, model); n > 0 && (ctx == 0 || n < ctx) {
			ctx = n
		}
	}
	if ctx == 0 {
		return nil
	}
	return newFit(ctx)
}

// reportFit reports what the fit did to a benchmark's requests, and says
// it when it did anything.
func (e *env) reportFit(b *testing.B) {
	if e.fit == nil {
		return
	}
	b.ReportMetric(float64(e.fit.capped.Load()), "capped")
	b.ReportMetric(float64(e.fit.skipped.Load()), "skipped")
	if e.fit.capped.Load()+e.fit.skipped.Load() > 0 {
		b.Logf("replicas' %s", e.fit)
	}
}

// fakeReplica is an engine with a small context on a loopback port: it
// publishes the context as vLLM (/v1/models) or llama.cpp (/props) does,
// counts a prompt's tokens as a quarter of its messages' bytes and four
// more a message, and answers 400, as the engines do, to a request whose
// prompt and max_tokens pass the context.
type fakeReplica struct {
	url      string
	mu       sync.Mutex
	refused  int // requests answered 400
	answered int
	maxSeen  int // the largest prompt plus max_tokens answered
}

func startFakeReplica(t *testing.T, ctx int, llama bool) *fakeReplica {
	f := &fakeReplica{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		if llama {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake","object":"model"}]}`)
			return
		}
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":%d}]}`, ctx)
	})
	mux.HandleFunc("GET /props", func(w http.ResponseWriter, _ *http.Request) {
		if !llama {
			http.NotFound(w, nil)
			return
		}
		fmt.Fprintf(w, `{"default_generation_settings":{"n_ctx":%d},"total_slots":1}`, ctx)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages  []struct{ Content string }
			MaxTokens int `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		prompt := 0
		for _, m := range req.Messages {
			prompt += len(m.Content)/4 + 4
		}
		f.mu.Lock()
		if prompt+req.MaxTokens > ctx {
			f.refused++
			f.mu.Unlock()
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":{"message":"%d prompt tokens and %d max_tokens exceed the context of %d"}}`, prompt, req.MaxTokens, ctx)
			return
		}
		f.answered++
		f.maxSeen = max(f.maxSeen, prompt+req.MaxTokens)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		for i := 0; i < req.MaxTokens; i++ {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok \"}}]}\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", prompt, req.MaxTokens)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func TestContextOf(t *testing.T) {
	vllm, llama := startFakeReplica(t, 900, false), startFakeReplica(t, 700, true)
	c := &http.Client{}
	if n := contextOf(c, vllm.url, "fake"); n != 900 {
		t.Errorf("vLLM's max_model_len: got %d, want 900", n)
	}
	if n := contextOf(c, llama.url, "fake"); n != 700 {
		t.Errorf("llama.cpp's n_ctx: got %d, want 700", n)
	}
	if f := fitOf(c, []string{vllm.url, llama.url}, "fake"); f == nil || f.ctx != 700 {
		t.Errorf("two replicas: got %v, want the smaller context, 700", f)
	}
	none := httptest.NewServer(http.NotFoundHandler())
	defer none.Close()
	if f := fitOf(c, []string{none.URL}, "fake"); f != nil {
		t.Errorf("a replica that publishes no context: got %v", f)
	}
}

// An agent loop against replicas with a small context: as the
// conversations grow, their answers are capped and then their turns left
// out, and the engines refuse none.
func TestAgentLoopFitsContext(t *testing.T) {
	const ctx = 4096
	fakes := []*fakeReplica{startFakeReplica(t, ctx, false), startFakeReplica(t, ctx, true)}
	e := startReplicaEnv(t, router.Config{Policy: router.Adaptive}, upstream.Config{}, []string{fakes[0].url, fakes[1].url}, "fake")
	if e.fit == nil || e.fit.ctx != ctx {
		t.Fatalf("fit %v: the replicas' context was not read", e.fit)
	}
	warm, _, err := e.agentLoop(1, 2, 40, 1_200, 200, 100)
	if err != nil {
		t.Fatal(err)
	}
	answered := 0
	for i, f := range fakes {
		if f.refused > 0 || f.maxSeen > ctx {
			t.Errorf("replica %d refused %d requests, took %d tokens", i, f.refused, f.maxSeen)
		}
		answered += f.answered
	}
	if e.fit.capped.Load() == 0 || e.fit.skipped.Load() != 2 || len(warm) == 0 || answered != len(warm)+2 {
		t.Fatalf("%s; %d answered, %d warm turns: want capped answers and each session's last turn left out", e.fit, answered, len(warm))
	}
	// The estimate is close enough that the conversations reach well into
	// the context before they end.
	for i, f := range fakes {
		if f.maxSeen < ctx*3/4 {
			t.Errorf("replica %d: at most %d of %d tokens used", i, f.maxSeen, ctx)
		}
	}
}
