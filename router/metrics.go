package router

import (
	"bytes"
	"io"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// Status classes of the requests metric; client_gone is the 499 of a client
// that left before its answer was complete.
var classNames = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "499"}

const classClientGone = 5

func classOf(status int) int {
	c := status/100 - 1
	if c < 0 || c > 4 {
		return 4
	}
	return c
}

// Metrics holds every series of the proxy, created at startup so that the
// request path only increments: labels are indexes, never strings.
type Metrics struct {
	set  *metrics.Set
	pins *prefixcache.PinMap
	// store is the pin store's own series, nil without one (New sets it).
	store *pinstore.Store
	// held is what each replica is believed to hold (New sets it).
	held *prefixcache.Holdings

	// slots hold each replica's series by slot index + 1; slot 0 is
	// "none", the requests that no replica answered.
	slots     [upstream.MaxReplicas + 1]atomic.Pointer[series]
	failovers *metrics.Counter
	malformed *metrics.Counter
	// forgotten counts the held links that a replica's report of cached
	// tokens showed it had lost (held.go).
	forgotten *metrics.Counter
	ttfb      *metrics.PrometheusHistogram
	total     *metrics.PrometheusHistogram
	overhead  *metrics.PrometheusHistogram
	// under and over are the error of the policy's estimate of a
	// prompt's cached tokens, by its side (usage.go).
	under, over *metrics.PrometheusHistogram
}

// The histograms' buckets, in seconds, as Prometheus reads them (le).
var (
	// ttfbBuckets span a warm turn's first token (tens of milliseconds)
	// to a cold prefill of a long prompt behind a queue (minutes), about
	// two buckets a decade, up to the first-byte timeout's default.
	ttfbBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600}
	// totalBuckets add the length of a whole answer: a long stream lasts
	// many minutes.
	totalBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	// overheadBuckets span the proxy's own time: tens of microseconds for
	// a small request, about a millisecond to hash a 90k-token prompt.
	overheadBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1}
	// estimateBuckets, in tokens, span an exact estimate (0), a vLLM
	// block or a few (16, 64), and whole messages up to a lost 90k-token
	// context, two buckets to each factor of 16.
	estimateBuckets = []float64{0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144}
)

// NewMetrics creates the series for the replicas and the pin map: those of
// a replica when it joins the set, gone when it leaves.
func NewMetrics(set *upstream.Set, pins *prefixcache.PinMap) *Metrics {
	s := metrics.NewSet()
	m := &Metrics{set: s, pins: pins}
	m.slots[0].Store(m.newSeries("none", nil))
	set.Observe(upstream.Observer{
		Join:  func(r *upstream.Replica) { m.slots[r.Index+1].Store(m.newSeries(r.Name, r)) },
		Leave: func(r *upstream.Replica) { m.dropSeries(r.Index + 1) },
	})
	m.failovers = s.NewCounter(`warmroute_failovers_total`)
	m.malformed = s.NewCounter(`warmroute_requests_malformed_total`)
	m.forgotten = s.NewCounter(`warmroute_held_links_forgotten_total`)
	m.ttfb = s.NewPrometheusHistogramExt(`warmroute_upstream_first_byte_seconds`, ttfbBuckets)
	m.total = s.NewPrometheusHistogramExt(`warmroute_request_duration_seconds`, totalBuckets)
	m.overhead = s.NewPrometheusHistogramExt(`warmroute_proxy_overhead_seconds`, overheadBuckets)
	m.under = s.NewPrometheusHistogramExt(`warmroute_cached_tokens_estimate_error{side="under"}`, estimateBuckets)
	m.over = s.NewPrometheusHistogramExt(`warmroute_cached_tokens_estimate_error{side="over"}`, estimateBuckets)
	stat := func(f func(prefixcache.Stats) float64) func() float64 {
		return func() float64 { return f(pins.Stats()) }
	}
	s.NewGauge(`warmroute_prefix_hits_total`, stat(func(st prefixcache.Stats) float64 { return float64(st.Hits) }))
	s.NewGauge(`warmroute_prefix_misses_total`, stat(func(st prefixcache.Stats) float64 { return float64(st.Misses) }))
	s.NewGauge(`warmroute_prefix_evictions_total`, stat(func(st prefixcache.Stats) float64 { return float64(st.Evictions) }))
	s.NewGauge(`warmroute_prefix_collisions_total`, stat(func(st prefixcache.Stats) float64 { return float64(st.Collisions) }))
	s.NewGauge(`warmroute_prefix_size`, stat(func(st prefixcache.Stats) float64 { return float64(st.Size) }))
	s.NewGauge(`warmroute_prefix_capacity`, stat(func(st prefixcache.Stats) float64 { return float64(st.Capacity) }))
	return m
}

