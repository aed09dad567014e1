package sim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Replica is one simulated vLLM server on a loopback port. Stop and Start
// take it down and bring it back on the same port, with an empty cache, as
// a restarted process would.
type Replica struct {
	cfg  Config
	addr string

	mu      sync.Mutex
	srv     *http.Server
	eng     *engine
	running bool

	requests atomic.Int64
	ids      atomic.Uint64

	// stored holds the Responses API's stored responses by id, in this
	// process's memory as vLLM keeps them: a restart loses them.
	storeMu sync.Mutex
	stored  map[string][]message
}

// NewReplica starts a replica on addr ("127.0.0.1:0" picks a port).
func NewReplica(addr string, cfg Config) (*Replica, error) {
	r := &Replica{cfg: cfg, addr: addr}
	if err := r.Start(); err != nil {
		return nil, err
	}
	return r, nil
}

// Addr is the replica's host:port.
func (r *Replica) Addr() string { return r.addr }

// URL is the replica's base URL.
func (r *Replica) URL() string {
	if r.cfg.TLS != nil {
		return "https://" + r.addr
	}
	return "http://" + r.addr
}

// Requests returns how many generation requests the replica received.
func (r *Replica) Requests() int64 { return r.requests.Load() }

// PrefillBusy returns the share of the engine's time since it started
// (since its last restart) that went to steps that prefilled: while it is
// near 1, a request's first token waits for the prompts ahead of it.
func (r *Replica) PrefillBusy() float64 {
	prefill, now := r.engine().busy()
	if now <= 0 {
		return 0
	}
	return prefill / now
}

// Start listens on the replica's address again after Stop.
func (r *Replica) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return nil
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old socket may linger a moment
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("sim: cannot listen on %s: %w", r.addr, err)
	}
	r.addr = ln.Addr().String()
	r.eng = newEngine(r.cfg)
	r.storeMu.Lock()
	r.stored = map[string][]message{}
	r.storeMu.Unlock()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", r.completions(true))
	mux.HandleFunc("POST /v1/completions", r.completions(false))
	mux.HandleFunc("POST /v1/responses", r.responses)
	mux.HandleFunc("POST /v1/messages", r.messages)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /v1/models", r.models)
	mux.HandleFunc("GET /metrics", r.metrics)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if r.cfg.TLS != nil {
		ln = tls.NewListener(ln, r.cfg.TLS)
	}
	go r.srv.Serve(ln)
	r.running = true
	return nil
}

// Stop closes the listener and every connection at once and drops the
// engine's work and cache, as a killed process does.
func (r *Replica) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return
	}
	r.srv.Close()
	r.eng.close()
	r.running = false
}

// Shutdown stops like a graceful restart: no new connections, in-flight
// requests finish first.
func (r *Replica) Shutdown(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return
	}
	r.srv.Shutdown(ctx)
	r.eng.close()
	r.running = false
}

func (r *Replica) engine() *engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng
}

// request is the part of an OpenAI request the simulator reads.
type request struct {
	Model         string          `json:"model"`
	Messages      []message       `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	MaxTokens     *int            `json:"max_tokens"`
	MaxCompletion *int            `json:"max_completion_tokens"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

// render writes the prompt as a ChatML-style template renders it: what the
// engine tokenizes and caches.
func render(req *request) []byte {
	var b []byte
	for _, m := range req.Messages {
		b = append(b, "<|im_start|>"...)
		b = append(b, m.Role...)
		if m.Name != "" {
			b = append(b, " name="...)
			b = append(b, m.Name...)
		}
		b = append(b, '\n')
		b = appendContent(b, m.Content)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b = append(b, m.ToolCalls...)
		}
		if m.ToolCallID != "" {
			b = append(b, " tool_call_id="...)
			b = append(b, m.ToolCallID...)
		}
		b = append(b, "<|im_end|>\n"...)
	}
	if req.Messages != nil {
		return append(b, "<|im_start|>assistant\n"...)
	}
	return appendContent(b, req.Prompt)
}

// appendContent appends a string, or the parts of an array of parts: the
// text of a text part, the JSON of any other (an image, a tool call or its
// result), which takes tokens of the prompt as well.
func appendContent(b []byte, raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return b
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return append(b, s...)
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) == nil {
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			if json.Unmarshal(p, &part) == nil && part.Text != nil {
				b = append(b, *part.Text...)
			} else {
				b = append(b, p...)
			}
		}
		return b
	}
	return append(b, raw...)
}

