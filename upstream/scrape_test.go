package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const vllmPage = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.42
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_running_total{model_name="x"} 99
`

func TestParseQueue(t *testing.T) {
	tests := []struct {
		name  string
		page  string
		want  Report
		found bool
	}{
		{"vLLM", vllmPage, Report{Running: 7, Waiting: 3, KVUsage: 0.42}, true},
		{"vLLM before 0.10", "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:num_requests_waiting{model_name=\"m\"} 1\n",
			Report{Waiting: 1, KVUsage: 0.5}, true},
		{"two engines of a data-parallel replica add up", `vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 5
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.6
`, Report{Running: 7, KVUsage: 0.4}, true},
		{"SGLang", "sglang:num_running_reqs{model_name=\"m\"} 4.0\nsglang:num_queue_reqs{model_name=\"m\"} 9.0\nsglang:token_usage{model_name=\"m\"} 0.25\n",
			Report{Running: 4, Waiting: 9, KVUsage: 0.25}, true},
		{"llama.cpp, no labels, a timestamp", "llamacpp:requests_processing 2 1700000000000\nllamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.125\n",
			Report{Running: 2, Waiting: 1, KVUsage: 0.125}, true},
		{"a label value with a space and a brace", `vllm:num_requests_waiting{model_name="a b}",x="\"}"} 6` + "\n", Report{Waiting: 6}, true},
		{"unparsable values are skipped", "vllm:num_requests_waiting{} NaN\nvllm:num_requests_running{} -3\nvllm:num_requests_running{} x\nvllm:num_requests_running{} 2\n",
			Report{Running: 2}, true},
		{"a broken count is capped", "vllm:num_requests_waiting 1e300\nvllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc 7\n",
			Report{Waiting: maxReported, KVUsage: 1}, true},
		{"an unclosed label set", `vllm:num_requests_waiting{model_name="m 4` + "\n", Report{}, false},
		{"another server's page", "process_cpu_seconds_total 12\ngo_goroutines 40\n", Report{}, false},
		{"empty", "", Report{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := parseQueue(strings.NewReader(tt.page))
			if found != tt.found || got != tt.want {
				t.Errorf("parseQueue = %+v, %v; want %+v, %v", got, found, tt.want, tt.found)
			}
		})
	}
}

func TestReportForeign(t *testing.T) {
	tests := []struct {
		rep              Report
		running, waiting int64
	}{
		{Report{Running: 7, Waiting: 3}, 7, 3},                           // none of ours
		{Report{Running: 7, Waiting: 3, Ours: 10, OursWaiting: 3}, 0, 0}, // all ours
		{Report{Running: 7, Waiting: 3, Ours: 4, OursWaiting: 1}, 4, 2},  // four of ours, one with no byte
		{Report{Running: 2, Waiting: 0, Ours: 5, OursWaiting: 5}, 0, 0},  // ours not all arrived yet
		{Report{Running: 8, Waiting: 6, Ours: 3, OursWaiting: 3}, 8, 3},  // ours taken to wait
		{Report{Running: 1, Waiting: 4, Ours: 4, OursWaiting: 0}, 0, 1},  // never more foreign than all less ours
	}
	for _, tt := range tests {
		r, w := tt.rep.Foreign()
		if r != tt.running || w != tt.waiting {
			t.Errorf("%+v.Foreign() = %d, %d; want %d, %d", tt.rep, r, w, tt.running, tt.waiting)
		}
	}
}

// A watched set reads each replica's metrics page on its own interval, over
// a real connection, records what the proxy had in flight there when it
// answered, and calls a report stale three intervals on.
func TestScrapeReadsTheReplicasQueue(t *testing.T) {
	hits := make(chan int64, 100)
	release := make(chan struct{})
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			return // the health probe and the models
		}
		k := n.Add(1)
		if k >= 3 {
			// The third scrape and later wait: the second's report
			// stays the last one.
			hits <- k
			<-release
			return
		}
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 2\n", k)
		hits <- k
	}))
	defer srv.Close()
	defer close(release)
	s, err := NewSet([]string{srv.URL}, Config{ScrapeInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Replica(0)
	if _, fresh := r.Reported(time.Now()); fresh {
		t.Fatal("a report before any scrape")
	}
	r.inflight.Store(3)
	r.waiting.Store(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Watch(ctx)
	// The loop scrapes one at a time: when the third is asked, the
	// second is stored.
	for <-hits < 3 {
	}
	rep, fresh := r.Reported(time.Now())
	if !fresh || rep.Running != 2 || rep.Waiting != 2 || rep.Ours != 3 || rep.OursWaiting != 1 {
		t.Fatalf("report %+v (fresh %v), want running 2, waiting 2, ours 3 and 1", rep, fresh)
	}
	// Three intervals and a scrape's timeout (HealthTimeout, 2s).
	life := 3*5*time.Millisecond + 2*time.Second
	if _, fresh := r.Reported(rep.At.Add(life + time.Millisecond)); fresh {
		t.Errorf("a report older than %v is fresh", life)
	}
	if _, fresh := r.Reported(rep.At.Add(life)); !fresh {
		t.Errorf("a report is stale before %v", life)
	}
	// A replica that went down and came back has no report until its
	// next scrape.
	r.state.Store(Down)
	r.readmit()
	if _, fresh := r.Reported(rep.At); fresh {
		t.Error("a readmitted replica kept the report from before it went down")
	}
}

// A replica's metrics page is input from outside: no page panics the
// reader or yields a negative or unbounded count.
func FuzzParseQueue(f *testing.F) {
	f.Add(vllmPage)
	f.Add("sglang:num_queue_reqs{a=\"}\"} 3 17\n")
	f.Add("vllm:num_requests_waiting{x=\"\\\"\"} 1e300\n")
	f.Fuzz(func(t *testing.T, page string) {
		rep, found := parseQueue(strings.NewReader(page))
		if !found && rep != (Report{}) {
			t.Fatalf("nothing found but %+v", rep)
		}
		if rep.Running < 0 || rep.Waiting < 0 || rep.Running > maxReported || rep.Waiting > maxReported || rep.KVUsage < 0 || rep.KVUsage > 1 {
			t.Fatalf("negative report %+v from %q", rep, page)
		}
		fr, fw := rep.Foreign()
		if fr < 0 || fw < 0 || fr+fw > rep.Running+rep.Waiting {
			t.Fatalf("foreign %d, %d of %+v", fr, fw, rep)
		}
	})
}

// A replica without a metrics page is warned about once, not every
// interval, and has no report.
func TestScrapeWarnsOnceAboutAPageItCannotRead(t *testing.T) {
	hits := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			hits <- struct{}{}
		}
	}))
	defer srv.Close()
	var logs lockedBuffer
	s, err := NewSet([]string{srv.URL}, Config{ScrapeInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Watch(ctx)
	for i := 0; i < 4; i++ {
		<-hits // the fourth is asked after the third was logged
	}
	if n := strings.Count(logs.String(), "replica metrics unread"); n != 1 {
		t.Errorf("%d warnings after 3 failed scrapes, want 1:\n%s", n, logs.String())
	}
	if _, fresh := s.Replica(0).Reported(time.Now()); fresh {
		t.Error("a report from a page that was not read")
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
