package benchmarks

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// naming is how the subagents of the team workload name their session,
// the question BenchmarkSubagents answers: does a subagent, whose prompt
// shares nothing with its parent's, do better on its parent's replica than
// where the cost policy places it?
type naming int

const (
	// ownSession: the session's id and an agent id of its own, as Claude
	// Code sends them: a session of its own, placed by cost (the default).
	ownSession naming = iota
	// parentReplica: a session of its own whose first request the cost
	// policy places as its parent's session (toParent): the parent's
	// replica counts as holding its prompt, so it goes there unless that
	// replica is busier than the prefill. What placing a subagent on its
	// parent's replica would do.
	parentReplica
	// parentSession: the session's id alone, its parent's key, as a
	// gateway that reads no agent id sees it: parentReplica for every
	// request, and a subagent moved off a busy replica takes its
	// parent's session along.
	parentSession
	// noSession: no header on any request, the parents' included:
	// placement by prefixes and load alone.
	noSession
)

func (n naming) String() string {
	return [...]string{"own", "parent-replica", "parent-session", "none"}[n]
}

// toParent is the cost policy but for a subagent's first request, which
// it places as a request of its parent's session: the subagent's session
// key is in parents, with its parent's, until then. Served pins the
// subagent's own session where it went.
type toParent struct{ parents *sync.Map }

func (p toParent) Choose(req router.Request) router.Decision {
	if parent, ok := p.parents.LoadAndDelete(req.Session); ok {
		req.Session = parent.(uint64)
	}
	return router.Cost.Choose(req)
}

func (toParent) Needs() router.Needs { return router.Cost.Needs() }
func (toParent) String() string      { return "cost-parent" }

// start starts 2 simulated replicas behind warmroute under the cost
// policy, its session headers as n needs them: one header, whose key the
// benchmark computes (router.SessionKey), for parentReplica.
func (n naming) start(tb testing.TB, scale float64, parents *sync.Map) *env {
	cfg := router.Config{Policy: router.Cost, SessionHeaders: router.DefaultSessionHeaders}
	if n == parentReplica {
		cfg = router.Config{Policy: toParent{parents}, SessionHeaders: []string{"X-Session-ID"}}
	}
	return startEnvWith(tb, cfg, upstream.Config{}, 2, simConfig(scale))
}

// headers returns the session headers of a parent (agent "") or of one of
// its subagents.
func (n naming) headers(session, agent string, parents *sync.Map) []string {
	switch {
	case n == noSession:
		return nil
	case n == parentReplica && agent != "":
		parents.Store(router.SessionKey([]byte(agent)), router.SessionKey([]byte(session)))
		return []string{"X-Session-ID", agent}
	case n == parentReplica:
		return []string{"X-Session-ID", session}
	case n == ownSession && agent != "":
		return []string{"X-Claude-Code-Session-Id", session, "X-Claude-Code-Agent-Id", agent}
	}
	return []string{"X-Claude-Code-Session-Id", session}
}

// team is the subagent workload: parents agent loops, each a long context
// that gains add bytes a turn; after each of its first spawns turns, a
// parent starts fanout subagents at once and waits for them, as Claude
// Code's Task tool does, and their answers are its next turn's tool
// output. A subagent's prompt is the system prompt that every subagent
// shares and a task of its own, and it runs subTurns turns.
type team struct {
	parents, context, add, turns int
	spawns, fanout, subTurns     int
	subSystem, task, subAdd      int
	out                          int
}

var teamWorkload = team{parents: 4, context: 160_000, add: 8_000, turns: 4,
	spawns: 2, fanout: 3, subTurns: 3, subSystem: 12_000, task: 2_000, subAdd: 8_000, out: 100}

// teamOutcome is one run: engine TTFTs (ms) of the parents' and the
// subagents' requests, the makespan (real-scale s), and the prompt tokens
// that the engines prefilled (not found cached).
type teamOutcome struct {
	parent, sub []float64
	makespan    float64
	prefill     int
}

