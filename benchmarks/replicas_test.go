package benchmarks

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// The benchmarks run against the simulator unless -upstream names real
// replicas: then each policy's run goes through an in-process warmroute in
// front of them, and TTFT is measured on the client's clock.
var (
	upstreamFlag  = flag.String("upstream", "", "comma-separated base URLs of real replicas (vLLM, SGLang, llama-server) for the benchmarks, instead of the simulator")
	modelFlag     = flag.String("model", "", "the model to request from the -upstream replicas (default: the first one /v1/models lists)")
	cacheReset    = flag.String("cache-reset", "salt", "how the -upstream replicas' caches are kept from carrying over between policy runs: salt (a random prefix opens each run's prompts) or engine (vLLM's /reset_prefix_cache, SGLang's /flush_cache)")
	upstreamIdle  = flag.Duration("upstream-keepalive-timeout", 0, "warmroute's -upstream-keepalive-timeout for the -upstream replicas (0: its default); 1ns reuses no connection")
	workloadScale = flag.Float64("workload-scale", 1, "multiplies the workloads' prompt sizes: below 1 for replicas whose context or speed is smaller than the seed's 30B on a GPU")
)

// upstreams returns the -upstream replicas, none for the simulator.
func upstreams() []string {
	if *upstreamFlag == "" {
		return nil
	}
	var urls []string
	for _, u := range strings.Split(*upstreamFlag, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

var served struct {
	once  sync.Once
	model string
	err   error
}

// ranOn says what the benchmarks ran on, for their tables' captions.
func ranOn() string {
	if urls := upstreams(); len(urls) > 0 {
		return fmt.Sprintf("real replicas %s, TTFT on the client's clock, prompts scaled by %g", strings.Join(urls, ","), *workloadScale)
	}
	return fmt.Sprintf("simulated replicas, time scale %g, TTFT on the engines' clocks", *simScale)
}

// benchModel is the model that the benchmarks' requests name: the
// simulator's, -model, or the first that the first replica lists.
func benchModel() string {
	urls := upstreams()
	if len(urls) == 0 {
		return "sim-30b"
	}
	if *modelFlag != "" {
		return *modelFlag
	}
	served.once.Do(func() {
		resp, err := http.Get(urls[0] + "/v1/models")
		if err != nil {
			served.err = err
			return
		}
		defer resp.Body.Close()
		var list struct{ Data []struct{ ID string } }
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
			served.err = fmt.Errorf("%s/v1/models lists no model (%v): give -model", urls[0], err)
			return
		}
		served.model = list.Data[0].ID
	})
	if served.err != nil {
		panic(served.err)
	}
	return served.model
}

var announce sync.Once

// startReplicaEnv puts an in-process warmroute of config rcfg in front of
// the replicas at urls, which serve model. So that one policy's run does
// not find what the run before it left in the replicas' caches, it salts
// the run's prompts or resets the engines' caches (-cache-reset).
func startReplicaEnv(tb testing.TB, rcfg router.Config, ucfg upstream.Config, urls []string, model string) *env {
	tb.Helper()
	// The client opens a connection for each request: it sends some
	// straight to the replicas (BenchmarkProxyOverhead), and llama-server
	// closes a connection after each stream without saying so. On
	// loopback that costs tens of microseconds a request, the same under
	// every policy.
	e := &env{scale: 1, urls: urls, real: true, model: model,
		http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	switch *cacheReset {
	case "salt":
		e.salt = newSalt()
	case "engine":
		for _, u := range urls {
			if err := resetCache(e.http, u); err != nil {
				tb.Fatal(err)
			}
		}
	default:
		tb.Fatalf("-cache-reset %q: want salt or engine", *cacheReset)
	}
	announce.Do(func() {
		how := "salted prompts (a random prefix opens the first message of each policy run's requests)"
		if e.salt == "" {
			how = "the engines' caches reset before each policy run"
		}
		fmt.Printf("replicas: %s; model %s; TTFT on the client's clock; between policy runs: %s\n", strings.Join(urls, ","), model, how)
	})
	if ucfg.IdleTimeout == 0 {
		ucfg.IdleTimeout = *upstreamIdle
	}
	in := startInstanceUp(tb, rcfg, ucfg, urls, "")
	e.proxy = in.url
	e.fit = fitOf(e.http, urls, model)
	return e
}

// newSalt returns a prefix that no earlier run's prompt began with.
func newSalt() string {
	var b [8]byte
	rand.Read(b[:])
	return "[run " + hex.EncodeToString(b[:]) + "] "
}

// resetCache empties a replica's prefix cache through the endpoint its
// engine offers: vLLM's POST /reset_prefix_cache, SGLang's POST
// /flush_cache.
func resetCache(c *http.Client, base string) error {
	var tried []string
	for _, path := range []string{"/reset_prefix_cache", "/flush_cache"} {
		resp, err := c.Post(base+path, "application/json", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil
		}
		tried = append(tried, fmt.Sprintf("%s %d", path, resp.StatusCode))
	}
	return fmt.Errorf("%s resets no cache (%s): use -cache-reset salt", base, strings.Join(tried, ", "))
}

// prepare readies a request of the workloads, written for the simulator,
// for real replicas: it names their model, puts the env's salt at the
// start of the first message, and asks for ignore_eos (vLLM, SGLang and
// llama.cpp take it), so that every reply has the length the workload asks
// for, as in the simulator, whatever the model writes.
func (e *env) prepare(body []byte) []byte {
	if !e.real {
		return body
	}
	if i := bytes.Index(body, []byte(`"model":"`)); i >= 0 {
		i += len(`"model":"`)
		if n := bytes.IndexByte(body[i:], '"'); n >= 0 {
			body = splice(body, i, i+n, e.model)
		}
	}
	if i := bytes.Index(body, []byte(`"content":"`)); i >= 0 {
		i += len(`"content":"`)
		body = splice(body, i, i, e.salt)
	}
	return splice(body, len(body)-1, len(body)-1, `,"ignore_eos":true`)
}

// splice returns a copy of b with b[i:j] replaced by s.
func splice(b []byte, i, j int, s string) []byte {
	out := make([]byte, 0, len(b)-(j-i)+len(s))
	return append(append(append(out, b[:i]...), s...), b[j:]...)
}

// benchShape is the benchmarks' shape, its prompts scaled by
// -workload-scale.
func benchShape() shape {
	s, f := full, *workloadScale
	s.contextBytes = int(float64(s.contextBytes) * f)
	s.addBytes = int(float64(s.addBytes) * f)
	s.burstSystem = int(float64(s.burstSystem) * f)
	s.burstUser = int(float64(s.burstUser) * f)
	return s
}

// benchWorkloads are BenchmarkPolicies' workloads, their prompts scaled by
// -workload-scale. Real replicas run those that need no knob of the
// simulator: not eviction (a KV size), foreign (a batch sent to the
// simulator) nor a replica count other than the one given.
func benchWorkloads() []workloadSpec {
	var out []workloadSpec
	n := len(upstreams())
	for _, w := range workloads(false) {
		if n > 0 && (w.kv > 0 || w.batch > 0 || w.replicas != n) {
			continue
		}
		f := *workloadScale
		convs := make([]conversation, len(w.convs))
		for i, c := range w.convs {
			c.context, c.add = int(float64(c.context)*f), int(float64(c.add)*f)
			c.shared = scaled(c.shared, f)
			convs[i] = c
		}
		w.convs = convs
		out = append(out, w)
	}
	return out
}

// scaled returns s cut or repeated to f times its length.
func scaled(s string, f float64) string {
	n := int(float64(len(s)) * f)
	for len(s) > 0 && len(s) < n {
		s += s
	}
	return s[:min(n, len(s))]
}

// runLog holds what every request through the proxy saw.
type runLog struct {
	mu   sync.Mutex
	runs []turnResult
}

func (l *runLog) add(r turnResult) {
	r.reply = ""
	l.mu.Lock()
	l.runs = append(l.runs, r)
	l.mu.Unlock()
}

// report reports the figures every benchmark shares, over every request it
// sent through the proxy: TTFT p50 and p90 (the engine's clock on the
// simulator, the client's on real replicas), the client's inter-token gap
// p50, the makespan from the first send to the last token, and the share
// of prompt tokens that the engines reported cached
// (usage.prompt_tokens_details.cached_tokens). A benchmark that reports a
// figure of the same name after it (its own makespan, the TTFT of later
// turns only) replaces it.
func (e *env) report(b *testing.B) {
	e.runs.mu.Lock()
	defer e.runs.mu.Unlock()
	var ttft, itl []float64
	var first, last time.Time
	prompt, cached := 0, 0
	for _, r := range e.runs.runs {
		ttft = append(ttft, r.engineTTFT)
		itl = append(itl, r.itl...)
		if first.IsZero() || r.start.Before(first) {
			first = r.start
		}
		if r.end.After(last) {
			last = r.end
		}
		prompt += r.prompt
		cached += r.cached
	}
	b.ReportMetric(percentile(ttft, 50), "ttft-p50-ms")
	b.ReportMetric(percentile(ttft, 90), "ttft-p90-ms")
	b.ReportMetric(percentile(itl, 50), "itl-p50-ms")
	b.ReportMetric(last.Sub(first).Seconds()*e.scale, "makespan-s")
	if prompt > 0 {
		b.ReportMetric(float64(cached)/float64(prompt), "cached-share")
	}
	e.reportFit(b)
}