// series are one replica's counters, and the names of every series made
// for it, to unregister when it leaves.
type series struct {
	requests [len(ReasonNames) * len(classNames)]*metrics.Counter // [reason][class]
	sends    [len(upstream.ResultNames)]*metrics.Counter
	// prompt is the prompt tokens that the replica reported, by
	// [reason][cached, computed]; none for slot 0.
	prompt [len(ReasonNames) * 2]*metrics.Counter
	names  []string
}

// newSeries makes the series of the replica named name; r is nil for the
// requests that no replica answered.
func (m *Metrics) newSeries(name string, r *upstream.Replica) *series {
	s := m.set
	sr := &series{}
	counter := func(n string) *metrics.Counter {
		sr.names = append(sr.names, n)
		return s.GetOrCreateCounter(n)
	}
	for i, reason := range ReasonNames {
		for j, class := range classNames {
			sr.requests[i*len(classNames)+j] = counter(`warmroute_requests_total{replica="` + name + `",reason="` + reason + `",class="` + class + `"}`)
		}
	}
	if r == nil {
		return sr
	}
	for i, f := range upstream.ResultNames {
		sr.sends[i] = counter(`warmroute_upstream_sends_total{replica="` + name + `",result="` + f + `"}`)
	}
	for i, reason := range ReasonNames {
		for j, result := range [...]string{"cached", "computed"} {
			sr.prompt[i*2+j] = counter(`warmroute_prompt_tokens_total{replica="` + name + `",reason="` + reason + `",result="` + result + `"}`)
		}
	}
	label := `{replica="` + name + `"}`
	gauge := func(n string, f func() float64) {
		sr.names = append(sr.names, n+label)
		s.GetOrCreateGauge(n+label, f)
	}
	pins := m.pins
	gauge(`warmroute_upstream_in_flight`, func() float64 { return float64(r.InFlight()) })
	gauge(`warmroute_upstream_live`, func() float64 {
		if r.State() == upstream.Live {
			return 1
		}
		return 0
	})
	gauge(`warmroute_upstream_cooldown_seconds`, func() float64 { return r.Cooldown().Seconds() })
	gauge(`warmroute_upstream_demotions_total`, func() float64 { return float64(r.Demotions()) })
	gauge(`warmroute_prefix_pins`, func() float64 { return float64(pins.Pins(r.Index)) })
	gauge(`warmroute_held_prefix_bytes`, func() float64 {
		if m.held == nil {
			return 0
		}
		return float64(m.held.Held(r.Index))
	})
	gauge(`warmroute_upstream_kv_capacity_tokens`, func() float64 { return float64(r.KVTokens()) })
	return sr
}

// dropSeries unregisters the series of the replica in slot i-1.
func (m *Metrics) dropSeries(i int) {
	if sr := m.slots[i].Swap(nil); sr != nil {
		for _, n := range sr.names {
			m.set.UnregisterMetric(n)
		}
	}
}

