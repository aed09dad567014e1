package benchmarks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// env is two (or more) simulated replicas behind a real warmroute listener.
type env struct {
	sims  []*sim.Replica
	proxy string // base URL of warmroute
	scale float64
	http  *http.Client
	// warmPrefill is the prompt tokens that agentLoop's warm turns did
	// not find cached, as the engines counted them: exact whatever the
	// host's load.
	warmPrefill int
	urls        []string // the replicas' base URLs
	real        bool     // real replicas: TTFT on the client's clock, requests prepared
	model       string   // the model a real replica serves
	salt        string   // opens every prompt's first message on real replicas
	runs        runLog   // the requests sent through the proxy, for report
	fit         *fit     // the real replicas' context, nil when none publishes one
}

func startEnv(tb testing.TB, policy router.Policy, replicas int, cfg sim.Config) *env {
	tb.Helper()
	return startEnvUp(tb, policy, upstream.Config{}, replicas, cfg)
}

// startEnvUp is startEnv with the replica set's config.
func startEnvUp(tb testing.TB, policy router.Policy, ucfg upstream.Config, replicas int, cfg sim.Config) *env {
	tb.Helper()
	return startEnvWith(tb, router.Config{Policy: policy}, ucfg, replicas, cfg)
}

// startEnvWith is startEnvUp with the proxy's whole config.
func startEnvWith(tb testing.TB, rcfg router.Config, ucfg upstream.Config, replicas int, cfg sim.Config) *env {
	tb.Helper()
	if b, ok := tb.(*testing.B); ok && len(upstreams()) > 0 {
		return startReplicaEnv(b, rcfg, ucfg, upstreams(), benchModel())
	}
	cluster, err := sim.StartCluster(replicas, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cluster.Close)
	in := startInstanceUp(tb, rcfg, ucfg, cluster.URLs(), "")
	return &env{sims: cluster.Replicas, proxy: in.url, scale: cfg.TimeScale, urls: cluster.URLs(),
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
}

// turnResult is one streamed request as the client saw it.
type turnResult struct {
	engineTTFT float64 // ms, the engine's own clock (real scale)
	latency    float64 // ms, arrival to last token on the engine's clock
	clientTTFT float64 // ms, the client's wall clock times the time scale
	cached     int
	prompt     int    // prompt tokens, as the engine counted them
	route      string // X-Warmroute-Route
	replica    string // X-Warmroute-Replica
	reply      string
	start, end time.Time
	itl        []float64 // ms between content chunks, the client's clock times the scale
}

// chat sends one streamed chat request to base and reads it to the end.
// On real replicas whose context is known, a request that would not fit
// has its max_tokens capped, or is not sent: errTooLong.
func (e *env) chat(base string, body []byte) (turnResult, error) {
	return e.chatSeen(base, body, nil)
}

// chatSeen is chat that calls first, when not nil, as the first token
// arrives.
func (e *env) chatSeen(base string, body []byte, first func()) (turnResult, error) {
	return e.chatWith(base, body, nil, first)
}

// chatWith is chatSeen with the headers hdr (name, value, ...): an agent's
// session headers.
func (e *env) chatWith(base string, body []byte, hdr []string, first func()) (turnResult, error) {
	body = e.prepare(body)
	if e.fit != nil {
		var ok bool
		if body, ok = e.fit.apply(body); !ok {
			return turnResult{}, errTooLong
		}
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return turnResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	resp, err := e.http.Do(req)
	if err != nil {
		return turnResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return turnResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	r := turnResult{route: resp.Header.Get("X-Warmroute-Route"), replica: resp.Header.Get("X-Warmroute-Replica"), start: start}
	var last time.Time
	var reply strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line, []byte("data: [DONE]")) {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct{ Content string }
			}
			Usage *sim.Usage
		}
		if err := json.Unmarshal(line[6:], &ev); err != nil {
			return r, err
		}
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			now := time.Now()
			if r.clientTTFT == 0 {
				r.clientTTFT = float64(now.Sub(start)) / float64(time.Millisecond) * e.scale
				if first != nil {
					first()
				}
			} else {
				r.itl = append(r.itl, float64(now.Sub(last))/float64(time.Millisecond)*e.scale)
			}
			last = now
			reply.WriteString(ev.Choices[0].Delta.Content)
		}
		if ev.Usage != nil {
			r.engineTTFT = ev.Usage.Sim.TTFTMs
			r.latency = ev.Usage.Sim.LatencyMs
			r.cached = ev.Usage.PromptTokensDetails.CachedTokens
			r.prompt = ev.Usage.PromptTokens
		}
	}
	r.reply, r.end = reply.String(), time.Now()
	if e.fit != nil {
		e.fit.learn(len(body), r.prompt)
	}
	if e.real {
		// A real engine reports no clock of its own in usage.
		r.engineTTFT, r.latency = r.clientTTFT, float64(r.end.Sub(start))/float64(time.Millisecond)
	}
	if base == e.proxy {
		e.runs.add(r)
	}
	return r, sc.Err()
}

