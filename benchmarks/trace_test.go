package benchmarks

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/benchmarks/trace"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// BenchmarkTrace replays a Mooncake-format trace (benchmarks/trace): its
// requests arrive on the trace's clock (times -trace-time), rendered as
// chat one way or both (-trace-render), through an in-process warmroute
// under each policy and through the peers' rules (SGLang's cache-aware
// rule and llm-d's approximate prefix scorer, over 64-byte chunks of the
// text, peerRouter), to simulated replicas of -trace-kv tokens of KV
// each, or to the -upstream replicas. The defaults: the first 600
// requests of the checked-in conversation trace at half their length and
// 0.88 of their pace, which keeps two simulated replicas about 90% busy
// with prefill (traceLoad), with KV for the whole window (4M tokens) and
// with 500k.
var (
	traceFile     = flag.String("trace", "traces/mooncake-conversation.jsonl.gz", "BenchmarkTrace: the Mooncake-format trace to replay (.jsonl or .jsonl.gz)")
	traceStart    = flag.Int("trace-start", 0, "BenchmarkTrace: the first request of the window")
	traceCount    = flag.Int("trace-count", 600, "BenchmarkTrace: the window's requests at most (0: no limit)")
	traceDuration = flag.Duration("trace-window", 0, "BenchmarkTrace: the window's span at most, on the trace's clock (0: no limit)")
	traceTime     = flag.Float64("trace-time", 0.88, "BenchmarkTrace: multiplies the trace's arrival times (below 1: faster arrivals)")
	traceLength   = flag.Float64("trace-length", 0.5, "BenchmarkTrace: multiplies the trace's prompt and answer lengths")
	traceKV       = flag.String("trace-kv", "4000000,500000", "BenchmarkTrace: KV cache tokens per simulated replica, a run for each value of the list")
	traceReplicas = flag.Int("trace-replicas", 2, "BenchmarkTrace: simulated replicas")
	traceRender   = flag.String("trace-render", "both", "BenchmarkTrace: chat (turns reconstructed as conversations), single (each prompt one message) or both")
)

// traceRouters are the rows of the trace table: ours through warmroute,
// the peers' rules through a peerRouter.
var traceRouters = []router.Policy{router.Cost, router.Adaptive, router.Affinity, router.RoundRobin, newSGLang(), newLLMDApprox()}

// renderingName is a rendering's name in flags and tables.
func renderingName(r trace.Rendering) string {
	if r == trace.Turns {
		return "chat"
	}
	return "single"
}

func traceRenderings() ([]trace.Rendering, error) {
	switch *traceRender {
	case "chat":
		return []trace.Rendering{trace.Turns}, nil
	case "single":
		return []trace.Rendering{trace.OnePrompt}, nil
	case "both":
		return trace.Renderings[:], nil
	}
	return nil, fmt.Errorf("-trace-render %q: want chat, single or both", *traceRender)
}

// traceKVs are the -trace-kv sizes; on -upstream replicas, one run on
// their own (0).
func traceKVs() ([]int, error) {
	if len(upstreams()) > 0 {
		return []int{0}, nil
	}
	var out []int
	for _, s := range strings.Split(*traceKV, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-trace-kv %q: want a list of token counts", *traceKV)
		}
		out = append(out, n)
	}
	return out, nil
}

// traceWindow loads the trace and cuts its window.
var traceWindow = sync.OnceValues(func() ([]trace.Request, error) {
	all, err := trace.Load(*traceFile)
	if err != nil {
		return nil, err
	}
	w := trace.Window(all, *traceStart, *traceCount, *traceDuration)
	if len(w) == 0 {
		return nil, fmt.Errorf("%s: no request from the %d-th on", *traceFile, *traceStart)
	}
	return w, nil
})

// traceRun is one replay under one router.
type traceRun struct {
	ttfts          []float64 // ms
	prompt, cached int       // tokens, as the replicas counted them
	sent, skipped  int
	capped         int
	// busy is the simulated replicas' mean share of the run's time that
	// went to steps that prefilled (sim.Replica.PrefillBusy); 0 on real
	// replicas.
	busy float64
}

func kvName(kv int) string {
	switch {
	case kv == 0:
		return "replicas"
	case kv%1_000_000 == 0:
		return fmt.Sprintf("kv%dM", kv/1_000_000)
	case kv%1_000 == 0:
		return fmt.Sprintf("kv%dk", kv/1_000)
	}
	return fmt.Sprintf("kv%d", kv)
}

