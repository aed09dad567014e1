package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/redistest"
	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// instance is one warmroute in front of a shared fleet, as a second
// process would be: its own set, pins, counter and pin store client.
type instance struct {
	url   string
	store *pinstore.Store
	stop  func()
	admin http.Handler
}

// metrics returns the instance's /metrics page.
func (in *instance) metrics() string {
	rec := httptest.NewRecorder()
	in.admin.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func startInstance(tb testing.TB, policy router.Policy, urls []string, storeURL string) *instance {
	return startInstanceWith(tb, router.Config{Policy: policy, Rendezvous: true}, urls, storeURL)
}

func startInstanceWith(tb testing.TB, cfg router.Config, urls []string, storeURL string) *instance {
	tb.Helper()
	return startInstanceUp(tb, cfg, upstream.Config{}, urls, storeURL)
}

// startInstanceUp is startInstanceWith with the replica set's config.
func startInstanceUp(tb testing.TB, cfg router.Config, ucfg upstream.Config, urls []string, storeURL string) *instance {
	tb.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ucfg.Logger = log
	set, err := upstream.NewSet(urls, ucfg)
	if err != nil {
		tb.Fatal(err)
	}
	var store *pinstore.Store
	if storeURL != "" {
		// A generous read budget: this tests agreement on a loaded host
		// (-race beside busy loops makes a loopback read take 100 ms and
		// more), not the latency bound, which the pinstore tests check.
		if store, err = pinstore.Open(storeURL, pinstore.Options{Timeout: time.Second, Logger: log}); err != nil {
			tb.Fatal(err)
		}
	}
	pins := prefixcache.NewPinMap(1<<16, upstream.MaxReplicas)
	cfg.PinStore, cfg.Logger = store, log
	h := router.New(cfg, set, pins, router.NewMetrics(set, pins))
	scfg := router.ServerConfig{MaxBodySize: 64 << 20}
	srv := h.Server(scfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	set.Watch(ctx)
	in := &instance{url: "http://" + ln.Addr().String(), store: store, admin: h.Admin(false)}
	if store != nil {
		// A proxy serves on local pins until its store connects; the
		// test measures agreement, so it waits for that.
		redistest.Eventually(tb, store.Up)
	}
	var once sync.Once
	in.stop = func() {
		once.Do(func() {
			cancel()
			srv.Shutdown()
			if store != nil {
				store.Close()
			}
		})
	}
	tb.Cleanup(in.stop)
	return in
}

// post sends body to base+path and returns the status, the replica that
// answered and the body.
func post(base, path string, body []byte) (int, string, []byte, error) {
	status, replica, _, out, err := postRoute(base, path, body)
	return status, replica, out, err
}

// postRoute is post with the route the proxy gave (X-Warmroute-Route).
func postRoute(base, path string, body []byte) (int, string, string, []byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(base + path)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	if err := fasthttp.Do(req, resp); err != nil {
		return 0, "", "", nil, err
	}
	return resp.StatusCode(), string(resp.Header.Peek("X-Warmroute-Replica")), string(resp.Header.Peek("X-Warmroute-Route")), append([]byte(nil), resp.Body()...), nil
}

// fleetTurns runs convs conversations of turns turns each, all at once, each
// turn sent to instances[(conv+turn) % len], and counts the continuation
// turns that landed on their previous turn's replica, leaving out the turns
// that the cost policy moved on purpose (route balanced: another replica
// was cheaper by more than the move costs), which it counts apart. Every
// request must succeed.
func fleetTurns(t *testing.T, instances []*instance, seed int64, convs, turns int) (same, total int) {
	same, total, _ = fleetTurnsMoved(t, instances, seed, convs, turns)
	return same, total
}

func fleetTurnsMoved(t *testing.T, instances []*instance, seed int64, convs, turns int) (same, total, moved int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, convs)
	for c := 0; c < convs; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			msgs := workload.AgentContext(seed*1000+int64(c), 16_000)
			prev := ""
			for turn := 0; turn < turns; turn++ {
				in := instances[(c+turn)%len(instances)]
				status, replica, route, body, err := postRoute(in.url, "/v1/chat/completions", workload.Body("sim-30b", msgs, false, 4))
				if err != nil || status != 200 {
					errs <- fmt.Errorf("conversation %d turn %d via %s: %d %v %s", c, turn, in.url, status, err, body)
					return
				}
				if in.store != nil {
					// The next turn may go to another instance at once:
					// this one's pin is in Redis first, as it is when a
					// client takes longer than a write to send it.
					in.store.Sync()
				}
				mu.Lock()
				switch {
				case turn > 0 && route == "balanced":
					moved++
				case turn > 0:
					total++
					if replica == prev {
						same++
					}
				}
				mu.Unlock()
				prev = replica
				var r struct {
					Choices []struct{ Message struct{ Content string } }
				}
				json.Unmarshal(body, &r)
				msgs = append(msgs, workload.Message{Role: "assistant", Content: r.Choices[0].Message.Content},
					workload.Message{Role: "user", Content: workload.Text(seed*97+int64(c*100+turn), 2_000)})
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return same, total, moved
}

func fastFleet(t *testing.T, n int) *sim.Cluster {
	t.Helper()
	cluster, err := sim.StartCluster(n, simConfig(2000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster
}

// TestInstancesAgree: two instances with rendezvous placement and a shared
// Redis pin store, in front of four replicas, clients alternating instances
// turn by turn. Continuations land on their previous turn's replica; Redis
// stopped mid-run fails no request and pins resume when it returns; an
// instance restarted with empty local pins still sends continuations warm.
func TestInstancesAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two proxies and Redis")
	}
	redis := redistest.Start(t)
	cluster := fastFleet(t, 4)
	urls := cluster.URLs()
	a := startInstance(t, router.Adaptive, urls, redis.URL())
	b := startInstance(t, router.Adaptive, urls, redis.URL())
	check := func(phase string, same, total int) {
		t.Helper()
		t.Logf("%s: %d of %d continuation turns on their previous turn's replica; store a %+v, b %+v", phase, same, total, a.store.Stats(), b.store.Stats())
		if same*100 < total*95 {
			t.Errorf("%s: only %d of %d continuation turns landed on their previous turn's replica", phase, same, total)
		}
	}
	same, total := fleetTurns(t, []*instance{a, b}, 1, 24, 5)
	check("alternating instances", same, total)

	// The store's reads are on /metrics, described, and some were hits.
	page := b.metrics()
	hits := regexp.MustCompile(`(?m)^warmroute_pin_store_reads_total\{result="hit"\} (\d+)$`).FindStringSubmatch(page)
	if !strings.Contains(page, "# HELP warmroute_pin_store_up 1 while") || hits == nil {
		t.Fatalf("the pin store's series are not on /metrics:\n%s", page)
	}
	if n, _ := strconv.Atoi(hits[1]); n == 0 && a.store.Stats().Hits == 0 {
		t.Error("no continuation needed the store: the test does not exercise it")
	}

	// Redis down: every request still succeeds, on local pins only.
	redis.Stop()
	fleetTurns(t, []*instance{a, b}, 2, 8, 3)
	redis.Start()
	// The store finds Redis again on its own; then pins are shared again.
	// Pins flow again between the instances' stores.
	probe := prefixcache.Link{Hash: 1, Check: 1}
	redistest.Eventually(t, func() bool {
		a.store.Put(probe, "probe")
		_, ok := b.store.Get(probe)
		return ok
	})
	same, total = fleetTurns(t, []*instance{a, b}, 3, 24, 5)
	check("after Redis came back", same, total)

	// A restarted instance has no local pins: placement and the store
	// carry its conversations' next turns.
	a.stop()
	a = startInstance(t, router.Adaptive, urls, redis.URL())
	same, total = fleetTurns(t, []*instance{a, b}, 4, 24, 4)
	check("with a restarted instance", same, total)
}

// TestInstancesShareResponses: a Responses API conversation whose turns
// alternate instances keeps working: the second instance learns where the
// previous response is stored from the pin store.
func TestInstancesShareResponses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two proxies and Redis")
	}
	redis := redistest.Start(t)
	cluster := fastFleet(t, 4)
	a := startInstance(t, router.Adaptive, cluster.URLs(), redis.URL())
	b := startInstance(t, router.Adaptive, cluster.URLs(), redis.URL())
	prev, replica := "", ""
	for turn := 0; turn < 6; turn++ {
		in := []*instance{a, b}[turn%2]
		body := map[string]any{"model": "sim-30b", "input": fmt.Sprintf("turn %d: %s", turn, workload.Text(int64(turn), 4000)), "max_output_tokens": 4}
		if prev != "" {
			body["previous_response_id"] = prev
		}
		raw, _ := json.Marshal(body)
		// The pin of the last id is written asynchronously: wait until
		// the other instance can read it, as a client's next turn would
		// come after its reply, not in the same microsecond.
		if prev != "" {
			redistest.Eventually(t, func() bool { _, ok := in.store.GetID(prev); return ok })
		}
		status, r, out, err := post(in.url, "/v1/responses", raw)
		if err != nil || status != 200 {
			t.Fatalf("turn %d via instance %d: %d %v %s", turn, turn%2, status, err, out)
		}
		if replica != "" && r != replica {
			t.Fatalf("turn %d went to %s, the conversation lives on %s", turn, r, replica)
		}
		replica = r
		var resp struct{ ID string }
		if err := json.Unmarshal(out, &resp); err != nil || resp.ID == "" {
			t.Fatalf("turn %d: no id in %s", turn, out)
		}
		prev = resp.ID
	}
}

