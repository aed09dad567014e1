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
		e = startEnv(t, p, 2, simConfig(200))
		if _, _, err := e.mixed(quick); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("warm TTFT p50 ms: %v; burst makespan s: %v", warm, burst)
	if warm[router.Adaptive]*1.5 > warm[router.RoundRobin] {
		t.Errorf("adaptive warm TTFT %.0f ms is not well below round-robin's %.0f ms", warm[router.Adaptive], warm[router.RoundRobin])
	}
	if burst[router.Affinity] < burst[router.Adaptive]*1.3 {
		t.Errorf("pinning the burst to one replica (%.1f s) should cost well over spreading it (%.1f s)", burst[router.Affinity], burst[router.Adaptive])
	}
	if burst[router.Adaptive] > burst[router.RoundRobin]*1.07 {
		t.Errorf("adaptive burst %.1f s is more than 1.07x round-robin's %.1f s", burst[router.Adaptive], burst[router.RoundRobin])
	}
}