func BenchmarkTrace(b *testing.B) {
	reqs, err := traceWindow()
	if err != nil {
		b.Fatal(err)
	}
	renderings, err := traceRenderings()
	if err != nil {
		b.Fatal(err)
	}
	kvs, err := traceKVs()
	if err != nil {
		b.Fatal(err)
	}
	reach := trace.Reachable(reqs)
	// A trace token is -trace-length tokens of text: the simulator's
	// BytesPerToken bytes each.
	bytesPerToken := *traceLength * float64(sim.DefaultConfig().BytesPerToken)
	for _, kv := range kvs {
		for _, how := range renderings {
			msgs := trace.Render(reqs, how, bytesPerToken)
			for _, p := range traceRouters {
				key := traceKey{kv: kv, rendering: renderingName(how), router: p.String()}
				b.Run(kvName(kv)+"/"+key.rendering+"/"+key.router, func(b *testing.B) {
					for b.Loop() {
						run, err := replayTrace(b, p, kv, *traceReplicas, simConfig(*simScale), *traceTime, *traceLength, reqs, msgs)
						if err != nil {
							b.Fatal(err)
						}
						traceTable.add(key, run)
						b.ReportMetric(percentile(run.ttfts, 50), "ttft-p50-ms")
						b.ReportMetric(percentile(run.ttfts, 90), "ttft-p90-ms")
						b.ReportMetric(percentile(run.ttfts, 99), "ttft-p99-ms")
						b.ReportMetric(mean(run.ttfts), "ttft-mean-ms")
						b.ReportMetric(run.share(), "cached-share")
						b.ReportMetric(reach.Share(), "best-share")
						b.ReportMetric(float64(run.skipped), "skipped")
						b.ReportMetric(float64(run.capped), "capped")
						if run.busy > 0 {
							b.ReportMetric(run.busy, "prefill-busy")
						}
					}
				})
			}
		}
	}
	traceTable.setWindow(reqs, reach)
}

func (r traceRun) share() float64 {
	if r.prompt == 0 {
		return 0
	}
	return float64(r.cached) / float64(r.prompt)
}

