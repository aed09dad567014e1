package router

import (
	"crypto/sha256"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/tracing"
	"github.com/warmroute/warmroute/upstream"
)

// Config is the handler's part of the command line.
type Config struct {
	Policy Policy
	// MaxSends is how many replicas one request may be sent to when the
	// earlier ones could not take it (default 2: one failover).
	MaxSends int
	// BufferLimit is the largest non-streamed response body read whole
	// before it is written; larger ones are streamed (default 1 MiB).
	BufferLimit int
	// PromptChunk is how many bytes of a prompt's rendering make one link
	// of its Blocks chain (prefixcache.DefaultPromptChunk by default).
	PromptChunk int
	// HeldMemory is the memory, per replica, of what the proxy believes
	// each replica's cache holds (prefixcache.Holdings; 4 MiB by default).
	HeldMemory int64
	// KVTokens is the KV capacity, in tokens, of a replica that publishes
	// none of its own (upstream.Replica.KVTokens), which bounds what it is
	// believed to hold (heldLifetimes); 0 bounds it by HeldMemory alone.
	KVTokens int64
	// SessionHeaders name the headers whose values name a request's
	// session (session.go; DefaultSessionHeaders in main); empty turns
	// header sessions off, not the body's prompt_cache_key.
	SessionHeaders []string
	// AccessLog writes one INFO line per request: client, method, path,
	// model, replica, route, status, time to first byte, duration and
	// bytes.
	AccessLog bool
	// Rendezvous places requests that no pin places by rendezvous hashing
	// under a load bound instead of the counter (placement.go): set when
	// several instances serve one fleet, so they agree.
	Rendezvous bool
	// PinStore, when set, shares with other instances the pins that
	// rendezvous placement cannot compute (pins.go); nil for local pins
	// only.
	PinStore *pinstore.Store
	// StripAuthorization keeps the client's Authorization and X-Api-Key
	// headers from the replicas (they are passed on by default: a replica
	// may check its own key).
	StripAuthorization bool
	// ForwardPaths are paths forwarded besides the inference API
	// (front.go), each matched whole: an administrative endpoint that
	// the replicas serve, say.
	ForwardPaths []string
	// Tracer exports one span per request (-otlp-endpoint); nil, the
	// default, costs a request nothing.
	Tracer *tracing.Tracer
	Logger *slog.Logger
}

// Handler is the proxy's fasthttp handler.
type Handler struct {
	cfg     Config
	set     *upstream.Set
	pins    *prefixcache.PinMap
	held    *prefixcache.Holdings
	m       *Metrics
	counter atomic.Uint64
	// pickMu makes the picks that read the load one at a time (pick.go).
	pickMu sync.Mutex
	log    *slog.Logger
	// writeTimeout is the server's WriteTimeout, extended chunk by chunk
	// while a stream flows (request.go, Read).
	writeTimeout time.Duration
	// draining is set on SIGTERM: both /health endpoints answer 503 so
	// that load balancers stop sending, while requests are still served.
	draining atomic.Bool
	// cutting is set when the drain's deadline passed: a stream that ends
	// now was cut by the drain, not by its replica.
	cutting atomic.Bool
	// keys are the digests of the API keys, nil when none is required.
	keys atomic.Pointer[[][sha256.Size]byte]
	// budget bounds the large request bodies held at once; nil if off.
	budget *bodyBudget
	// sessions are Config.SessionHeaders (session.go).
	sessions sessionHeaders
	// responses maps each Responses API id that a replica returned to
	// that replica, which alone holds the stored response.
	responses *prefixcache.PinMap
	// scrapes is set when the replicas' own queues are read
	// (upstream.Config.ScrapeInterval); meanWork is then the mean prefill
	// bytes of the proxy's recent requests, what a request that another
	// caller queued is taken to cost.
	scrapes  bool
	meanWork atomic.Int64
}

// Drain makes both /health endpoints answer 503 from now on, while the
// proxy goes on serving: the first step of a graceful stop.
func (h *Handler) Drain() { h.draining.Store(true) }

// Cut records that the drain's deadline passed and returns how many
// requests are still in flight: they are about to be cut, and are logged
// as cut by the drain rather than as replica faults.
func (h *Handler) Cut() int64 {
	h.cutting.Store(true)
	var n int64
	for _, r := range h.set.Replicas() {
		n += r.InFlight()
	}
	return n
}