func (e *env) runTeam(w team, n naming, parents *sync.Map) (teamOutcome, error) {
	var mu sync.Mutex
	var o teamOutcome
	var firstErr error
	keep := func(r turnResult, err error, sub bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if sub {
			o.sub = append(o.sub, r.engineTTFT)
		} else {
			o.parent = append(o.parent, r.engineTTFT)
		}
		o.prefill += r.prompt - r.cached
		return err == nil
	}
	system := "You are a subagent. Explore the code and report. " + workload.Text(1000, w.subSystem)
	subagent := func(session string, p, t, i int) string {
		hdr := n.headers(session, fmt.Sprintf("agent-%d-%d-%d", p, t, i), parents)
		seed := int64(2000 + p*100 + t*10 + i)
		msgs := []workload.Message{{Role: "system", Content: system}, {Role: "user", Content: "Task: " + workload.Text(seed, w.task)}}
		for k := 0; k < w.subTurns; k++ {
			r, err := e.chatWith(e.proxy, streamBody(msgs, w.out), hdr, nil)
			if !keep(r, err, true) {
				return ""
			}
			msgs = append(msgs, workload.Message{Role: "assistant", Content: r.reply},
				workload.Message{Role: "user", Content: workload.Text(seed*31+int64(k), w.subAdd)})
		}
		return msgs[len(msgs)-2].Content
	}
	start := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < w.parents; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			time.Sleep(time.Duration(float64(p) / e.scale * float64(time.Second)))
			session := fmt.Sprintf("00000000-0000-4000-8000-%012d", p)
			hdr := n.headers(session, "", parents)
			msgs := workload.AgentContext(int64(1100+p), w.context)
			for t := 0; t < w.turns; t++ {
				r, err := e.chatWith(e.proxy, streamBody(msgs, w.out), hdr, nil)
				if !keep(r, err, false) {
					return
				}
				tool := workload.Text(int64(1200+p*10+t), w.add)
				if t < w.spawns {
					answers := make([]string, w.fanout)
					var sw sync.WaitGroup
					for i := range answers {
						sw.Add(1)
						go func(i int) {
							defer sw.Done()
							answers[i] = subagent(session, p, t, i)
						}(i)
					}
					sw.Wait()
					tool = fmt.Sprint(answers)
				}
				msgs = append(msgs, workload.Message{Role: "assistant", Content: r.reply}, workload.Message{Role: "user", Content: tool})
			}
		}(p)
	}
	wg.Wait()
	o.makespan = time.Since(start).Seconds() * e.scale
	return o, firstErr
}

// BenchmarkSubagents runs the team workload on 2 simulated replicas under
// the cost policy with the agents' session headers read, its subagents
// named each way (naming), -policy-runs times each, and reports the
// medians over the runs: TTFT p50 and p90 of the parents' and of the
// subagents' requests, makespan, and the prompt tokens prefilled.
// docs/routing.md gives the figures and the command.
func BenchmarkSubagents(b *testing.B) {
	for _, n := range []naming{ownSession, parentReplica, parentSession, noSession} {
		b.Run(n.String(), func(b *testing.B) {
			for b.Loop() {
				var runs []teamOutcome
				for run := 0; run < *policyRuns; run++ {
					parents := &sync.Map{}
					o, err := n.start(b, *simScale, parents).runTeam(teamWorkload, n, parents)
					if err != nil {
						b.Fatal(err)
					}
					runs = append(runs, o)
				}
				// Medians over the runs, and their spread in the log.
				for _, m := range []struct {
					unit string
					f    func(o teamOutcome) float64
				}{
					{"parent-p50-ms", func(o teamOutcome) float64 { return percentile(o.parent, 50) }},
					{"parent-p90-ms", func(o teamOutcome) float64 { return percentile(o.parent, 90) }},
					{"sub-p50-ms", func(o teamOutcome) float64 { return percentile(o.sub, 50) }},
					{"sub-p90-ms", func(o teamOutcome) float64 { return percentile(o.sub, 90) }},
					{"makespan-s", func(o teamOutcome) float64 { return o.makespan }},
					{"prefill-ktok", func(o teamOutcome) float64 { return float64(o.prefill) / 1000 }},
				} {
					v := make([]float64, len(runs))
					for i, o := range runs {
						v[i] = m.f(o)
					}
					sort.Float64s(v)
					st := stats{med: v[len(v)/2], lo: v[0], hi: v[len(v)-1]}
					b.ReportMetric(st.med, m.unit)
					b.Logf("%s %s: %s", n, m.unit, st)
				}
			}
		})
	}
}

// TestSubagentWorkload runs a shrunken team workload under each naming:
// every request of the parents and their subagents is answered, through
// the proxy that BenchmarkSubagents measures.
func TestSubagentWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs simulated workloads")
	}
	w := team{parents: 2, context: 16_000, add: 2_000, turns: 2, spawns: 1, fanout: 2, subTurns: 2,
		subSystem: 4_000, task: 1_000, subAdd: 2_000, out: 16}
	for _, n := range []naming{ownSession, parentReplica, parentSession, noSession} {
		parents := &sync.Map{}
		o, err := n.start(t, 200, parents).runTeam(w, n, parents)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if len(o.parent) != w.parents*w.turns || len(o.sub) != w.parents*w.spawns*w.fanout*w.subTurns {
			t.Errorf("%s: %d parent and %d subagent requests answered", n, len(o.parent), len(o.sub))
		}
	}
}
