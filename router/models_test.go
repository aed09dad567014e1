package router

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/upstream"
)

// Two replicas serving different models: every request for either model
// succeeds on the replica that serves it, a LoRA adapter counts as a model,
// an unknown model gets warmroute's own 404 naming the served ones,
// warmroute answers /v1/models with the union, and a model whose only
// replica is down gets 503 with Retry-After.
func TestRoutingByModel(t *testing.T) {
	llama := startSim(t, "llama-8b", "llama-8b-sql-lora")
	qwen := startSim(t, "qwen-32b")
	p := startProxy(t, Adaptive, []string{llama.URL(), qwen.URL()}, func(u *upstream.Config, c *Config, _ *ServerConfig) {
		u.Cooldown, u.MaxCooldown = time.Hour, time.Hour
		c.AccessLog = true
	})
	waitFor(t, "the replicas' model lists", func() bool {
		return len(p.set.ModelNames()) == 3
	})
	ask := func(model string, turn int) result {
		return post(p, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"question %d"}]}`, model, turn))
	}
	for i := 0; i < 8; i++ {
		for model, want := range map[string]*sim.Replica{"llama-8b": llama, "llama-8b-sql-lora": llama, "qwen-32b": qwen} {
			if r := ask(model, i); r.status != 200 || r.replica != want.Addr() {
				t.Fatalf("%s, request %d: %d on %s (want %s): %s", model, i, r.status, r.replica, want.Addr(), r.body)
			}
		}
	}
	r := ask("gpt-5", 0)
	if r.status != 404 || !strings.Contains(r.body, `"code":"model_not_found"`) || !strings.Contains(r.body, "llama-8b, llama-8b-sql-lora, qwen-32b") {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
	// The proxy's own answer is logged as a replica's is.
	waitFor(t, "the 404's access log line", func() bool {
		return strings.Contains(p.logs.String(), "model=gpt-5 replica=none route=none status=404")
	})
	resp, err := client.Get(p.url("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string
		Data   []struct{ ID string }
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	sort.Strings(ids)
	if err != nil || list.Object != "list" || strings.Join(ids, ",") != "llama-8b,llama-8b-sql-lora,qwen-32b" {
		t.Fatalf("/v1/models: %v %+v", err, list)
	}
	p.set.Replica(1).Demote(fmt.Errorf("test"), time.Now())
	if r := ask("qwen-32b", 9); r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("a model whose replica is down: %d %s", r.status, r.body)
	}
	if r := ask("llama-8b", 9); r.status != 200 {
		t.Fatalf("the other model meanwhile: %d", r.status)
	}
}

// A completions prompt that extends an earlier one goes to the replica
// that served it, which finds most of it in its cache; a new prompt is
// spread.
func TestCompletionsPromptFollowsItsPrefix(t *testing.T) {
	a, b := startSim(t, "m"), startSim(t, "m")
	p := startProxy(t, Adaptive, []string{a.URL(), b.URL()})
	waitFor(t, "the model lists", func() bool { return len(p.set.ModelNames()) == 1 })
	ask := func(prompt string) (result, int) {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
		r := post(p, "/v1/completions", string(body))
		var out struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		json.Unmarshal([]byte(r.body), &out)
		return r, out.Usage.PromptTokensDetails.CachedTokens
	}
	doc := strings.Repeat("The replica that served a prompt keeps its KV blocks. ", 100)
	first, _ := ask(doc)
	if first.status != 200 {
		t.Fatalf("%d %s", first.status, first.body)
	}
	for i := 1; i <= 3; i++ {
		doc += fmt.Sprintf(" Turn %d adds a little more text.", i)
		r, cached := ask(doc)
		if r.status != 200 || r.replica != first.replica || r.route != "pinned" || cached == 0 {
			t.Fatalf("extension %d: %d on %s (%s), %d cached tokens; want %s pinned and cached", i, r.status, r.replica, r.route, cached, first.replica)
		}
	}
	if r, _ := ask("An unrelated prompt. " + strings.Repeat("x", 3000)); r.route != "spread" {
		t.Fatalf("a new prompt: route %s", r.route)
	}
}
