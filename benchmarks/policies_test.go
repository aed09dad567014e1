package benchmarks

import (
	"flag"
	"fmt"
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

var policyRuns = flag.Int("policy-runs", 1, "runs of each workload and policy in BenchmarkPolicies (the report uses 3)")

// allPolicies are ours and the peers' baselines, measured side by side.
var allPolicies = []router.Policy{router.RoundRobin, router.Affinity, router.Adaptive, router.Cost,
	router.SGLang, router.LLMD, router.LeastLoad, router.PowerOfTwo}

// variant is one row label of the policy table: a policy, and whether the
// proxy reads the replicas' own queues (-scrape-interval).
type variant struct {
	policy router.Policy
	scrape bool
}

func (v variant) String() string {
	if v.scrape {
		return v.policy.String() + "+scrape"
	}
	return v.policy.String()
}

// variants are the policy table's rows: every policy, and cost with the
// replicas' queues read every scrapeEvery (real scale).
func variants() []variant {
	var vs []variant
	for _, p := range allPolicies {
		vs = append(vs, variant{policy: p})
		if p == router.Cost {
			vs = append(vs, variant{policy: p, scrape: true})
		}
	}
	return vs
}

const scrapeEvery = 250 * time.Millisecond

// start starts the variant's proxy in front of w's replicas.
func (v variant) start(tb testing.TB, w workloadSpec, scale float64) *env {
	var ucfg upstream.Config
	if v.scrape {
		ucfg.ScrapeInterval = time.Duration(float64(scrapeEvery) / scale)
	}
	return startEnvUp(tb, v.policy, ucfg, w.replicas, w.config(scale))
}

// conversation is one agent session of a workload: a system prompt (shared
// with others when shared is set), a context, turns that each add a reply
// and add bytes of tool output, and fanout parallel requests per turn (the
// forks of an agent that runs tool calls or subagents on one context).
type conversation struct {
	seed          int64
	shared        string // a system prompt shared with other conversations, or ""
	context, add  int
	turns, fanout int
	delay         float64 // real-scale seconds after the start
}

// workloadSpec is one row of the policy table.
type workloadSpec struct {
	name     string
	replicas int
	kv       int // KV cache tokens per replica; 0 for the default
	out      int // output tokens per request
	convs    []conversation
	// maxRunning caps each replica's batch (0: the default, 256); batch
	// keeps that many requests of other callers in flight on replica 0
	// all along, sent to it directly (another proxy, a batch job): the
	// load that the proxy does not see.
	maxRunning, batch int
}

// workloads returns the policy table's workloads; small shrinks them for
// TestRoutingEffects (sizes and counts, never the shape).
func workloads(small bool) []workloadSpec {
	k := 1
	if small {
		k = 4
	}
	var w []workloadSpec
	add := func(name string, replicas, kv, out int, convs ...conversation) {
		w = append(w, workloadSpec{name: name, replicas: replicas, kv: kv, out: out, convs: convs})
	}
	// The seed's agent loop: one 90k-token session.
	add("agent", 2, 0, 150, conversation{seed: 1, context: 360_000, add: 12_000, turns: 24 / k, fanout: 1})
	// The seed's cold burst: 16 fresh requests sharing a 1k-token prompt.
	burst := "You are a subagent. " + workload.Text(2, 4_000)
	var b []conversation
	for i := 0; i < 16/k; i++ {
		b = append(b, conversation{seed: 200 + int64(i), shared: burst, context: 64_000, turns: 1, fanout: 1})
	}
	add("burst", 2, 0, 300, b...)
	// Two agent loops while three bursts of six subagents arrive.
	var m []conversation
	for i := 0; i < 2; i++ {
		m = append(m, conversation{seed: 300 + int64(i), context: 360_000 / k, add: 12_000, turns: 10 / k, fanout: 1})
	}
	for j := 0; j < 3; j++ {
		sys := "You are a subagent. " + workload.Text(310+int64(j), 4_000)
		for i := 0; i < 6/k+1; i++ {
			m = append(m, conversation{seed: 320 + int64(j*10+i), shared: sys, context: 16_000, add: 12_000, turns: 3, fanout: 1, delay: 15 * float64(j+1) / float64(k)})
		}
	}
	add("mixed", 2, 0, 150, m...)
	// Skewed sizes: one 120k-token session among twenty 8k-token ones.
	s := []conversation{{seed: 400, context: 480_000 / k, add: 8_000, turns: 6, fanout: 1}}
	for i := 0; i < 20/k; i++ {
		s = append(s, conversation{seed: 401 + int64(i), context: 32_000, add: 4_000, turns: 6, fanout: 1})
	}
	add("skewed", 2, 0, 100, s...)
	// A hot spot: two long conversations that fork four requests a turn
	// carry most of the traffic, beside four small sessions; 4 replicas.
	h := []conversation{
		{seed: 500, context: 240_000 / k, add: 8_000, turns: 6, fanout: 4},
		{seed: 501, context: 240_000 / k, add: 8_000, turns: 6, fanout: 4},
	}
	for i := 0; i < 4; i++ {
		h = append(h, conversation{seed: 502 + int64(i), context: 16_000, add: 4_000, turns: 6, fanout: 1})
	}
	add("hotspot", 4, 0, 100, h...)
	// Many sessions on 4 and 8 replicas. Shrunken, one more session than
	// twice the replicas: with 2n sessions whose turns arrive in the same
	// order every round (a loaded host lines them up), round-robin's
	// counter sends each turn where the conversation's last one went, and
	// the check against it measures nothing.
	for _, n := range []int{4, 8} {
		var f []conversation
		sessions := 2 * n
		if small {
			sessions++
		}
		for i := 0; i < sessions; i++ {
			f = append(f, conversation{seed: 600 + int64(n*100+i), context: 64_000 + 16_000*(i%4), add: 8_000, turns: max(8/k, 2), fanout: 1, delay: float64(i%3) * 2})
		}
		add(fmt.Sprintf("replicas%d", n), n, 0, 100, f...)
	}
	// Eviction pressure: ten 40k-token sessions on two replicas whose KV
	// caches hold 150k tokens each.
	var ev []conversation
	for i := 0; i < 10; i++ {
		ev = append(ev, conversation{seed: 700 + int64(i), context: 160_000 / k, add: 8_000, turns: 6, fanout: 1})
	}
	add("eviction", 2, 150_000/k, 100, ev...)
	// A burst of subagents sharing one long (24k-token) system prompt.
	long := "You are a subagent of a large project. " + workload.Text(800, 96_000/k)
	var sa []conversation
	for i := 0; i < 12; i++ {
		sa = append(sa, conversation{seed: 801 + int64(i), shared: long, context: 8_000, add: 4_000, turns: 3, fanout: 1, delay: float64(i / 4)})
	}
	add("shared", 2, 0, 100, sa...)
	// Replicas shared with other callers: a batch job keeps 24 requests
	// of 4k tokens in flight on replica 0, whose batch holds 16, while
	// eight agent sessions arrive through the proxy.
	var fo []conversation
	for i := 0; i < 8; i++ {
		fo = append(fo, conversation{seed: 901 + int64(i), context: 32_000, add: 4_000, turns: max(6/k, 2), fanout: 1, delay: float64(i)})
	}
	add("foreign", 2, 0, 100, fo...)
	w[len(w)-1].maxRunning, w[len(w)-1].batch = 16, 24
	return w
}

// outcome is one run of a workload under a policy, on the engines' clocks
// (TTFT) and the client's wall clock times the scale (makespan).
type outcome struct {
	ttfts    []float64 // ms, every request
	makespan float64   // s
	cached   int       // prompt tokens the replicas found cached
	// warmPrefill is the prompt tokens that conversations' later turns
	// did not find cached: what pinning a continuation saves. kept and
	// keptPrefill are the later turns that the policy did not move off
	// their pin (route balanced), and their part of warmPrefill.
	warmPrefill, later int
	kept, keptPrefill  int
}

func (e *env) runWorkload(w workloadSpec) (outcome, error) {
	var mu sync.Mutex
	var o outcome
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	stop := e.batchLoad(w)
	defer stop()
	for _, c := range w.convs {
		wg.Add(1)
		go func(c conversation) {
			defer wg.Done()
			time.Sleep(time.Duration(c.delay / e.scale * float64(time.Second)))
			msgs := workload.AgentContext(c.seed, c.context)
			if c.shared != "" {
				msgs[0].Content = c.shared
			}
			for t := 0; t < c.turns; t++ {
				rs := make([]turnResult, c.fanout)
				errs := make([]error, c.fanout)
				var fw sync.WaitGroup
				for f := 0; f < c.fanout; f++ {
					fw.Add(1)
					go func(f int) {
						defer fw.Done()
						req := msgs
						if f > 0 {
							req = append(msgs[:len(msgs):len(msgs)], workload.Message{Role: "user", Content: fmt.Sprintf("Fork %d: check one file.", f)})
						}
						rs[f], errs[f] = e.chat(e.proxy, streamBody(req, w.out))
					}(f)
				}
				fw.Wait()
				mu.Lock()
				for f := range rs {
					if errs[f] != nil && firstErr == nil {
						firstErr = errs[f]
					}
					o.ttfts = append(o.ttfts, rs[f].engineTTFT)
					o.cached += rs[f].cached
					if t > 0 {
						o.warmPrefill += rs[f].prompt - rs[f].cached
						o.later++
						if rs[f].route != "balanced" {
							o.kept++
							o.keptPrefill += rs[f].prompt - rs[f].cached
						}
					}
				}
				mu.Unlock()
				if firstErr != nil {
					return
				}
				msgs = append(msgs, workload.Message{Role: "assistant", Content: rs[0].reply},
					workload.Message{Role: "user", Content: workload.Text(c.seed*131+int64(t), c.add)})
			}
		}(c)
	}
	wg.Wait()
	o.makespan = time.Since(start).Seconds() * e.scale
	return o, firstErr
}

// batchLoad starts w.batch clients that each send requests to replica 0
// directly, one after another, until the returned stop is called.
func (e *env) batchLoad(w workloadSpec) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < w.batch; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for n := int64(0); ; n++ {
				select {
				case <-done:
					return
				default:
				}
				msgs := []workload.Message{{Role: "user", Content: workload.Text(int64(i)<<32|n, 16_000)}}
				e.chat(e.sims[0].URL(), streamBody(msgs, 50))
			}
		}(i)
	}
	return func() { close(done); wg.Wait() }
}

