package router

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// replicaStatus is one row of the admin listener's /replicas.
type replicaStatus struct {
	Name            string  `json:"name"`
	URL             string  `json:"url"`
	State           string  `json:"state"`
	InFlight        int64   `json:"in_flight"`
	Requests        uint64  `json:"requests"`
	Pins            int64   `json:"pins"`
	Demotions       uint64  `json:"demotions"`
	CooldownSeconds float64 `json:"cooldown_seconds"`
	// PromptTokens and CachedTokens are what the replica reported in its
	// answers' usage; HitRatio is their ratio, null before any.
	PromptTokens uint64   `json:"prompt_tokens"`
	CachedTokens uint64   `json:"cached_tokens"`
	HitRatio     *float64 `json:"hit_ratio"`
	// Held is what the replica's KV cache is believed to hold (under a
	// policy that reads it): the bytes of prompt rendering, the links of
	// -prompt-chunk bytes that make them, and the links evicted and
	// forgotten since the start. KVTokens is the capacity the replica
	// publishes, 0 for none, and HeldLimitBytes the bound in force (0: the
	// memory's alone).
	Held           prefixcache.HoldingStats `json:"held"`
	KVTokens       int64                    `json:"kv_capacity_tokens"`
	HeldLimitBytes int64                    `json:"held_limit_bytes"`
	// Reported is the replica's own queue from its last fresh scrape
	// (-scrape-interval), null without one.
	Reported *reported `json:"reported"`
}

type reported struct {
	Running int64   `json:"running"`
	Waiting int64   `json:"waiting"`
	KVUsage float64 `json:"kv_cache_usage"`
	// Foreign are the requests of Running and Waiting that the proxy did
	// not send.
	ForeignRunning int64     `json:"foreign_running"`
	ForeignWaiting int64     `json:"foreign_waiting"`
	At             time.Time `json:"at"`
}

// Admin returns the admin listener's handler: /metrics, /health, /replicas,
// and /debug/pprof/ when withPprof is set. It is kept off the proxy's
// listener so that a scrape never competes with requests and the proxy's
// paths stay the replicas' own.
func (h *Handler) Admin(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		h.m.WritePrometheus(w)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		status, body := h.healthStatus()
		w.WriteHeader(status)
		w.Write(body)
	})
	if withPprof {
		// Profiles, for finding where the proxy's CPU goes under real
		// load. They expose memory and goroutine dumps: only on request.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /replicas", func(w http.ResponseWriter, _ *http.Request) {
		replicas := h.set.Replicas()
		rows := make([]replicaStatus, len(replicas))
		for i, r := range replicas {
			rows[i] = replicaStatus{
				Name: r.Name, URL: r.URL, State: upstream.StateNames[r.State()], InFlight: r.InFlight(), Requests: r.Requests(),
				Pins: h.pins.Pins(r.Index), Demotions: r.Demotions(), CooldownSeconds: r.Cooldown().Seconds(),
			}
			rows[i].PromptTokens, rows[i].CachedTokens = h.m.replicaTokens(r.Index)
			rows[i].Held, rows[i].KVTokens, rows[i].HeldLimitBytes = h.held.Stats(r.Index), r.KVTokens(), h.kvBytes(r)
			if p := rows[i].PromptTokens; p > 0 {
				ratio := float64(rows[i].CachedTokens) / float64(p)
				rows[i].HitRatio = &ratio
			}
			if rep, fresh := r.Reported(time.Now()); fresh {
				fr, fw := rep.Foreign()
				rows[i].Reported = &reported{rep.Running, rep.Waiting, rep.KVUsage, fr, fw, rep.At}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"policy": h.cfg.Policy.String(), "replicas": rows})
	})
	return mux
}
