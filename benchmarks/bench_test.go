// Package benchmarks measures warmroute's routing against simulated vLLM
// replicas (the seed's table as go test -bench) and holds the workloads and
// the simulator that the measurements use.
package benchmarks

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/router"
)

var (
	simScale = flag.Float64("sim-scale", 40, "how many times faster than real time the simulated replicas run")
	report   = flag.String("report", "", "directory to write bench-report.md and bench-chart.svg into after the benchmarks")
)

// shape is the size of every workload; full is the seed's, quick is a
// shrunken one for the tests that keep the benchmarks from rotting.
type shape struct {
	turns, contextBytes, addBytes, outTokens int
	burstN, burstSystem, burstUser, burstOut int
	mixedSessions, mixedTurns, subagents     int
	subagentTurns, bursts                    int
}

var full = shape{
	// One agent loop as in the seed: a 90k-token context, 24 turns that
	// each add about 3k tokens of tool output and 150 tokens of reply.
	turns: 24, contextBytes: 360_000, addBytes: 12_000, outTokens: 150,
	// A cold burst of 16 fresh requests of about 16k tokens each, sharing
	// a 1k-token system prompt, 300 tokens out.
	burstN: 16, burstSystem: 4_000, burstUser: 64_000, burstOut: 300,
	// Two agent loops while three bursts of six subagents arrive.
	mixedSessions: 2, mixedTurns: 10, subagents: 6, subagentTurns: 3, bursts: 3,
}

var quick = shape{
	turns: 5, contextBytes: 360_000, addBytes: 12_000, outTokens: 20,
	burstN: 8, burstSystem: 4_000, burstUser: 64_000, burstOut: 40,
	mixedSessions: 1, mixedTurns: 3, subagents: 3, subagentTurns: 2, bursts: 1,
}

var policies = []router.Policy{router.RoundRobin, router.Affinity, router.Adaptive, router.Cost}

func simConfig(scale float64) sim.Config {
	cfg := sim.DefaultConfig()
	cfg.TimeScale = scale
	return cfg
}

// results collects what the benchmarks measured, for the table printed at
// the end of the run and the report.
var results = struct {
	sync.Mutex
	m       map[string]float64
	perTurn map[string][]float64
}{m: map[string]float64{}, perTurn: map[string][]float64{}}

func record(key string, v float64) {
	results.Lock()
	results.m[key] = v
	results.Unlock()
}

func BenchmarkAgentLoop(b *testing.B) {
	for _, p := range policies {
		b.Run(p.String(), func(b *testing.B) {
			for b.Loop() {
				e := startEnv(b, p, 2, simConfig(*simScale))
				s := benchShape()
				warm, perTurn, err := e.agentLoop(1, 1, s.turns, s.contextBytes, s.addBytes, s.outTokens)
				if err != nil {
					b.Fatal(err)
				}
				e.report(b)
				b.ReportMetric(mean(warm), "warm-ttft-mean-ms")
				b.ReportMetric(percentile(warm, 50), "warm-ttft-p50-ms")
				b.ReportMetric(percentile(warm, 90), "warm-ttft-p90-ms")
				record("agent/"+p.String()+"/mean", mean(warm))
				record("agent/"+p.String()+"/p50", percentile(warm, 50))
				record("agent/"+p.String()+"/p90", percentile(warm, 90))
				results.Lock()
				results.perTurn[p.String()] = perTurn[0]
				// The chart's caption: what the turns ran on.
				results.m["agent/replicas"], results.m["agent/scale"] = float64(len(e.urls)), e.scale
				results.Unlock()
			}
		})
	}
}

func BenchmarkColdBurst(b *testing.B) {
	for _, p := range policies {
		b.Run(p.String(), func(b *testing.B) {
			for b.Loop() {
				e := startEnv(b, p, 2, simConfig(*simScale))
				s := benchShape()
				makespan, wall, err := e.burst(2, s.burstN, s.burstSystem, s.burstUser, s.burstOut)
				if err != nil {
					b.Fatal(err)
				}
				e.report(b)
				b.ReportMetric(makespan, "makespan-s")
				b.ReportMetric(wall, "wall-makespan-s")
				record("burst/"+p.String(), makespan)
			}
		})
	}
}

func BenchmarkMixed(b *testing.B) {
	for _, p := range policies {
		b.Run(p.String(), func(b *testing.B) {
			for b.Loop() {
				e := startEnv(b, p, 2, simConfig(*simScale))
				ttfts, makespan, err := e.mixed(benchShape())
				if err != nil {
					b.Fatal(err)
				}
				e.report(b)
				b.ReportMetric(percentile(ttfts, 50), "ttft-p50-ms")
				b.ReportMetric(percentile(ttfts, 90), "ttft-p90-ms")
				b.ReportMetric(makespan, "makespan-s")
				record("mixed/"+p.String()+"/p50", percentile(ttfts, 50))
				record("mixed/"+p.String()+"/p90", percentile(ttfts, 90))
				record("mixed/"+p.String()+"/makespan", makespan)
			}
		})
	}
}

