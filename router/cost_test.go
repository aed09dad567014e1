package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

func TestCostPolicy(t *testing.T) {
	const all = 0b111
	type step struct {
		chain  []prefixcache.Link
		load   [3]Load // queued bytes and requests in flight per replica
		want   int
		reason Reason
		serve  bool
	}
	idle := [3]Load{}
	tests := []struct {
		name  string
		steps []step
	}{
		{"fresh requests on idle replicas go in turn", []step{
			// The counter's turn among all three: 0, 1, 2.
			{sized(1, 1, 0, 1000), idle, 0, Spread, true},
			{sized(2, 1, 0, 1000), idle, 1, Spread, true},
			{sized(3, 1, 0, 1000), idle, 2, Spread, true},
		}},
		{"requests picked from one view of the queues take its cheapest in turn", []step{
			// A burst picked before its first requests are counted
			// sees the same queues: it must not pile on the first of
			// the cheapest (1, 1, 2 by the order of the slots).
			{sized(1, 1, 0, 1000), [3]Load{{Queued: 68_000, InFlight: 1}, {}, {}}, 1, Spread, false},
			{sized(2, 1, 0, 1000), [3]Load{{Queued: 68_000, InFlight: 1}, {}, {}}, 2, Spread, false},
			{sized(3, 1, 0, 1000), [3]Load{{Queued: 68_000, InFlight: 1}, {}, {}}, 1, Spread, false},
		}},
		{"fresh requests go to least work", []step{
			{sized(1, 1, 0, 1000), [3]Load{{Queued: 9000, InFlight: 1}, {Queued: 100, InFlight: 1}, {Queued: 5000, InFlight: 1}}, 1, Spread, false},
			{sized(2, 1, 0, 1000), [3]Load{{Queued: 0, InFlight: 9}, {Queued: 0, InFlight: 3}, {Queued: 0, InFlight: 5}}, 1, Spread, false},
		}},
		{"an idle continuation stays on its pin", []step{
			{sized(1, 2, 0, 10_000), idle, 0, Spread, true},
			{sized(1, 4, 0, 10_000), idle, 0, Pinned, true},
			{sized(1, 6, 0, 10_000), idle, 0, Pinned, true},
		}},
		{"a busy pin holds while the queue is shorter than the prefill a move costs", []step{
			{sized(1, 2, 0, 10_000), idle, 0, Spread, true},
			// 22 KB queued on replica 0, which holds 20 KB of the 40 KB
			// prompt: it costs 42 KB and a bit, another replica 40 KB of
			// prefill: cheaper, but by less than the margin.
			{sized(1, 4, 0, 10_000), busy(0, 22_000), 0, Pinned, false},
			// 15 KB queued: replica 0 is the cheapest.
			{sized(1, 4, 0, 10_000), busy(0, 15_000), 0, Pinned, true},
			// 70 KB queued: more than the 40 KB a move costs, and the
			// margin; replica 2 is busier than 1.
			{sized(1, 6, 0, 10_000), [3]Load{{Queued: 70_000, InFlight: 4}, {}, {InFlight: 1}}, 1, Balanced, true},
		}},
		{"a saturated pin moves and stays moved", []step{
			{sized(1, 2, 0, 10_000), idle, 0, Spread, true},
			// Replicas 1 and 2 cost the same: the counter's turn (1)
			// picks the second of them.
			{sized(1, 4, 0, 10_000), busy(0, 500_000), 2, Balanced, true},
			// Replica 0 is idle again: the pin moved with the conversation.
			{sized(1, 6, 0, 10_000), idle, 2, Pinned, true},
			{sized(1, 8, 0, 10_000), busy(0, 500_000), 2, Pinned, true},
		}},
		{"a warm shared prefix attracts a fresh request", []step{
			{sized(1, 2, 1, 50_000), idle, 0, Spread, true},
			{sized(2, 2, 1, 50_000), idle, 0, Pinned, true},
			{sized(3, 2, 1, 50_000), busy(0, 20_000), 0, Pinned, true},
		}},
		{"work that other callers queued on a replica keeps fresh requests off it", []step{
			// Equal costs go in turn: the counter's turns 0, 1, 2 pick
			// the first, second and first of the cheapest.
			{sized(1, 1, 0, 1000), [3]Load{{Foreign: 50_000}, {}, {}}, 1, Spread, true},
			{sized(2, 1, 0, 1000), [3]Load{{Foreign: 50_000}, {}, {}}, 2, Spread, true},
			{sized(3, 1, 0, 1000), [3]Load{{Foreign: 50_000}, {}, {}}, 1, Spread, true},
		}},
		{"and moves a conversation only past the prefill a move costs", []step{
			{sized(1, 2, 0, 10_000), idle, 0, Spread, true},
			{sized(1, 4, 0, 10_000), [3]Load{{Foreign: 22_000}, {}, {}}, 0, Pinned, true},
			{sized(1, 6, 0, 10_000), [3]Load{{Foreign: 70_000}, {}, {}}, 1, Balanced, true},
		}},
		{"unless its replica is busier than the prefill saved", []step{
			{sized(1, 2, 1, 50_000), idle, 0, Spread, true},
			{sized(2, 2, 1, 50_000), busy(0, 80_000), 2, Balanced, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pins := prefixcache.NewPinMap(1024, 3)
			var counter atomic.Uint64
			var loads Loads
			for i, s := range tt.steps {
				copy(loads[:3], s.load[:])
				req := Request{Chain: s.chain, Avail: upstream.Mask{all}, Size: ChainSize(s.chain, 0), Load: &loads}
				d := Choose(Cost, req, pins, &counter)
				if d.Replica != s.want || d.Reason != s.reason {
					t.Fatalf("step %d: got %d (%s), want %d (%s)", i, d.Replica, d.Reason, s.want, s.reason)
				}
				if s.serve {
					Served(Cost, req, d.Replica, 200, pins)
				}
			}
		})
	}
}

func TestCostPolicyPredictsCachedBytes(t *testing.T) {
	pins := prefixcache.NewPinMap(1024, 2)
	var counter atomic.Uint64
	var loads Loads
	first := sized(1, 2, 0, 3000)
	req := Request{Chain: first, Avail: upstream.Mask{0b11}, Size: ChainSize(first, 0), Load: &loads}
	if d := Choose(Cost, req, pins, &counter); d.Cached != 0 {
		t.Fatalf("a cold request predicted %d cached bytes", d.Cached)
	}
	Served(Cost, req, 1, 200, pins)
	next := sized(1, 4, 0, 3000)
	req = Request{Chain: next, Avail: upstream.Mask{0b11}, Size: ChainSize(next, 0), Load: &loads}
	if d := Choose(Cost, req, pins, &counter); d.Replica != 1 || d.Cached != 6000 || req.Size != 12_000 {
		t.Fatalf("the next turn: %+v, size %d; want replica 1 with its 6000 bytes cached of 12000", d, req.Size)
	}
}

// TestNoPolicyPicksAnUnavailableReplica replays random tables of pins, loads
// and available replicas through every policy: whatever the pin map and the
// loads say, the pick is an available replica, or none when none is.
func TestNoPolicyPicksAnUnavailableReplica(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, policy := range Policies {
		pins := prefixcache.NewPinMap(4096, 8)
		var counter atomic.Uint64
		var loads Loads
		for i := 0; i < 3000; i++ {
			chain := sized(rng.Intn(20), 1+rng.Intn(8), rng.Intn(3), uint64(1+rng.Intn(20_000)))
			avail := upstream.Mask{uint64(rng.Intn(256))}
			for r := 0; r < 8; r++ {
				loads[r] = Load{Waiting: int64(rng.Intn(5)), Queued: int64(rng.Intn(200_000)), InFlight: int64(rng.Intn(100))}
			}
			req := Request{Chain: chain, Avail: avail, Size: ChainSize(chain, 0), Load: &loads}
			if rng.Intn(4) == 0 {
				req.Session = SessionKey([]byte{byte(rng.Intn(4))})
			}
			d := Choose(policy, req, pins, &counter)
			if avail.Empty() {
				if d.Replica != -1 || d.Reason != NoReplica {
					t.Fatalf("%s: no replica available, got %+v", policy, d)
				}
				continue
			}
			if d.Replica < 0 || !avail.Has(d.Replica) {
				t.Fatalf("%s: picked %d, not in the available %b", policy, d.Replica, avail[0])
			}
			if d.Cached < 0 || d.Cached > req.Size {
				t.Fatalf("%s: predicted %d cached bytes of %d", policy, d.Cached, req.Size)
			}
			// Pins land anywhere, as replies from replicas now demoted did.
			Served(policy, req, rng.Intn(8), 200, pins)
		}
	}
}

// No policy allocates per pick, through the interface either: the cost
// policy's closures and match table stay on the stack.
func TestChooseAllocatesNothing(t *testing.T) {
	pins := prefixcache.NewPinMap(1024, 4)
	var counter atomic.Uint64
	var loads Loads
	chain := sized(1, 6, 1, 2000)
	Served(Cost, Request{Chain: chain[:4]}, 2, 200, pins)
	for _, p := range Policies {
		req := Request{Chain: chain, Avail: upstream.Mask{0b1111}, Size: ChainSize(chain, 0), Load: &loads}
		if n := testing.AllocsPerRun(100, func() { Choose(p, req, pins, &counter) }); n != 0 {
			t.Errorf("%s: %v allocations per pick", p, n)
		}
	}
}

// A stream's head may come before its prefill (uvicorn sends it at once):
// the request stays on its replica's queue, which the cost policy reads,
// until the first data, and leaves it then; and it is pinned then, when
// its prefix is in that replica's cache, not at the head.
func TestStreamStaysQueuedUntilItsFirstData(t *testing.T) {
	headSent, release := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == "/v1/models" {
			probeAnswer(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		close(headSent)
		<-release
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	p := startProxy(t, Cost, []string{a.url()})
	r := p.set.Replica(0)
	resp, err := client.Post(p.url("/v1/chat/completions"), "application/json", strings.NewReader(chat(1, 3)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-headSent
	if n, work := r.Waiting(); n != 1 || work <= 0 {
		t.Fatalf("after the head, before any data: %d waiting with %d bytes of work, want 1 and more than 0", n, work)
	}
	if n := p.h.pins.Pins(0); n != 0 {
		t.Fatalf("after the head, before any data: %d pins; a pin says the prefix is cached, which it is not yet", n)
	}
	close(release)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if n, work := r.Waiting(); n != 0 || work != 0 {
		t.Fatalf("after the first data: %d waiting with %d bytes of work, want none", n, work)
	}
	if n := p.h.pins.Pins(0); n == 0 {
		t.Fatal("after the first data: the conversation is not pinned")
	}
}

// Under -routing cost with -scrape-interval, a replica that reports
// requests which the proxy did not send (another proxy's, a batch job's)
// gets no fresh work while the other is idle, and /replicas shows what it
// reported; without scrapes the same requests alternate.
func TestCostReadsTheReplicasQueue(t *testing.T) {
	for _, scrape := range []bool{true, false} {
		t.Run(fmt.Sprintf("scrape=%v", scrape), func(t *testing.T) {
			scraped := make(chan string, 64)
			replica := func(name string, running, waiting int) string {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch r.URL.Path {
					case "/health":
					case "/metrics":
						fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", running, waiting)
						select {
						case scraped <- name:
						default:
						}
					case "/v1/models":
						http.NotFound(w, r)
					default:
						chatReply(name)(w, r)
					}
				}))
				t.Cleanup(srv.Close)
				return srv.URL
			}
			urls := []string{replica("busy", 16, 8), replica("idle", 0, 0)}
			p := startProxy(t, Cost, urls, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
				if scrape {
					u.ScrapeInterval = 5 * time.Millisecond
				}
			})
			if scrape {
				// Three reads of each page: one for the KV capacity
				// when the replica joins, two scrapes, the first of
				// which is stored.
				seen := map[string]int{}
				for seen["busy"] < 3 || seen["idle"] < 3 {
					seen[<-scraped]++
				}
			}
			got := map[string]int{}
			for c := 0; c < 6; c++ {
				r := post(p, "/v1/chat/completions", chat(c, 1))
				if r.err != nil || r.status != 200 {
					t.Fatalf("request %d: %v %d %s", c, r.err, r.status, r.body)
				}
				var answer struct{ Replica string }
				json.Unmarshal([]byte(r.body), &answer)
				got[answer.Replica]++
			}
			want := map[string]int{"busy": 3, "idle": 3}
			if scrape {
				want = map[string]int{"idle": 6}
			}
			if !maps.Equal(got, want) {
				t.Errorf("fresh requests went %v, want %v", got, want)
			}
			rec := httptest.NewRecorder()
			p.h.Admin(false).ServeHTTP(rec, httptest.NewRequest("GET", "/replicas", nil))
			var status struct {
				Replicas []replicaStatus `json:"replicas"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &status); err != nil {
				t.Fatal(err)
			}
			rep := status.Replicas[0].Reported
			switch {
			case !scrape && rep != nil:
				t.Errorf("/replicas shows a report without scrapes: %+v", rep)
			case scrape && (rep == nil || rep.Running != 16 || rep.Waiting != 8 || rep.KVUsage != 0.5 || rep.ForeignWaiting != 8):
				t.Errorf("/replicas shows %+v for the busy replica, want running 16, waiting 8 (all foreign), KV 0.5", rep)
			}
		})
	}
}

// While every replica has a queue, the prompt that one holds outweighs a
// longer queue there up to busyPrefillWeight times the prefill it saves;
// with a replica idle, the request goes where its own first token comes
// soonest.
func TestCostWeighsHeldPrefillWhenAllAreBusy(t *testing.T) {
	var c prefixcache.Chains
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a shared document ", 600) + `"},{"role":"user","content":"and a question"}]}`)
	if err := c.Read(body, prefixcache.DefaultPromptChunk); err != nil {
		t.Fatal(err)
	}
	size := ChainSize(c.Blocks, len(body))
	held := prefixcache.NewHoldings(2, 1<<20)
	held.Insert(0, c.Blocks[:len(c.Blocks)-1], 0) // all but the question
	saved, _ := held.Longest(0, c.Blocks)
	for _, tt := range []struct {
		name   string
		queued [2]int64
		want   int
	}{
		{"both idle", [2]int64{0, 0}, 0},
		{"the holder busier by less than the prefill it saves", [2]int64{saved / 2, 0}, 0},
		{"the other idle, the holder busier by more than it saves", [2]int64{2 * saved, 0}, 1},
		{"both busy, the holder busier by twice what it saves", [2]int64{2*saved + 1000, 1000}, 0},
		{"both busy, the holder busier by far more", [2]int64{2 * busyPrefillWeight * saved, 1000}, 1},
	} {
		var loads Loads
		loads[0].Queued, loads[1].Queued = tt.queued[0], tt.queued[1]
		var counter atomic.Uint64
		req := Request{Chain: c.Messages, Blocks: c.Blocks, Held: held, Size: size, Load: &loads, Avail: upstream.Mask{0b11}}
		if d := Choose(Cost, req, prefixcache.NewPinMap(64, 2), &counter); d.Replica != tt.want {
			t.Errorf("%s: replica %d (%v), want %d", tt.name, d.Replica, d.Reason, tt.want)
		}
	}
}

// busy is the loads of three replicas of which r has queued bytes waiting,
// and requests in flight.
func busy(r int, queued int64) [3]Load {
	var l [3]Load
	l[r] = Load{Waiting: 4, Queued: queued, InFlight: 4}
	return l
}