// TestInstancesWithoutAgreement is the control: two instances that spread by
// their own counters, with no store, lose most continuations that cross
// instances, the loss that rendezvous placement and the store remove.
func TestInstancesWithoutAgreement(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two proxies")
	}
	cluster := fastFleet(t, 4)
	a := startCounterInstance(t, cluster.URLs())
	b := startCounterInstance(t, cluster.URLs())
	same, total := fleetTurns(t, []*instance{a, b}, 5, 24, 5)
	t.Logf("counter placement, no store: %d of %d continuation turns on their previous turn's replica", same, total)
	if same*100 >= total*60 {
		t.Errorf("without agreement %d of %d continuations still landed warm: the test does not exercise crossing instances", same, total)
	}
}

func startCounterInstance(tb testing.TB, urls []string) *instance {
	return startInstanceWith(tb, router.Config{Policy: router.Adaptive}, urls, "")
}

// TestRendezvousBurstSpreads: a fresh burst that shares one system prompt,
// through an instance with rendezvous placement, is spread within one
// request of even: the load bound, not the hash of that prompt, decides.
// The replicas run slowly enough that the burst is in flight at once, as
// a real one is.
func TestRendezvousBurstSpreads(t *testing.T) {
	// Replicas slow enough (400 tokens out at a time scale of 5: over a
	// second each) that no request ends before the burst is placed.
	cluster, err := sim.StartCluster(4, simConfig(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	a := startInstance(t, router.Adaptive, cluster.URLs(), "")
	// Each request of the burst is sent once the one before it is in
	// flight (its stream's head came), and all stay in flight until the
	// last is placed: the order of a burst's arrivals, without the
	// moment between two concurrent picks and their counts in flight,
	// which a host as loaded as -race beside busy loops can stretch.
	system := "You are a subagent. " + workload.Text(9, 4000)
	counts := map[string]int{}
	var open []*http.Response
	for i := 0; i < 16; i++ {
		msgs := []workload.Message{{Role: "system", Content: system}, {Role: "user", Content: workload.Text(int64(90+i), 8000)}}
		resp, err := http.Post(a.url+"/v1/chat/completions", "application/json", bytes.NewReader(streamBody(msgs, 400)))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("burst request %d: %v %v", i, resp, err)
		}
		counts[resp.Header.Get("X-Warmroute-Replica")]++
		open = append(open, resp)
	}
	for _, resp := range open {
		resp.Body.Close() // the burst is placed: its answers are not needed
	}
	lo, hi := 1<<30, 0
	for _, r := range cluster.Replicas {
		lo, hi = min(lo, counts[r.Addr()]), max(hi, counts[r.Addr()])
	}
	if hi-lo > 1 {
		t.Errorf("a burst of 16 sharing a system prompt was spread %d..%d over 4 replicas: %v", lo, hi, counts)
	}
}

// TestInstancesAgreeCost: the cost policy keeps conversations together
// across instances the same way: a later turn that no pin places is taken
// to be on its rendezvous top, and a turn that the estimate moved is
// written to the store.
func TestInstancesAgreeCost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two proxies and Redis")
	}
	redis := redistest.Start(t)
	cluster := fastFleet(t, 4)
	a := startInstance(t, router.Cost, cluster.URLs(), redis.URL())
	b := startInstance(t, router.Cost, cluster.URLs(), redis.URL())
	same, total, moved := fleetTurnsMoved(t, []*instance{a, b}, 6, 24, 5)
	t.Logf("cost: %d of %d continuation turns on their previous turn's replica; %d more moved on purpose (balanced)", same, total, moved)
	if same*100 < total*95 {
		t.Errorf("cost: only %d of %d continuation turns landed on their previous turn's replica", same, total)
	}
}

// TestPinStoreReadOnlyAcrossInstances: a conversation that stays on one
// instance never reads the store; its first turn on the other instance
// does.
func TestPinStoreReadOnlyAcrossInstances(t *testing.T) {
	redis := redistest.Start(t)
	cluster := fastFleet(t, 2)
	a := startInstance(t, router.Adaptive, cluster.URLs(), redis.URL())
	b := startInstance(t, router.Adaptive, cluster.URLs(), redis.URL())
	reads := func(in *instance) uint64 {
		st := in.store.Stats()
		return st.Hits + st.Misses + st.ReadErrors + st.Skipped
	}
	if same, total := fleetTurns(t, []*instance{a}, 7, 4, 4); same != total || reads(a) != 0 {
		t.Fatalf("one instance: %d of %d turns on their replica, %d store reads (want none)", same, total, reads(a))
	}
	if same, total := fleetTurns(t, []*instance{b, a}, 8, 4, 2); same != total || reads(a) == 0 {
		t.Fatalf("crossing to a: %d of %d turns on their replica, %d store reads by a (want some)", same, total, reads(a))
	}
}