// mixed runs agent loops while bursts of subagents arrive, and returns the
// TTFT of every request after the first of its conversation, and the
// makespan in real-scale seconds.
func (e *env) mixed(s shape) ([]float64, float64, error) {
	start := time.Now()
	var mu sync.Mutex
	var all []float64
	var firstErr error
	var wg sync.WaitGroup
	keep := func(v []float64, err error) {
		mu.Lock()
		all = append(all, v...)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		warm, _, err := e.agentLoop(10, s.mixedSessions, s.mixedTurns, s.contextBytes, s.addBytes, s.outTokens)
		keep(warm, err)
	}()
	for i := 0; i < s.bursts; i++ {
		// A burst every 15 real-scale seconds.
		time.Sleep(time.Duration(15 / e.scale * float64(time.Second)))
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			keep(e.subagents(int64(100+i), s.subagents, s.subagentTurns, s.burstSystem, s.burstUser/4, s.addBytes, s.outTokens))
		}(i)
	}
	wg.Wait()
	return all, time.Since(start).Seconds() * e.scale, firstErr
}

// BenchmarkProxyOverhead compares the time to first byte of a small
// streamed request through warmroute with the same request sent straight
// to the replica, in wall-clock microseconds, with an engine fast enough
// that the proxy's own cost is what differs.
func BenchmarkProxyOverhead(b *testing.B) {
	cfg := simConfig(1e6)
	e := startEnv(b, router.Adaptive, 1, cfg)
	body := []byte(`{"model":"sim-30b","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	measure := func(base string) float64 {
		var v []float64
		for i := 0; i < 300; i++ {
			start := time.Now()
			if _, err := e.chat(base, body); err != nil {
				b.Fatal(err)
			}
			v = append(v, float64(time.Since(start).Microseconds()))
		}
		return percentile(v, 50)
	}
	for b.Loop() {
		measure(e.urls[0]) // warm both paths' connections
		measure(e.proxy)
		direct, proxied := measure(e.urls[0]), measure(e.proxy)
		b.ReportMetric(direct, "direct-p50-us")
		b.ReportMetric(proxied, "proxied-p50-us")
		b.ReportMetric(proxied/direct, "ratio")
		record("overhead/direct", direct)
		record("overhead/proxied", proxied)
	}
}

// The seed's figures, the reference that sim.DefaultConfig is calibrated
// to, in the same units.
var seed = map[string]float64{
	"agent/roundrobin/mean": 2676, "agent/adaptive/mean": 1095,
	"burst/affinity": 30.1, "burst/roundrobin": 18.6, "burst/adaptive": 19.97,
}

// table renders the seed beside this run.
func table() string {
	results.Lock()
	defer results.Unlock()
	if len(results.m) == 0 {
		return ""
	}
	var b strings.Builder
	row := func(name, key, unit string) {
		ours, ok := results.m[key]
		if !ok {
			return
		}
		s := "-"
		if v, ok := seed[key]; ok {
			s = num(v)
		}
		fmt.Fprintf(&b, "| %-46s | %8s | %8s | %-4s |\n", name, s, num(ours), unit)
	}
	b.WriteString("| measure                                        |     seed |     ours | unit |\n")
	b.WriteString("|------------------------------------------------|----------|----------|------|\n")
	for _, p := range []string{"roundrobin", "affinity", "adaptive"} {
		row("agent loop warm-turn TTFT mean, "+p, "agent/"+p+"/mean", "ms")
		row("agent loop warm-turn TTFT p50, "+p, "agent/"+p+"/p50", "ms")
		row("agent loop warm-turn TTFT p90, "+p, "agent/"+p+"/p90", "ms")
	}
	for _, p := range []string{"roundrobin", "affinity", "adaptive"} {
		row("cold burst of 16, makespan, "+p, "burst/"+p, "s")
	}
	for _, p := range []string{"roundrobin", "affinity", "adaptive"} {
		row("mixed TTFT p50, "+p, "mixed/"+p+"/p50", "ms")
		row("mixed TTFT p90, "+p, "mixed/"+p+"/p90", "ms")
		row("mixed makespan, "+p, "mixed/"+p+"/makespan", "s")
	}
	row("time to first byte straight to the replica", "overhead/direct", "us")
	row("time to first byte through warmroute", "overhead/proxied", "us")
	ratio := func(name, num, den string) {
		n, ok1 := results.m[num]
		d, ok2 := results.m[den]
		if !ok1 || !ok2 || d == 0 {
			return
		}
		sn, sd := seed[num], seed[den]
		s := "-"
		if sn > 0 && sd > 0 {
			s = fmt.Sprintf("%.2f", sn/sd)
		}
		fmt.Fprintf(&b, "| %-46s | %8s | %8.2f | x    |\n", name, s, n/d)
	}
	ratio("warm TTFT roundrobin / adaptive (mean)", "agent/roundrobin/mean", "agent/adaptive/mean")
	ratio("burst pinned (affinity) / spread (roundrobin)", "burst/affinity", "burst/roundrobin")
	ratio("burst adaptive / spread (roundrobin)", "burst/adaptive", "burst/roundrobin")
	ratio("TTFB through warmroute / direct", "overhead/proxied", "overhead/direct")
	return b.String()
}

// num formats a figure with the precision it has.
func num(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if tt := renderTraceTable(); tt != "" {
		fmt.Printf("\nTrace replay (%s):\n\n%s", ranOn(), tt)
	}
	pt := renderPolicyTable()
	if pt != "" {
		pt = fmt.Sprintf("Policies by workload (%s, %d run(s) each; median (min-max) over the runs; TTFT of every request; makespan on the client's clock):\n\n%s", ranOn(), *policyRuns, pt)
		fmt.Printf("\n%s", pt)
	}
	if t := table(); t != "" {
		fmt.Printf("\nThe seed's table beside this run (%s):\n\n%s", ranOn(), t)
		if pt != "" {
			t += "\n" + pt
		}
		if *report != "" {
			if err := writeReport(*report, t); err != nil {
				fmt.Fprintln(os.Stderr, "report:", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}
