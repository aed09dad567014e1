package upstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Each engine's way of publishing its KV capacity is read, and anything
// else reads as none.
func TestCapacityParsers(t *testing.T) {
	for _, c := range []struct {
		name string
		read func([]byte) int64
		body string
		want int64
	}{
		{"vllm", vllmMetricsPage, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n" +
			`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27153",prefix_caching_hash_algo="sha256"} 1.0` + "\n", 27153 * 16},
		{"vllm, labels in another order", vllmMetricsPage, `vllm:cache_config_info{num_gpu_blocks="100",block_size="32"} 1.0`, 3200},
		{"vllm, a label that ends in the name", vllmMetricsPage, `vllm:cache_config_info{cpu_num_gpu_blocks="9",num_gpu_blocks="10",block_size="16"} 1.0`, 160},
		{"vllm, blocks unknown", vllmMetricsPage, `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0`, 0},
		{"a page without it", vllmMetricsPage, "vllm:num_requests_running{model_name=\"m\"} 1\n", 0},
		{"sglang", sglangCapacity, `{"max_total_num_tokens":812345,"version":"0.5"}`, 812345},
		{"sglang, per scheduler", sglangCapacity, `{"internal_states":[{"max_total_num_tokens":1000},{"max_total_num_tokens":2000}]}`, 3000},
		{"sglang, not JSON", sglangCapacity, `<html>`, 0},
		{"llama.cpp", llamaCapacity, `{"default_generation_settings":{"n_ctx":4096},"total_slots":4}`, 16384},
		{"llama.cpp, no slot count", llamaCapacity, `{"default_generation_settings":{"n_ctx":4096}}`, 4096},
		{"llama.cpp, no context", llamaCapacity, `{"total_slots":4}`, 0},
	} {
		if got := c.read([]byte(c.body)); got != c.want {
			t.Errorf("%s: %d tokens, want %d", c.name, got, c.want)
		}
	}
}

// A replica's capacity is read from whichever engine's
// answer it gives; a replica that gives none keeps 0.
func TestCapacityRead(t *testing.T) {
	for _, c := range []struct {
		name  string
		pages map[string]string
		want  int64
	}{
		{"vllm", map[string]string{"/metrics": `vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0`}, 16000},
		{"sglang", map[string]string{"/get_server_info": `{"max_total_num_tokens":50000}`}, 50000},
		{"llama.cpp", map[string]string{"/props": `{"default_generation_settings":{"n_ctx":8192},"total_slots":2}`}, 16384},
		{"none", map[string]string{}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				page, ok := c.pages[r.URL.Path]
				if !ok {
					http.NotFound(w, r)
					return
				}
				fmt.Fprint(w, page)
			}))
			defer srv.Close()
			s, err := NewSet([]string{srv.URL}, Config{})
			if err != nil {
				t.Fatal(err)
			}
			r := s.Replica(0)
			r.fetchCapacity(context.Background(), srv.Client())
			if got := r.KVTokens(); got != c.want {
				t.Fatalf("%d tokens, want %d", got, c.want)
			}
		})
	}
}

// With scrapes on, the scrapes read the capacity from the metrics page.
func TestCapacityReadByScrape(t *testing.T) {
	rep, ok := parseQueue(strings.NewReader("vllm:num_requests_running{model_name=\"m\"} 1\n" + `vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0` + "\n"))
	if !ok || rep.KVTokens != 160 || rep.Running != 1 {
		t.Fatalf("report %+v (%v), want 160 tokens of capacity and 1 running", rep, ok)
	}
}