func (w workloadSpec) config(scale float64) sim.Config {
	cfg := simConfig(scale)
	if w.kv > 0 {
		cfg.KVCapacityTokens = w.kv
	}
	if w.maxRunning > 0 {
		cfg.MaxRunning = w.maxRunning
	}
	return cfg
}

// policyTable holds the runs of BenchmarkPolicies: workload, policy, runs.
var policyTable = struct {
	sync.Mutex
	m map[string]map[variant][]outcome
}{m: map[string]map[variant][]outcome{}}

// BenchmarkPolicies runs every workload under every policy, ours and the
// peers' baselines, -policy-runs times each, and renders one table.
func BenchmarkPolicies(b *testing.B) {
	for _, w := range benchWorkloads() {
		for _, p := range variants() {
			b.Run(w.name+"/"+p.String(), func(b *testing.B) {
				for b.Loop() {
					for run := 0; run < *policyRuns; run++ {
						e := p.start(b, w, *simScale)
						o, err := e.runWorkload(w)
						if err != nil {
							b.Fatal(err)
						}
						policyTable.Lock()
						if policyTable.m[w.name] == nil {
							policyTable.m[w.name] = map[variant][]outcome{}
						}
						policyTable.m[w.name][p] = append(policyTable.m[w.name][p], o)
						policyTable.Unlock()
						e.report(b)
						b.ReportMetric(percentile(o.ttfts, 50), "ttft-p50-ms")
						b.ReportMetric(percentile(o.ttfts, 90), "ttft-p90-ms")
						b.ReportMetric(o.makespan, "makespan-s")
					}
				}
			})
		}
	}
}