// New returns a handler that routes over set with pins.
func New(cfg Config, set *upstream.Set, pins *prefixcache.PinMap, m *Metrics) *Handler {
	if cfg.MaxSends < 1 {
		cfg.MaxSends = 2
	}
	if cfg.BufferLimit <= 0 {
		cfg.BufferLimit = 1 << 20
	}
	if cfg.PromptChunk <= 0 {
		cfg.PromptChunk = prefixcache.DefaultPromptChunk
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HeldMemory <= 0 {
		cfg.HeldMemory = DefaultHeldMemory
	}
	held := prefixcache.NewHoldings(upstream.MaxReplicas, cfg.HeldMemory)
	// A replica that leaves takes its pins and what it held: one that
	// later gets its slot must not inherit its conversations.
	set.Observe(upstream.Observer{Leave: func(r *upstream.Replica) {
		pins.DropReplica(r.Index)
		held.DropReplica(r.Index)
	}})
	m.store, m.held = cfg.PinStore, held
	h := &Handler{cfg: cfg, set: set, pins: pins, held: held, m: m, log: cfg.Logger,
		responses: prefixcache.NewPinMap(responseCapacity, upstream.MaxReplicas),
		scrapes:   set.Scrapes(), sessions: newSessionHeaders(cfg.SessionHeaders)}
	return h
}

var (
	strHealth          = []byte("/health")
	strChatPath        = []byte("/chat/completions")
	strCompletionsPath = []byte("/completions")
	strMessagesPath    = []byte("/v1/messages") // Anthropic's Messages API
	strResponsesPath   = []byte("/v1/responses")
	strModelsPath      = []byte("/v1/models")
	headerReplica      = []byte("X-Warmroute-Replica")
	headerRoute        = []byte("X-Warmroute-Route")
	strEventStream     = []byte("text/event-stream")
	reasonBytes        [len(ReasonNames)][]byte
	bodyHealthOK       = []byte(`{"status":"ok"}`)
	bodyHealthNoLive   = []byte(`{"status":"no live replica"}`)
	bodyHealthDrain    = []byte(`{"status":"draining"}`)
	replicaNone        = []byte("none")
	strRetryAfter      = []byte("Retry-After")
	retryAfterSeconds  [31][]byte
)

func init() {
	for i, n := range ReasonNames {
		reasonBytes[i] = []byte(n)
	}
	for i := range retryAfterSeconds {
		retryAfterSeconds[i] = strconv.AppendInt(nil, int64(i), 10)
	}
}

// dropBody gives a large body's bytes back to the budget once the request
// was sent (no resend can need it), and takes its buffer out of fasthttp's
// pool, so that the memory of a burst of large requests comes back to the
// heap, and then the system, without waiting for a pool to be flushed
// (bodyBudget.giveBack).
func (h *Handler) dropBody(ctx *fasthttp.RequestCtx, n int64) {
	// Done with, streamed or not: nothing reads a request's body once
	// it was sent (the access log has its own copy of the model).
	ctx.Request.SwapBody(nil)
	h.budget.release(n)
}

// health answers the main listener's GET /health without touching a replica.
func (h *Handler) health(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentTypeBytes(strApplicationJSON)
	status, body := h.healthStatus()
	ctx.SetStatusCode(status)
	ctx.SetBody(body)
}

// healthStatus is the answer of both /health endpoints: 503 while draining
// or with no live replica, else 200.
func (h *Handler) healthStatus() (int, []byte) {
	switch {
	case h.draining.Load():
		return fasthttp.StatusServiceUnavailable, bodyHealthDrain
	case h.set.LiveMask().Empty():
		return fasthttp.StatusServiceUnavailable, bodyHealthNoLive
	}
	return fasthttp.StatusOK, bodyHealthOK
}

// policy is the configured policy, or the default when the config names
// none.
func (h *Handler) policy() Policy {
	if h.cfg.Policy == nil {
		return Default
	}
	return h.cfg.Policy
}

// Pins returns the handler's pin map.
func (h *Handler) Pins() *prefixcache.PinMap { return h.pins }