// blockHashes returns the chained hash of each full KV block of prompt.
func (r *Replica) blockHashes(prompt []byte) []uint64 {
	size := r.cfg.BlockTokens * r.cfg.BytesPerToken
	n := len(prompt) / size
	out := make([]uint64, n)
	var d xxhash.Digest
	var prev [8]byte
	for i := 0; i < n; i++ {
		d.Reset()
		d.Write(prev[:])
		d.Write(prompt[i*size : (i+1)*size])
		h := d.Sum64()
		out[i] = h
		for j := range prev {
			prev[j] = byte(h >> (8 * j))
		}
	}
	return out
}

func apiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"object":"error","message":%q,"type":"BadRequestError","code":%d}`, msg, status)
}

// Usage is the OpenAI usage object with vLLM's cached-token detail; Sim
// adds the engine's own model-time measurements, in real-scale units.
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	Sim struct {
		TTFTMs    float64 `json:"ttft_ms"`
		LatencyMs float64 `json:"latency_ms"`
	} `json:"sim"`
}

func (r *Replica) completions(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		r.requests.Add(1)
		body, err := io.ReadAll(hr.Body)
		if err != nil {
			return
		}
		var req request
		if err := json.Unmarshal(body, &req); err != nil {
			apiError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
			return
		}
		if chat && len(req.Messages) == 0 {
			apiError(w, http.StatusBadRequest, "messages must not be empty")
			return
		}
		maxTokens, ok := r.maxTokens(w, req.MaxTokens, req.MaxCompletion)
		if !ok {
			return
		}
		model, ok := r.model(w, req.Model)
		if !ok {
			return
		}
		if !chat {
			req.Messages = nil
		}
		eng, s := r.submit(render(&req), maxTokens)
		id := fmt.Sprintf("cmpl-sim-%d", r.ids.Add(1))
		if req.Stream {
			r.stream(w, hr, eng, s, chat, id, model, req.StreamOptions.IncludeUsage)
			return
		}
		n, ok := relay(hr, eng, s, nil)
		if !ok {
			if n == 0 && hr.Context().Err() == nil {
				apiError(w, http.StatusServiceUnavailable, "engine stopped")
			}
			return
		}
		u := r.usage(eng, s, n)
		text := tokenText(n)
		var out any
		if chat {
			out = map[string]any{"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "length"}},
				"usage":   u}
		} else {
			out = map[string]any{"id": id, "object": "text_completion", "created": time.Now().Unix(), "model": model,
				"choices": []any{map[string]any{"index": 0, "text": text, "finish_reason": "length"}}, "usage": u}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}
}

// maxTokens returns the first of limits that is set, or the default, and
// answers 400 when it is out of range.
func (r *Replica) maxTokens(w http.ResponseWriter, limits ...*int) (int, bool) {
	n := r.cfg.DefaultMaxTokens
	for _, l := range limits {
		if l != nil {
			n = *l
			break
		}
	}
	if n < 1 || n > 1<<16 {
		apiError(w, http.StatusBadRequest, "max_tokens must be between 1 and 65536")
		return 0, false
	}
	return n, true
}

// model returns the model that answers a request for name (the default
// when name is empty), or answers vLLM's 404 when the replica does not
// serve it.
func (r *Replica) model(w http.ResponseWriter, name string) (string, bool) {
	if name == "" {
		return r.served()[0], true
	}
	if len(r.cfg.Served) > 0 && !slices.Contains(r.cfg.Served, name) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"object":"error","message":%q,"type":"NotFoundError","param":null,"code":404}`, "The model `"+name+"` does not exist.")
		return "", false
	}
	return name, true
}

// submit queues a rendered prompt in the engine.
func (r *Replica) submit(prompt []byte, maxTokens int) (*engine, *seq) {
	promptTokens := (len(prompt) + r.cfg.BytesPerToken - 1) / r.cfg.BytesPerToken
	eng := r.engine()
	return eng, eng.submit(r.blockHashes(prompt), promptTokens, maxTokens)
}

// relay waits for s's tokens and calls each, if set, as each one comes
// with the count so far. It returns the count, and false when the client
// left (the request is aborted) or the engine stopped before a token.
func relay(hr *http.Request, eng *engine, s *seq, each func(n int)) (int, bool) {
	n := 0
	for {
		select {
		case _, ok := <-s.tokens:
			if !ok {
				return n, n > 0
			}
			n++
			if each != nil {
				each(n)
			}
		case <-hr.Context().Done():
			eng.abort(s)
			return n, false
		}
	}
}