// renderPolicyTable renders the policy table: per workload and policy, the
// median over the runs of p50 TTFT, p90 TTFT and makespan, each with its
// spread (min-max) when there is more than one run.
func renderPolicyTable() string {
	policyTable.Lock()
	defer policyTable.Unlock()
	if len(policyTable.m) == 0 {
		return ""
	}
	var names []string
	for n := range policyTable.m {
		names = append(names, n)
	}
	order := map[string]int{}
	for i, w := range workloads(false) {
		order[w.name] = i
	}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	var b strings.Builder
	b.WriteString("| workload | policy | TTFT p50 ms | TTFT p90 ms | makespan s | cached tokens |\n|---|---|---|---|---|---|\n")
	for _, n := range names {
		for _, p := range variants() {
			runs := policyTable.m[n][p]
			if len(runs) == 0 {
				continue
			}
			stat := func(f func(o outcome) float64) string {
				v := make([]float64, len(runs))
				for i, o := range runs {
					v[i] = f(o)
				}
				sort.Float64s(v)
				med := v[len(v)/2]
				if len(v) == 1 {
					return num(med)
				}
				return fmt.Sprintf("%s (%s-%s)", num(med), num(v[0]), num(v[len(v)-1]))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", n, p,
				stat(func(o outcome) float64 { return percentile(o.ttfts, 50) }),
				stat(func(o outcome) float64 { return percentile(o.ttfts, 90) }),
				stat(func(o outcome) float64 { return o.makespan }),
				stat(func(o outcome) float64 { return float64(o.cached) }))
		}
	}
	return b.String()
}