// replayTrace sends reqs, rendered, on the trace's clock times timeScale,
// each answer lengthScale times the trace's, to replicas of kv tokens of
// KV (simulated with cfg, or the -upstream ones in a benchmark): through
// an in-process warmroute under p, or a peerRouter when p is a peer's
// rule.
func replayTrace(tb testing.TB, p router.Policy, kv, replicas int, cfg sim.Config, timeScale, lengthScale float64, reqs []trace.Request, rendered trace.Rendered) (traceRun, error) {
	if kv > 0 {
		cfg.KVCapacityTokens = kv
	}
	var peer *peerRouter
	proxyPolicy := p
	switch p.(type) {
	case sglangPolicy, llmdApproxPolicy:
		// The proxy is started but not used: the peer's rule routes.
		proxyPolicy = router.RoundRobin
	}
	e := startEnvWith(tb, router.Config{Policy: proxyPolicy}, upstream.Config{}, replicas, cfg)
	if proxyPolicy != p {
		peer = newPeerRouter(p.(interface{ fresh() router.Policy }).fresh(), len(e.urls))
	}
	var capped0 int64
	if e.fit != nil {
		capped0 = e.fit.capped.Load()
	}
	var (
		mu       sync.Mutex
		run      traceRun
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for i, q := range reqs {
		at := time.Duration(float64(q.At) * timeScale / e.scale)
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		body := streamBody(rendered.Messages[i], max(int(float64(q.Output)*lengthScale+0.5), 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r turnResult
			var err error
			if peer != nil {
				replica, first, done := peer.route(chatText(rendered.Messages[i]))
				r, err = e.chatSeen(e.urls[replica], body, first)
				done()
			} else {
				r, err = e.chat(e.proxy, body)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, errTooLong):
				run.skipped++
			case err != nil:
				if firstErr == nil {
					firstErr = fmt.Errorf("request %d: %w", i, err)
				}
			default:
				run.sent++
				run.ttfts = append(run.ttfts, r.engineTTFT)
				run.prompt += r.prompt
				run.cached += r.cached
			}
		}()
	}
	wg.Wait()
	for _, r := range e.sims {
		run.busy += r.PrefillBusy() / float64(len(e.sims))
	}
	if e.fit != nil {
		run.capped = int(e.fit.capped.Load() - capped0)
	}
	return run, firstErr
}

// traceKey names a row of the trace table.
type traceKey struct {
	kv        int
	rendering string
	router    string
}

// traceResults holds the replays of the run, for the table that TestMain
// prints.
type traceResults struct {
	sync.Mutex
	runs  map[traceKey]traceRun
	order []traceKey
	reqs  []trace.Request
	reach trace.Reach
}

var traceTable = traceResults{runs: map[traceKey]traceRun{}}

// add keeps a replay; a second one of the same row replaces the first.
func (t *traceResults) add(k traceKey, r traceRun) {
	t.Lock()
	defer t.Unlock()
	if _, ok := t.runs[k]; !ok {
		t.order = append(t.order, k)
	}
	t.runs[k] = r
}

func (t *traceResults) setWindow(reqs []trace.Request, reach trace.Reach) {
	t.Lock()
	t.reqs, t.reach = reqs, reach
	t.Unlock()
}

// traceLoad estimates the share of the replicas' time that the window's
// prefill takes with the simulator's cost model (sim.DefaultConfig), each
// prompt's reachable prefix cached (trace.Reachable's blocks), at
// -trace-length and -trace-time: what the replay offers them, whichever
// router spreads it.
func traceLoad(reqs []trace.Request, replicas int) float64 {
	cfg := sim.DefaultConfig()
	span := trace.Span(reqs).Seconds() * *traceTime
	if span <= 0 || replicas < 1 {
		return 0
	}
	perToken, attention := cfg.PrefillPerToken.Seconds(), cfg.PrefillAttention.Seconds()/1000
	cached := trace.CachedPrefixes(reqs)
	work := 0.0
	for i, q := range reqs {
		a, b := float64(cached[i])**traceLength, float64(q.Input)**traceLength
		work += (b-a)*perToken + attention*(b*b-a*a)/2
	}
	return work / (span * float64(replicas))
}

// renderTraceTable renders the replays: per KV size and rendering, each
// router's TTFT and the cached share of prompt tokens that the replicas
// reported, beside the best share any router could reach.
func renderTraceTable() string {
	t := &traceTable
	t.Lock()
	defer t.Unlock()
	if len(t.order) == 0 {
		return ""
	}
	var b strings.Builder
	best := t.reach.Share()
	fmt.Fprintf(&b, "Window: %d requests over %.0f s of the trace, times %g (%.0f s), lengths times %g; %d simulated replicas whose prefill alone would keep them %.0f%% busy (estimated, every reachable prefix cached); ",
		len(t.reqs), trace.Span(t.reqs).Seconds(), *traceTime, trace.Span(t.reqs).Seconds()**traceTime, *traceLength,
		*traceReplicas, 100*traceLoad(t.reqs, *traceReplicas))
	fmt.Fprintf(&b, "best reachable cached share %.1f%%; the window's distinct prompt tokens %.2fM at this length.\n\n",
		100*best, float64(t.reach.Distinct)**traceLength/1e6)
	b.WriteString("| KV per replica | rendering | router | cached share | of best | TTFT p50 s | TTFT p90 s | TTFT p99 s | TTFT mean s | prefill busy | sent | skipped | capped |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	sec := func(ms float64) string { return fmt.Sprintf("%.2f", ms/1000) }
	for _, k := range t.order {
		r := t.runs[k]
		ofBest := "-"
		if best > 0 {
			ofBest = fmt.Sprintf("%.0f%%", 100*r.share()/best)
		}
		kv := "the replicas'"
		if k.kv > 0 {
			kv = strings.TrimPrefix(kvName(k.kv), "kv")
		}
		busy := "-"
		if r.busy > 0 {
			busy = fmt.Sprintf("%.0f%%", 100*r.busy)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f%% | %s | %s | %s | %s | %s | %s | %d | %d | %d |\n", kv, k.rendering, k.router,
			100*r.share(), ofBest, sec(percentile(r.ttfts, 50)), sec(percentile(r.ttfts, 90)), sec(percentile(r.ttfts, 99)),
			sec(mean(r.ttfts)), busy, r.sent, r.skipped, r.capped)
	}
	return b.String()
}

// A small window replayed through warmroute and through a peer's rule:
// every request is answered, and the replicas report their prompts. The
// benchmark alone replays windows of measuring size.
func TestTraceReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("replays a trace on simulated replicas")
	}
	all, err := trace.Load("traces/mooncake-conversation.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	reqs := trace.Window(all, 0, 40, 0)
	for _, how := range trace.Renderings {
		rendered := trace.Render(reqs, how, 0.1)
		for _, p := range []router.Policy{router.Cost, newSGLang(), newLLMDApprox()} {
			run, err := replayTrace(t, p, 100_000, 2, simConfig(400), 0.05, 0.02, reqs, rendered)
			if err != nil {
				t.Fatalf("%s, %s: %v", renderingName(how), p, err)
			}
			if run.sent != len(reqs) || len(run.ttfts) != len(reqs) || run.prompt < len(reqs) || run.skipped+run.capped != 0 {
				t.Fatalf("%s, %s: %+v", renderingName(how), p, run)
			}
		}
	}
}