func (r *Replica) usage(eng *engine, s *seq, n int) Usage {
	var u Usage
	eng.mu.Lock()
	u.PromptTokens, u.CompletionTokens = s.promptTokens, n
	u.PromptTokensDetails.CachedTokens = s.cachedTokens
	u.Sim.TTFTMs = (s.firstToken - s.arrival) * 1000
	u.Sim.LatencyMs = (eng.vt - s.arrival) * 1000
	eng.mu.Unlock()
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// stream writes one SSE event per token in vLLM's chunk format, then the
// usage chunk if asked for, then data: [DONE].
func (r *Replica) stream(w http.ResponseWriter, hr *http.Request, eng *engine, s *seq, chat bool, id, model string, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	created := time.Now().Unix()
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	event := func(delta, finish string, u *Usage) {
		var choice map[string]any
		switch {
		case u != nil:
		case chat && delta == "" && finish == "":
			choice = map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}
		case chat:
			choice = map[string]any{"index": 0, "delta": map[string]any{"content": delta}, "finish_reason": nilIfEmpty(finish)}
		default:
			choice = map[string]any{"index": 0, "text": delta, "finish_reason": nilIfEmpty(finish)}
		}
		ev := map[string]any{"id": id, "object": object, "created": created, "model": model}
		if u != nil {
			ev["choices"] = []any{}
			ev["usage"] = u
		} else {
			ev["choices"] = []any{choice}
		}
		b, _ := json.Marshal(ev)
		w.Write([]byte("data: "))
		w.Write(b)
		w.Write([]byte("\n\n"))
		fl.Flush()
	}
	n := 0
	for {
		select {
		case _, ok := <-s.tokens:
			if !ok {
				if n == 0 {
					return // the engine stopped: cut the stream
				}
				event("", "length", nil)
				if includeUsage {
					u := r.usage(eng, s, n)
					event("", "", &u)
				}
				w.Write([]byte("data: [DONE]\n\n"))
				fl.Flush()
				return
			}
			if n == 0 && chat {
				event("", "", nil)
			}
			n++
			event(tokenText(1), "", nil)
		case <-hr.Context().Done():
			eng.abort(s)
			return
		}
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// tokenText is n tokens of output text.
func tokenText(n int) string { return strings.Repeat("tok ", n) }

func (r *Replica) models(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	var data []map[string]any
	for _, m := range r.served() {
		data = append(data, map[string]any{"id": m, "object": "model", "owned_by": "warmroute-sim", "root": r.served()[0]})
	}
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// served returns the models the replica lists, its default first.
func (r *Replica) served() []string {
	if len(r.cfg.Served) > 0 {
		return r.cfg.Served
	}
	return []string{r.cfg.Model}
}

// metrics serves a subset of vLLM's Prometheus metrics under their names.
func (r *Replica) metrics(w http.ResponseWriter, _ *http.Request) {
	st := r.engine().stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	m := r.cfg.Model
	fmt.Fprintf(w, "vllm:num_requests_running{model_name=%q} %d\n", m, st.running)
	fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=%q} %d\n", m, st.waiting)
	fmt.Fprintf(w, "vllm:prefix_cache_queries_total{model_name=%q} %d\n", m, st.promptTokens)
	fmt.Fprintf(w, "vllm:prefix_cache_hits_total{model_name=%q} %d\n", m, st.cachedTokens)
	fmt.Fprintf(w, "vllm:prompt_tokens_total{model_name=%q} %d\n", m, st.promptTokens)
	fmt.Fprintf(w, "vllm:generation_tokens_total{model_name=%q} %d\n", m, st.generated)
	fmt.Fprintf(w, "vllm:request_success_total{model_name=%q} %d\n", m, st.requestsDone)
	fmt.Fprintf(w, "vllm:kv_cache_usage_perc{model_name=%q} %g\n", m, st.kvUsage)
	// The KV capacity, as vLLM publishes its cache config: an info gauge
	// of value 1 whose labels are the config's fields (vLLM 0.10's set),
	// num_gpu_blocks of block_size tokens each.
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(w, `vllm:cache_config_info{block_size="%d",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",`+
		`enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",`+
		`num_gpu_blocks="%d",num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"} 1.0`+"\n",
		r.cfg.BlockTokens, r.cfg.KVCapacityTokens/r.cfg.BlockTokens)
}

// Cluster is a set of replicas started together, for -simulate.
type Cluster struct{ Replicas []*Replica }

// StartCluster starts n replicas on free loopback ports.
func StartCluster(n int, cfg Config) (*Cluster, error) {
	c := &Cluster{}
	for i := 0; i < n; i++ {
		r, err := NewReplica("127.0.0.1:0", cfg)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Replicas = append(c.Replicas, r)
	}
	return c, nil
}

// URLs returns the replicas' base URLs.
func (c *Cluster) URLs() []string {
	var out []string
	for _, r := range c.Replicas {
		out = append(out, r.URL())
	}
	return out
}

// Close stops every replica.
func (c *Cluster) Close() {
	for _, r := range c.Replicas {
		r.Stop()
	}
}
