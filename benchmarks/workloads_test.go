package benchmarks

import (
	"testing"

	"github.com/warmroute/warmroute/router"
)

// TestRoutingEffects runs shrunken workloads through warmroute and checks
// what the policies exist for. TTFT and makespan come from the simulated
// engine's clock, not the host's, so these are not timing tests: a slow
// host delays the run but does not change the figures.
func TestRoutingEffects(t *testing.T) {
	if testing.Short() {
		t.Skip("runs simulated workloads")
	}
	warm := map[router.Policy]float64{}
	burst := map[router.Policy]float64{}
	split := map[router.Policy][2]int64{}
	for _, p := range policies {
		e := startEnv(t, p, 2, simConfig(200))
		w, _, err := e.agentLoop(1, 1, quick.turns, quick.contextBytes, quick.addBytes, quick.outTokens)
		if err != nil {
			t.Fatal(err)
		}
		warm[p] = percentile(w, 50)
		e = startEnv(t, p, 2, simConfig(200))
		if burst[p], _, err = e.burst(2, quick.burstN, quick.burstSystem, quick.burstUser, quick.burstOut); err != nil {
			t.Fatal(err)
		}
		split[p] = [2]int64{e.sims[0].Requests(), e.sims[1].Requests()}
		e = startEnv(t, p, 2, simConfig(200))
		if _, _, err := e.mixed(quick); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("warm TTFT p50 ms: %v; burst makespan s: %v; burst split: %v", warm, burst, split)
	if warm[router.Adaptive]*1.5 > warm[router.RoundRobin] {
		t.Errorf("adaptive warm TTFT %.0f ms is not well below round-robin's %.0f ms", warm[router.Adaptive], warm[router.RoundRobin])
	}
	// The burst's makespan follows from where its requests go; which
	// replicas they went to is exact, where a makespan measured on a busy
	// host (-race, parallel packages) is not. The benchmarks report it.
	half := int64(quick.burstN / 2)
	for _, p := range []router.Policy{router.Adaptive, router.RoundRobin} {
		if split[p] != [2]int64{half, half} {
			t.Errorf("%s sent the burst %v, want it spread %d and %d", p, split[p], half, half)
		}
	}
	if s := split[router.Affinity]; s[0] != 0 && s[1] != 0 {
		t.Errorf("affinity split a same-prefix burst %v; it pins it to one replica", s)
	}
}