// watchBudget exports the body budget's state.
func (m *Metrics) watchBudget(b *bodyBudget) {
	m.set.NewGauge(`warmroute_request_body_bytes_held`, func() float64 { return float64(b.used.Load()) })
	m.set.NewGauge(`warmroute_request_body_bytes_limit`, func() float64 { return float64(b.limit) })
	m.set.NewGauge(`warmroute_requests_over_body_budget_total`, func() float64 { return float64(b.over.Load()) })
}

// WritePrometheus writes every series in Prometheus text format, process
// metrics included, each family with its # HELP and # TYPE.
func (m *Metrics) WritePrometheus(w io.Writer) {
	var b bytes.Buffer
	m.set.WritePrometheus(&b)
	if m.store != nil {
		m.store.WritePrometheus(&b)
	}
	metrics.WriteProcessMetrics(&b)
	w.Write(annotate(b.Bytes()))
}

func init() {
	// VictoriaMetrics writes # HELP and # TYPE only when asked, and with
	// no help text: annotate adds it.
	metrics.ExposeMetadata(true)
}

// annotate fills in the help text of each # HELP line from help, and makes
// the type of a family named _total a counter (its value is read from an
// atomic elsewhere, through a gauge callback, but it only grows).
func annotate(text []byte) []byte {
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(text, []byte("\n")) {
		switch {
		case bytes.HasPrefix(line, []byte("# HELP ")):
			family := string(bytes.TrimSpace(line[len("# HELP "):]))
			h, ok := help[family]
			if !ok {
				h = "Go runtime or process metric (github.com/VictoriaMetrics/metrics)."
			}
			out.WriteString("# HELP " + family + " " + h + "\n")
		case bytes.HasPrefix(line, []byte("# TYPE ")) && bytes.HasSuffix(line, []byte("_total gauge\n")):
			out.Write(line[:len(line)-len("gauge\n")])
			out.WriteString("counter\n")
		default:
			out.Write(line)
		}
	}
	return out.Bytes()
}

