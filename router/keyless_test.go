package router

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

var updateKeyless = flag.Bool("update-keyless", false, "rewrite testdata/keyless-decisions.txt from the policies as they are now")

const keylessGolden = "testdata/keyless-decisions.txt"

// keylessDecisions replays, under each policy, one seeded run of requests
// that name no session: random chains, loads, available replicas and
// rendezvous, each answered request served and its prompt held by its
// replica. It returns one line per decision.
func keylessDecisions() string {
	var b strings.Builder
	for _, p := range Policies {
		rng := rand.New(rand.NewSource(41))
		pins := prefixcache.NewPinMap(4096, 8)
		held := prefixcache.NewHoldings(8, 1<<20)
		var counter atomic.Uint64
		var loads Loads
		for r := range 4 {
			loads[r].ID = uint64(r+1) * 0x9E3779B97F4A7C15
		}
		for i := range 500 {
			c := rng.Intn(12) // a conversation, whose chains share their links
			chain := sized(c, 1+rng.Intn(8), rng.Intn(3), uint64(500+700*c))
			for r := range 4 {
				loads[r].Waiting, loads[r].Queued, loads[r].InFlight = int64(rng.Intn(3)), int64(rng.Intn(4)*rng.Intn(60_000)), int64(rng.Intn(8))
			}
			req := Request{Chain: chain, Blocks: chain, Avail: upstream.Mask{uint64(rng.Intn(16))}, Size: ChainSize(chain, 0),
				Load: &loads, Held: held, Rendezvous: rng.Intn(4) == 0}
			d := Choose(p, req, pins, &counter)
			fmt.Fprintf(&b, "%s %d: %d %s %d %d\n", p, i, d.Replica, d.Reason, d.Cached, d.Top)
			if d.Replica >= 0 && rng.Intn(8) != 0 {
				Served(p, req, d.Replica, 200, pins)
				held.Insert(d.Replica, chain, 0)
			}
		}
	}
	return b.String()
}

// TestKeylessDecisionsUnchanged holds every policy's decisions for
// requests that name no session to the ones recorded before the cost
// policy weighed sessions (testdata/keyless-decisions.txt): the session
// keys that agents send change nothing for a request without one. A
// deliberate change to a policy rewrites the file with -update-keyless.
func TestKeylessDecisionsUnchanged(t *testing.T) {
	got := keylessDecisions()
	if *updateKeyless {
		if err := os.WriteFile(keylessGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(keylessGolden)
	if err != nil {
		t.Fatal(err)
	}
	if got == string(want) {
		return
	}
	g, w := strings.Split(got, "\n"), bytes.Split(want, []byte("\n"))
	for i := range min(len(g), len(w)) {
		if g[i] != string(w[i]) {
			t.Fatalf("decision %d changed: got %q, recorded %q", i, g[i], w[i])
		}
	}
	t.Fatalf("%d decisions, %d recorded", len(g), len(w))
}
