package benchmarks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/engine"
	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/benchmarks/workload"
)

// calibration is what one engine's requests showed: per request, the
// prompt tokens, those found cached, and the time to first token.
type calibration struct {
	prompt, cached int
	ttft           float64 // ms: the engine's prefill clock (llama-server's timings.prompt_ms, the simulator's sim.ttft_ms)
	decode         float64 // ms per generated token after the first (llama-server's only)
}

// freshConns opens a connection for each request: llama-server closes
// its connections under a client that keeps them (engineEnv).
var freshConns = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// measure sends one whole (not streamed) chat request to an engine's base
// URL and reads its own account of it.
func measure(base string, msgs []workload.Message, outTokens int) (calibration, error) {
	body := workload.Body(engine.Model, msgs, false, outTokens)
	body = append(body[:len(body)-1], `,"ignore_eos":true}`...)
	resp, err := freshConns.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return calibration{}, err
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			Sim struct {
				TTFTMs float64 `json:"ttft_ms"`
			}
		}
		Timings *struct {
			PromptMs    float64 `json:"prompt_ms"`
			PredictedMs float64 `json:"predicted_ms"`
			PredictedN  int     `json:"predicted_n"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return calibration{}, err
	}
	if resp.StatusCode != 200 {
		return calibration{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	c := calibration{prompt: out.Usage.PromptTokens, cached: out.Usage.PromptTokensDetails.CachedTokens, ttft: out.Usage.Sim.TTFTMs}
	if t := out.Timings; t != nil {
		c.ttft = t.PromptMs
		if t.PredictedN > 1 {
			c.decode = t.PredictedMs / float64(t.PredictedN)
		}
	}
	return c, nil
}

// calibrationPrompt is a fresh conversation of about n bytes: salt makes
// it share no prefix with any earlier one.
func calibrationPrompt(salt string, n int) []workload.Message {
	msgs := workload.AgentContext(int64(len(salt)*7919+n), n)
	msgs[0].Content = salt + msgs[0].Content
	return msgs
}

// Sizes of the calibration's prompts, in bytes of context: three cold
// prefills to fit the engine's prefill cost, and one conversation whose
// second turn adds warmAdd bytes to a warmContext-byte first turn.
var (
	coldSizes                    = []int{1_000, 4_000, 8_000}
	warmContext, warmAdd         = 8_000, 800
	calibrationBand      float64 = 2
)

// engineRun measures at base: each cold prefill, then the conversation's
// cold first turn and its warm second turn.
func engineRun(base, salt string) (cold []calibration, first, second calibration, err error) {
	for _, n := range coldSizes {
		c, err := measure(base, calibrationPrompt(salt, n), 16)
		if err != nil {
			return nil, first, second, err
		}
		cold = append(cold, c)
	}
	msgs := calibrationPrompt(salt+"conversation ", warmContext)
	if first, err = measure(base, msgs, 16); err != nil {
		return
	}
	msgs = append(msgs, workload.Message{Role: "assistant", Content: "Done."},
		workload.Message{Role: "user", Content: workload.Text(99, warmAdd)})
	second, err = measure(base, msgs, 16)
	return
}

// fitPrefill fits the simulator's prefill model, a per-token cost and an
// attention cost that grows with the context before each token, to cold
// prefills of p tokens that took t ms: t = a*p + c*p*p/2000, least squares.
func fitPrefill(p []int, t []float64) (perToken, attention time.Duration) {
	var s11, s12, s22, r1, r2 float64
	for i := range p {
		x1, x2 := float64(p[i]), float64(p[i])*float64(p[i])/2000
		s11, s12, s22 = s11+x1*x1, s12+x1*x2, s22+x2*x2
		r1, r2 = r1+x1*t[i], r2+x2*t[i]
	}
	det := s11*s22 - s12*s12
	a, c := (r1*s22-r2*s12)/det, (s11*r2-s12*r1)/det
	switch {
	case c < 0: // no visible attention cost: per token only
		a, c = r1/s11, 0
	case a < 0: // attention only
		a, c = 0, r2/s22
	}
	ms := float64(time.Millisecond)
	return time.Duration(a * ms), time.Duration(c * ms)
}

// TestSimCalibration holds the simulator to a real engine. It measures
// llama-server's cold prefill at three prompt sizes and its decode rate,
// gives the simulator those rates (the fit uses cold prompts only), then
// runs one conversation on both: a cold first turn and a second turn that
// adds a little to it. What the simulator must then get right by itself is
// what routing is about: how much of the second turn is cached, and how
// much faster its first token comes than a cold one. Each must be within
// a factor of calibrationBand (2) of the engine's: the warm/cold TTFT
// ratio, and the share of the prompt not found cached.
func TestSimCalibration(t *testing.T) {
	dir := engine.Require(t)
	srv := engine.Start(t, dir, engine.Options{Slots: 1, Context: 32768})
	salt := newSalt()
	// A request first warms the process (allocations, page faults).
	if _, err := measure(srv.URL, calibrationPrompt(salt+"warm-up ", 4_000), 4); err != nil {
		t.Fatal(err)
	}
	// Each time is the least of three runs: the host's other work (a
	// -race run of other packages beside this one) only ever slows one.
	var runs [][]calibration
	for i := 0; i < 3; i++ {
		cold, first, second, err := engineRun(srv.URL, fmt.Sprintf("%s%d ", salt, i))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, append(cold, first, second))
	}
	least := make([]calibration, len(runs[0]))
	for k := range least {
		var v []calibration
		for _, r := range runs {
			v = append(v, r[k])
		}
		sort.Slice(v, func(i, j int) bool { return v[i].ttft < v[j].ttft })
		least[k] = v[0]
	}
	cold, first, second := least[:len(coldSizes)], least[len(coldSizes)], least[len(coldSizes)+1]
	// Decoding after the smallest prompt: the simulator's decode step
	// does not grow with the context.
	decode := cold[0].decode

	// The simulator counts tokens by bytes: its counts for the same
	// prompts, so that the fitted rates apply to its own tokens.
	probe, err := sim.NewReplica("127.0.0.1:0", simConfig(1e4))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Stop()
	var simTokens []int
	var ttfts []float64
	for i, n := range coldSizes {
		c, err := measure(probe.URL(), calibrationPrompt(salt, n), 1)
		if err != nil {
			t.Fatal(err)
		}
		simTokens, ttfts = append(simTokens, c.prompt), append(ttfts, cold[i].ttft)
	}
	cfg := simConfig(20)
	cfg.PrefillPerToken, cfg.PrefillAttention = fitPrefill(simTokens, ttfts)
	// One decode step of one sequence; llama-server prefills in one
	// step what the simulator's budget allows, so no step cost is added.
	cfg.StepBase, cfg.DecodePerSeq = 0, time.Duration(decode*float64(time.Millisecond))
	cfg.PrefillBudget = 1 << 20
	rep, err := sim.NewReplica("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Stop()
	_, sfirst, ssecond, err := engineRun(rep.URL(), salt)
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("llama-server: cold prefill %v tokens in %.0f/%.0f/%.0f ms; decode %.2f ms a token", []int{cold[0].prompt, cold[1].prompt, cold[2].prompt}, cold[0].ttft, cold[1].ttft, cold[2].ttft, decode)
	t.Logf("simulator fitted: PrefillPerToken %v, PrefillAttention %v (per 1k tokens of context), DecodePerSeq %v, on its own token counts %v", cfg.PrefillPerToken, cfg.PrefillAttention, cfg.DecodePerSeq, simTokens)
	realRatio, simRatio := second.ttft/first.ttft, ssecond.ttft/sfirst.ttft
	realMiss := 1 - float64(second.cached)/float64(second.prompt)
	simMiss := 1 - float64(ssecond.cached)/float64(ssecond.prompt)
	t.Logf("conversation: llama-server cold %.1f ms, warm %.1f ms (%d of %d cached): ratio %.3f; simulator cold %.1f ms, warm %.1f ms (%d of %d cached): ratio %.3f",
		first.ttft, second.ttft, second.cached, second.prompt, realRatio, sfirst.ttft, ssecond.ttft, ssecond.cached, ssecond.prompt, simRatio)
	if second.cached == 0 || ssecond.cached == 0 {
		t.Fatalf("the second turn found nothing cached (llama-server %d, simulator %d)", second.cached, ssecond.cached)
	}
	within := func(what string, sim, real float64) {
		if f := math.Abs(math.Log(sim / real)); f > math.Log(calibrationBand) {
			t.Errorf("%s: simulator %.3f, llama-server %.3f: more than %gx apart", what, sim, real, calibrationBand)
		}
	}
	within("warm/cold TTFT", simRatio, realRatio)
	within("uncached share of the warm prompt", simMiss, realMiss)
	// The fit reproduces the cold prefill it was fitted to.
	within("cold TTFT of the conversation, ms", sfirst.ttft, first.ttft)
}
