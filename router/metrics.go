package router

import (
	"io"
	"time"

	"github.com/VictoriaMetrics/metrics"

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
	set *metrics.Set

	replicas  int
	requests  []*metrics.Counter // [replica+1][reason][class]; replica -1 is "none"
	sends     []*metrics.Counter // [replica][result]
	failovers *metrics.Counter
	malformed *metrics.Counter
	ttfb      *metrics.Histogram
	total     *metrics.Histogram
	overhead  *metrics.Histogram
}

// NewMetrics creates the series for the replicas and the pin map.
func NewMetrics(set *upstream.Set, pins *prefixcache.PinMap) *Metrics {
	s := metrics.NewSet()
	m := &Metrics{set: s, replicas: len(set.Replicas)}
	names := append([]string{"none"}, make([]string, len(set.Replicas))...)
	for i, r := range set.Replicas {
		names[i+1] = r.Name
	}
	for _, rn := range names {
		for _, reason := range ReasonNames {
			for _, class := range classNames {
				m.requests = append(m.requests, s.NewCounter(`warmroute_requests_total{replica="`+rn+`",reason="`+reason+`",class="`+class+`"}`))
			}
		}
	}
	for _, r := range set.Replicas {
		r := r
		label := `{replica="` + r.Name + `"}`
		for _, f := range upstream.ResultNames {
			m.sends = append(m.sends, s.NewCounter(`warmroute_upstream_sends_total{replica="`+r.Name+`",result="`+f+`"}`))
		}
		s.NewGauge(`warmroute_upstream_in_flight`+label, func() float64 { return float64(r.InFlight()) })
		s.NewGauge(`warmroute_upstream_live`+label, func() float64 {
			if r.State() == upstream.Live {
				return 1
			}
			return 0
		})
		s.NewGauge(`warmroute_upstream_cooldown_seconds`+label, func() float64 { return r.Cooldown().Seconds() })
		s.NewGauge(`warmroute_upstream_demotions_total`+label, func() float64 { return float64(r.Demotions()) })
		s.NewGauge(`warmroute_prefix_pins`+label, func() float64 { return float64(pins.Pins(r.Index)) })
	}
	m.failovers = s.NewCounter(`warmroute_failovers_total`)
	m.malformed = s.NewCounter(`warmroute_requests_malformed_total`)
	m.ttfb = s.NewHistogram(`warmroute_upstream_first_byte_seconds`)
	m.total = s.NewHistogram(`warmroute_request_duration_seconds`)
	m.overhead = s.NewHistogram(`warmroute_proxy_overhead_seconds`)
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

// watchBudget exports the body budget's state.
func (m *Metrics) watchBudget(b *bodyBudget) {
	m.set.NewGauge(`warmroute_request_body_bytes_held`, func() float64 { return float64(b.used.Load()) })
	m.set.NewGauge(`warmroute_request_body_bytes_limit`, func() float64 { return float64(b.limit) })
	m.set.NewGauge(`warmroute_requests_over_body_budget_total`, func() float64 { return float64(b.over.Load()) })
}

// WritePrometheus writes every series in Prometheus text format, process
// metrics included.
func (m *Metrics) WritePrometheus(w io.Writer) {
	m.set.WritePrometheus(w)
	metrics.WriteProcessMetrics(w)
}

func (m *Metrics) request(replica int, reason Reason, class int) {
	m.requests[((replica+1)*len(ReasonNames)+int(reason))*len(classNames)+class].Inc()
}

func (m *Metrics) send(replica int, res upstream.Result) {
	m.sends[replica*len(upstream.ResultNames)+int(res)].Inc()
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }
