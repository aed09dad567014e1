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
	sglang, llmd, leastLoad, powerOfTwo}

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

// variants are the rows of w in the policy table: every policy, and, where
// other callers load the replicas, cost with the replicas' queues read
// every scrapeEvery (real scale).
func variants(w workloadSpec) []variant {
	var vs []variant
	for _, p := range allPolicies {
		vs = append(vs, variant{policy: p})
		if p == router.Cost && w.batch > 0 {
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
	p := v.policy
	if f, ok := p.(interface{ fresh() router.Policy }); ok {
		p = f.fresh() // a policy with state of its own starts empty
	}
	return startEnvUp(tb, p, ucfg, w.replicas, w.config(scale))
}

// conversation is one agent session of a workload: a system prompt (shared
// with others when shared is set), a context, turns that each add a reply
// and add bytes of tool output, and fanout parallel requests per turn (the
// forks of an agent that runs tool calls or subagents on one context).
// The TTFT columns of the table are over the focus conversations when a
// workload marks some: the short conversations beside long agent loops,
// the fresh requests beside a hot conversation, which the default policy
// must not make wait.
type conversation struct {
	seed          int64
	shared        string // a system prompt shared with other conversations, or ""
	context, add  int
	turns, fanout int
	delay         float64 // real-scale seconds after the start
	focus         bool
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

// key names the workload on its fleet: "agent-2" is the agent loop on 2
// replicas.
func (w workloadSpec) key() string { return fmt.Sprintf("%s-%d", w.name, w.replicas) }

// fleets are the fleet sizes that the table runs each of its workloads on.
var fleets = []int{2, 4}

// workloads returns the policy table's workloads, each on every fleet
// size, and then the ones measured on one fleet only; small shrinks them
// for the tests (sizes and counts, never the shape).
func workloads(small bool) []workloadSpec {
	k := 1
	if small {
		k = 4
	}
	var w []workloadSpec
	add := func(name string, kv, out int, convs ...conversation) {
		for _, n := range fleets {
			w = append(w, workloadSpec{name: name, replicas: n, kv: kv, out: out, convs: convs})
		}
	}
	// The seed's agent loop: one 90k-token session.
	add("agent", 0, 150, conversation{seed: 1, context: 360_000, add: 12_000, turns: 24 / k, fanout: 1})
	// The seed's cold burst: 16 fresh requests sharing a 1k-token prompt.
	burst := "You are a subagent. " + workload.Text(2, 4_000)
	var b []conversation
	for i := 0; i < 16/k; i++ {
		b = append(b, conversation{seed: 200 + int64(i), shared: burst, context: 64_000, turns: 1, fanout: 1})
	}
	add("burst", 0, 300, b...)
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
	add("mixed", 0, 150, m...)
	// Skewed sessions: one 120k-token agent loop beside twenty short
	// 8k-token conversations that start one a second, whose TTFT the
	// table shows. (Started all at once, the first turns' order at the
	// engines decides their p90: the simulator reads a 480 KB prompt
	// later than a 32 KB one, whichever the proxy sent first.)
	s := []conversation{{seed: 400, context: 480_000 / k, add: 8_000, turns: 6, fanout: 1}}
	for i := 0; i < 20/k; i++ {
		s = append(s, conversation{seed: 401 + int64(i), context: 32_000, add: 4_000, turns: 6, fanout: 1, delay: 1 + float64(i), focus: true})
	}
	add("skewed", 0, 100, s...)
	// A hot spot: one 90k-token conversation sends turn after turn while
	// fresh 4k-token requests keep arriving, one a second; the table
	// shows the fresh requests' TTFT.
	h := []conversation{{seed: 500, context: 360_000 / k, add: 12_000, turns: 20 / k, fanout: 1}}
	for i := 0; i < 40/k; i++ {
		h = append(h, conversation{seed: 501 + int64(i), context: 16_000, turns: 1, fanout: 1, delay: 2 + float64(i), focus: true})
	}
	add("hotspot", 0, 100, h...)
	// A burst of subagents sharing one long (24k-token) system prompt.
	long := "You are a subagent of a large project. " + workload.Text(800, 96_000/k)
	var sa []conversation
	for i := 0; i < 12; i++ {
		sa = append(sa, conversation{seed: 801 + int64(i), shared: long, context: 8_000, add: 4_000, turns: 3, fanout: 1, delay: float64(i / 4)})
	}
	add("shared", 0, 100, sa...)

	one := func(name string, replicas, kv, out int, convs ...conversation) {
		w = append(w, workloadSpec{name: name, replicas: replicas, kv: kv, out: out, convs: convs})
	}
	// Forks: two long conversations that fork four requests a turn carry
	// most of the traffic, beside four small sessions; 4 replicas.
	f := []conversation{
		{seed: 550, context: 240_000 / k, add: 8_000, turns: 6, fanout: 4},
		{seed: 551, context: 240_000 / k, add: 8_000, turns: 6, fanout: 4},
	}
	for i := 0; i < 4; i++ {
		f = append(f, conversation{seed: 552 + int64(i), context: 16_000, add: 4_000, turns: 6, fanout: 1})
	}
	one("forks", 4, 0, 100, f...)
	// Many sessions on 8 replicas. Shrunken, one more session than
	// twice the replicas: with 2n sessions whose turns arrive in the same
	// order every round (a loaded host lines them up), round-robin's
	// counter sends each turn where the conversation's last one went, and
	// the check against it measures nothing.
	var r8 []conversation
	sessions := 16
	if small {
		sessions++
	}
	for i := 0; i < sessions; i++ {
		r8 = append(r8, conversation{seed: 600 + int64(800+i), context: 64_000 + 16_000*(i%4), add: 8_000, turns: max(8/k, 2), fanout: 1, delay: float64(i%3) * 2})
	}
	one("replicas8", 8, 0, 100, r8...)
	// Eviction pressure: ten 40k-token sessions on two replicas whose KV
	// caches hold 150k tokens each.
	var ev []conversation
	for i := 0; i < 10; i++ {
		ev = append(ev, conversation{seed: 700 + int64(i), context: 160_000 / k, add: 8_000, turns: 6, fanout: 1})
	}
	one("eviction", 2, 150_000/k, 100, ev...)
	// Replicas shared with other callers: a batch job keeps 24 requests
	// of 4k tokens in flight on replica 0, whose batch holds 16, while
	// eight agent sessions arrive through the proxy.
	var fo []conversation
	for i := 0; i < 8; i++ {
		fo = append(fo, conversation{seed: 901 + int64(i), context: 32_000, add: 4_000, turns: max(6/k, 2), fanout: 1, delay: float64(i)})
	}
	one("foreign", 2, 0, 100, fo...)
	w[len(w)-1].maxRunning, w[len(w)-1].batch = 16, 24
	return w
}

// outcome is one run of a workload under a policy, on the engines' clocks
// (TTFT) and the client's wall clock times the scale (makespan).
type outcome struct {
	ttfts    []float64 // ms, every request, or the focus conversations'
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
	focused := false
	for _, c := range w.convs {
		focused = focused || c.focus
	}
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
					if c.focus || !focused {
						o.ttfts = append(o.ttfts, rs[f].engineTTFT)
					}
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

// policyTable holds the runs of BenchmarkPolicies: workload key, policy,
// runs.
var policyTable = struct {
	sync.Mutex
	m map[string]map[variant][]outcome
}{m: map[string]map[variant][]outcome{}}

// BenchmarkPolicies runs every workload under every policy, ours and the
// peers' re-implemented ones, -policy-runs times each, and renders one
// table. Sub-benchmarks are named workload-replicas/policy
// (-bench 'Policies/agent-2/' runs one row group).
func BenchmarkPolicies(b *testing.B) {
	for _, w := range benchWorkloads() {
		for _, p := range variants(w) {
			b.Run(w.key()+"/"+p.String(), func(b *testing.B) {
				for b.Loop() {
					for run := 0; run < *policyRuns; run++ {
						e := p.start(b, w, *simScale)
						o, err := e.runWorkload(w)
						if err != nil {
							b.Fatal(err)
						}
						policyTable.Lock()
						if policyTable.m[w.key()] == nil {
							policyTable.m[w.key()] = map[variant][]outcome{}
						}
						policyTable.m[w.key()][p] = append(policyTable.m[w.key()][p], o)
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

// cell is one policy's medians over its runs of one workload.
type cell struct {
	p50, p90, max, makespan stats
}

// stats is a median and the spread of the runs.
type stats struct{ med, lo, hi float64 }

func (s stats) String() string {
	if s.lo == s.hi {
		return num(s.med)
	}
	return fmt.Sprintf("%s (%s-%s)", num(s.med), num(s.lo), num(s.hi))
}

func statsOf(runs []outcome, f func(o outcome) float64) stats {
	v := make([]float64, len(runs))
	for i, o := range runs {
		v[i] = f(o)
	}
	sort.Float64s(v)
	return stats{med: v[len(v)/2], lo: v[0], hi: v[len(v)-1]}
}

func cellOf(runs []outcome) cell {
	return cell{
		p50:      statsOf(runs, func(o outcome) float64 { return percentile(o.ttfts, 50) }),
		p90:      statsOf(runs, func(o outcome) float64 { return percentile(o.ttfts, 90) }),
		max:      statsOf(runs, func(o outcome) float64 { return percentile(o.ttfts, 100) }),
		makespan: statsOf(runs, func(o outcome) float64 { return o.makespan }),
	}
}

// near reports whether v is within 15% or d of best, the bar that the
// default policy is held to on every workload.
func near(v, best, d float64) bool { return v <= best*1.15 || v-best <= d }

// renderPolicyTable renders the policy table: per workload and policy, the
// median over the runs of p50, p90 and worst TTFT and makespan, each with its
// spread (min-max) when there is more than one run; then, per workload,
// the default policy against the best median of any policy.
func renderPolicyTable() string {
	policyTable.Lock()
	defer policyTable.Unlock()
	if len(policyTable.m) == 0 {
		return ""
	}
	var b, sum strings.Builder
	b.WriteString("| workload | replicas | policy | TTFT p50 ms | TTFT p90 ms | TTFT max ms | makespan s |\n|---|---|---|---|---|---|---|\n")
	sum.WriteString("| workload | replicas | default p90 ms | best p90 ms (policy) | default makespan s | best makespan s (policy) | within 15% or 0.15 s |\n|---|---|---|---|---|---|---|\n")
	for _, w := range workloads(false) {
		row := policyTable.m[w.key()]
		if len(row) == 0 {
			continue
		}
		cells := map[variant]cell{}
		var best90, bestMs variant
		for _, p := range variants(w) {
			if len(row[p]) == 0 {
				continue
			}
			c := cellOf(row[p])
			cells[p] = c
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", w.name, w.replicas, p, c.p50, c.p90, c.max, c.makespan)
			if bc, ok := cells[best90]; !ok || c.p90.med < bc.p90.med {
				best90 = p
			}
			if bc, ok := cells[bestMs]; !ok || c.makespan.med < bc.makespan.med {
				bestMs = p
			}
		}
		d, ok := cells[variant{policy: router.Default}]
		if !ok {
			continue
		}
		verdict := "yes"
		if !near(d.p90.med, cells[best90].p90.med, 150) || !near(d.makespan.med, cells[bestMs].makespan.med, 0.15) {
			verdict = "no"
		}
		fmt.Fprintf(&sum, "| %s | %d | %s | %s (%s) | %s | %s (%s) | %s |\n", w.name, w.replicas,
			num(d.p90.med), num(cells[best90].p90.med), best90, num(d.makespan.med), num(cells[bestMs].makespan.med), bestMs, verdict)
	}
	return b.String() + "\nThe default (" + router.Default.String() + ") against the best policy of each workload, medians:\n\n" + sum.String()
}