func streamBody(msgs []workload.Message, maxTokens int) []byte {
	b := workload.Body("sim-30b", msgs, true, maxTokens)
	return append(b[:len(b)-1], `,"stream_options":{"include_usage":true}}`...)
}

// agentLoop runs sessions concurrently, each turns long: a context of
// contextBytes, then each turn adds the reply and addBytes of tool output.
// It returns the engine TTFT of every warm turn (turn 2 on), in ms.
func (e *env) agentLoop(seed int64, sessions, turns, contextBytes, addBytes, outTokens int) ([]float64, [][]float64, error) {
	var mu sync.Mutex
	var warm []float64
	perTurn := make([][]float64, sessions)
	var firstErr error
	var wg sync.WaitGroup
	for s := 0; s < sessions; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			msgs := workload.AgentContext(seed+int64(s), contextBytes)
			for t := 0; t < turns; t++ {
				r, err := e.chat(e.proxy, streamBody(msgs, outTokens))
				if errors.Is(err, errTooLong) {
					return // the conversation outgrew the replicas' context
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				perTurn[s] = append(perTurn[s], r.engineTTFT)
				if t > 0 {
					warm = append(warm, r.engineTTFT)
					e.warmPrefill += r.prompt - r.cached
				}
				mu.Unlock()
				if err != nil {
					return
				}
				msgs = append(msgs, workload.Message{Role: "assistant", Content: r.reply},
					workload.Message{Role: "user", Content: workload.Text(seed*131+int64(s*100+t), addBytes)})
			}
		}(s)
	}
	wg.Wait()
	return warm, perTurn, firstErr
}

// burst sends n fresh requests at once that share a system prompt, and
// returns the makespan in real-scale seconds: the longest engine latency,
// since all n arrive together, and the client's wall clock times the scale.
func (e *env) burst(seed int64, n, systemBytes, userBytes, outTokens int) (engine, client float64, err error) {
	system := "You are a subagent. " + workload.Text(seed, systemBytes)
	start := time.Now()
	type res struct {
		r   turnResult
		err error
	}
	done := make(chan res, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			msgs := []workload.Message{{Role: "system", Content: system}, {Role: "user", Content: workload.Text(seed*7919+int64(i), userBytes)}}
			r, err := e.chat(e.proxy, streamBody(msgs, outTokens))
			done <- res{r, err}
		}(i)
	}
	for i := 0; i < n; i++ {
		r := <-done
		if r.err != nil && err == nil {
			err = r.err
		}
		engine = max(engine, r.r.latency/1000)
	}
	return engine, time.Since(start).Seconds() * e.scale, err
}

// subagents runs a burst of n subagents that share a system prompt, each
// for turns turns, and returns their warm-turn engine TTFTs.
func (e *env) subagents(seed int64, n, turns, systemBytes, userBytes, addBytes, outTokens int) ([]float64, error) {
	system := "You are a subagent. " + workload.Text(seed, systemBytes)
	var mu sync.Mutex
	var all []float64
	var firstErr error
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			msgs := []workload.Message{{Role: "system", Content: system}, {Role: "user", Content: workload.Text(seed*7919+int64(i), userBytes)}}
			for t := 0; t < turns; t++ {
				r, err := e.chat(e.proxy, streamBody(msgs, outTokens))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				all = append(all, r.engineTTFT)
				mu.Unlock()
				if err != nil {
					return
				}
				msgs = append(msgs, workload.Message{Role: "assistant", Content: r.reply},
					workload.Message{Role: "user", Content: workload.Text(seed*31+int64(i*10+t), addBytes)})
			}
		}(i)
	}
	wg.Wait()
	return all, firstErr
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(p/100*float64(len(s)-1) + 0.5)
	return s[i]
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