// help is the # HELP text of each of warmroute's own families.
var help = map[string]string{
	"warmroute_requests_total":                    "Requests answered, by replica (none for a 503 of the proxy's), routing reason and status class (499: the client left).",
	"warmroute_upstream_sends_total":              "Sends to a replica by result: ok, not_sent, maybe_running, timeout, mid_stream, client_gone, rejected.",
	"warmroute_prompt_tokens_total":               "Prompt tokens of 2xx answers as the replica reported them (usage), by replica, routing reason and result: cached (prompt_tokens_details.cached_tokens, or Anthropic's cache_read_input_tokens) or computed (the rest, prefilled).",
	"warmroute_cached_tokens_estimate_error":      "Error of the routing policy's estimate of a prompt's cached tokens, in tokens, when it made one: side=under observes reported - predicted when the replica reported at least the prediction (le=0: exact), side=over observes predicted - reported when it reported less.",
	"warmroute_pin_store_reads_total":             "Pin store reads on a local miss, by result: hit, miss, error (a timeout included), skipped (the store is down).",
	"warmroute_pin_store_client_cache_hits_total": "Pin store reads answered by the client-side cache, without a round trip.",
	"warmroute_pin_store_timeouts_total":          "Pin store reads that took longer than -pin-store-timeout; the request went on without.",
	"warmroute_pin_store_writes_total":            "Pins written to the pin store.",
	"warmroute_pin_store_dropped_total":           "Pins not written: the store was down or its queue full.",
	"warmroute_pin_store_errors_total":            "Pin store operations that failed (connection errors, timeouts that took it down).",
	"warmroute_pin_store_up":                      "1 while the pin store is reachable, 0 while it is skipped.",
	"warmroute_pin_store_queued":                  "Pins waiting to be written to the pin store.",
	"warmroute_failovers_total":                   "Requests sent on to another replica because the one before could not take them.",
	"warmroute_requests_malformed_total":          "Chat requests whose JSON could not be read (forwarded anyway).",
	"warmroute_upstream_in_flight":                "Requests holding a connection to the replica.",
	"warmroute_upstream_live":                     "1 while the replica is live, 0 while it is demoted.",
	"warmroute_upstream_cooldown_seconds":         "The demoted replica's current cooldown before its next probe.",
	"warmroute_upstream_demotions_total":          "Times the replica was demoted.",
	"warmroute_prefix_pins":                       "Pin map entries pointing at the replica.",
	"warmroute_held_prefix_bytes":                 "Bytes of prompt rendering that the replica's KV cache is believed to hold: what it prefilled, bounded by four times its KV capacity and by -held-memory, corrected by the cached tokens it reports.",
	"warmroute_held_links_forgotten_total":        "Held prefix links dropped because a replica reported far fewer cached tokens than the routing policy predicted: its engine had evicted them.",
	"warmroute_upstream_kv_capacity_tokens":       "KV cache capacity that the replica's engine publishes, in tokens (vLLM cache_config_info, SGLang max_total_num_tokens, llama.cpp n_ctx x slots); 0 when it publishes none.",
	"warmroute_prefix_hits_total":                 "Pin map lookups that found a pin.",
	"warmroute_prefix_misses_total":               "Pin map lookups that found none.",
	"warmroute_prefix_evictions_total":            "Pins evicted, least recently used first.",
	"warmroute_prefix_collisions_total":           "Pin lookups whose hash matched and whose check did not.",
	"warmroute_prefix_size":                       "Entries in the pin map.",
	"warmroute_prefix_capacity":                   "Capacity of the pin map (-pin-capacity).",
	"warmroute_upstream_first_byte_seconds":       "Time from a request's arrival to the first byte of its replica's answer.",
	"warmroute_request_duration_seconds":          "Time from a request's arrival to the last byte of its answer.",
	"warmroute_proxy_overhead_seconds":            "Time from a request's arrival to its send to a replica: the proxy's own work.",
	"warmroute_request_body_bytes_held":           "Bytes of large request bodies held now, counted against -max-body-memory.",
	"warmroute_request_body_bytes_limit":          "The body budget, -max-body-memory.",
	"warmroute_requests_over_body_budget_total":   "Requests answered 503 because the body budget was spent.",
}

// request counts a request answered by replica (-1: none); a replica that
// left meanwhile is not counted.
func (m *Metrics) request(replica int, reason Reason, class int) {
	if sr := m.slots[replica+1].Load(); sr != nil {
		sr.requests[int(reason)*len(classNames)+class].Inc()
	}
}

// promptTokens counts the prompt tokens that replica reported, of which
// cached were cached, and the error of the policy's prediction (predicted
// tokens; -1 when it made none).
func (m *Metrics) promptTokens(replica int, reason Reason, prompt, cached, predicted int64) {
	if sr := m.slots[replica+1].Load(); sr != nil {
		sr.prompt[int(reason)*2].AddInt64(cached)
		sr.prompt[int(reason)*2+1].AddInt64(prompt - cached)
	}
	switch d := cached - predicted; {
	case predicted < 0:
	case d >= 0:
		m.under.Update(float64(d))
	default:
		m.over.Update(float64(-d))
	}
}

// replicaTokens returns the prompt tokens that replica reported, and how
// many of them were cached, over every reason.
func (m *Metrics) replicaTokens(replica int) (prompt, cached uint64) {
	sr := m.slots[replica+1].Load()
	if sr == nil {
		return 0, 0
	}
	for i := 0; i < len(sr.prompt); i += 2 {
		c := sr.prompt[i].Get()
		cached += c
		prompt += c + sr.prompt[i+1].Get()
	}
	return prompt, cached
}

func (m *Metrics) send(replica int, res upstream.Result) {
	if sr := m.slots[replica+1].Load(); sr != nil {
		sr.sends[res].Inc()
	}
}
