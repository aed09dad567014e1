package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// What a replica's KV cache can hold, in tokens, read from what its engine
// publishes, when it joins and when it comes back (it may have restarted
// with other settings):
//
//   - vLLM: num_gpu_blocks x block_size, the labels of the
//     vllm:cache_config_info gauge on its metrics page;
//   - SGLang: max_total_num_tokens in GET /get_server_info;
//   - llama.cpp: n_ctx of a slot x total_slots in GET /props.
//
// The router bounds what it believes a replica holds by a few times it. A
// replica that publishes none keeps 0, and the router's -kv-capacity flag
// stands in for it.
// With scrapes on (Config.ScrapeInterval), the metrics page is read by
// the scrapes, each of which reads the capacity too.

// KVTokens returns the KV capacity the replica published, in tokens; 0 for
// none.
func (r *Replica) KVTokens() int64 { return r.kvTokens.Load() }

// capacityLimit bounds what is read of each answer: vLLM's metrics page
// is a few hundred kilobytes with many LoRA adapters or buckets.
const capacityLimit = 4 << 20

// fetchCapacity asks r for its KV capacity and records it; one that
// answers none of the questions keeps what it said last.
func (r *Replica) fetchCapacity(ctx context.Context, client *http.Client) {
	for _, q := range []struct {
		path string
		read func([]byte) int64
	}{
		{r.set.cfg.MetricsPath, vllmMetricsPage},
		{"/get_server_info", sglangCapacity},
		{"/props", llamaCapacity},
	} {
		if q.path == r.set.cfg.MetricsPath && r.set.scrapeClient != nil {
			continue // the scrapes read it
		}
		status, body := r.get(ctx, client, q.path)
		if status != http.StatusOK {
			continue
		}
		if n := q.read(body); n > 0 {
			r.setKVTokens(n, q.path)
			return
		}
	}
}

func (r *Replica) setKVTokens(n int64, from string) {
	if r.kvTokens.Swap(n) != n {
		r.set.cfg.Logger.Info("replica KV capacity", "replica", r.Name, "tokens", n, "from", from)
	}
}

// get returns the status and body of r's answer to GET path, 0 when
// it could not be read.
func (r *Replica) get(ctx context.Context, client *http.Client, path string) (status int, body []byte) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+path, nil)
	if err != nil {
		return 0, nil
	}
	req.Header.Set("User-Agent", ProbeUserAgent)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	if body, err = io.ReadAll(io.LimitReader(resp.Body, capacityLimit)); err != nil {
		return 0, nil
	}
	return resp.StatusCode, body
}

var vllmCacheConfig = []byte("vllm:cache_config_info{")

// vllmMetricsPage reads the capacity from the vllm:cache_config_info line of a
// metrics page.
func vllmMetricsPage(page []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line := sc.Bytes(); bytes.HasPrefix(line, vllmCacheConfig) {
			return vllmCapacity(line)
		}
	}
	return 0
}

// vllmCapacity reads num_gpu_blocks x block_size from the labels of a
// vllm:cache_config_info line.
func vllmCapacity(line []byte) int64 {
	blocks, size := label(line, "num_gpu_blocks"), label(line, "block_size")
	if blocks > 0 && size > 0 {
		return blocks * size
	}
	return 0
}

// label returns the integer value of the Prometheus label name in line, 0
// if it has none.
func label(line []byte, name string) int64 {
	for rest := line; ; {
		i := bytes.Index(rest, []byte(name+`="`))
		if i < 0 {
			return 0
		}
		if i > 0 && rest[i-1] != '{' && rest[i-1] != ',' {
			rest = rest[i+len(name):] // the tail of another label's name
			continue
		}
		v := rest[i+len(name)+2:]
		end := bytes.IndexByte(v, '"')
		if end < 0 {
			return 0
		}
		n, err := strconv.ParseInt(string(v[:end]), 10, 64)
		if err != nil {
			return 0
		}
		return n
	}
}

// sglangCapacity reads max_total_num_tokens, at the top of the answer or
// in its scheduler's state (internal_states), as versions differ.
func sglangCapacity(body []byte) int64 {
	var info struct {
		Max    int64 `json:"max_total_num_tokens"`
		States []struct {
			Max int64 `json:"max_total_num_tokens"`
		} `json:"internal_states"`
	}
	if json.Unmarshal(body, &info) != nil {
		return 0
	}
	if info.Max > 0 {
		return info.Max
	}
	var n int64
	for _, s := range info.States {
		n += max(s.Max, 0)
	}
	return n
}

// llamaCapacity reads n_ctx x total_slots: each slot keeps its own prompt.
func llamaCapacity(body []byte) int64 {
	var props struct {
		Settings struct {
			NCtx int64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
		Slots int64 `json:"total_slots"`
	}
	if json.Unmarshal(body, &props) != nil || props.Settings.NCtx <= 0 {
		return 0
	}
	return props.Settings.NCtx * max(props.Slots, 1)
}
