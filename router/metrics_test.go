package router

import (
	"bytes"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warmroute/warmroute/upstream"
)

// /metrics parses with the Prometheus project's own parser, at startup,
// before any request: every family of warmroute's is there, with its type,
// a help text, a unit in its name where it has one, and le buckets for
// the histograms.
func TestMetricsReadAsPrometheusDoes(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.BodyBudget = 1 << 30
	})
	var b bytes.Buffer
	p.h.m.WritePrometheus(&b)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(&b)
	if err != nil {
		t.Fatalf("the Prometheus parser rejects /metrics: %v", err)
	}
	for name, f := range families {
		if f.GetHelp() == "" {
			t.Errorf("%s has no help text", name)
		}
		if strings.HasPrefix(name, "warmroute_") && strings.HasSuffix(name, "_total") != (f.GetType() == dto.MetricType_COUNTER) {
			t.Errorf("%s is a %v: counters, and only counters, end in _total", name, f.GetType())
		}
		if strings.HasPrefix(name, "warmroute_") && help[name] == "" {
			t.Errorf("%s has no entry in the help table", name)
		}
	}
	for name := range help {
		f, ok := families[name]
		if !ok && strings.HasPrefix(name, "warmroute_pin_store_") {
			continue // only with -pin-store (TestInstancesAgree reads them)
		}
		if !ok {
			t.Errorf("%s is not exposed at startup", name)
			continue
		}
		switch {
		case strings.HasSuffix(name, "_seconds") && f.GetType() == dto.MetricType_HISTOGRAM:
			h := f.GetMetric()[0].GetHistogram()
			if len(h.GetBucket()) < 8 || h.GetBucket()[0].GetUpperBound() <= 0 {
				t.Errorf("%s has %d le buckets", name, len(h.GetBucket()))
			}
		case strings.Contains(name, "_seconds") || strings.Contains(name, "_bytes"):
			if f.GetType() == dto.MetricType_HISTOGRAM {
				t.Errorf("%s: a histogram's name ends in its unit", name)
			}
		case strings.HasSuffix(name, "_duration") || strings.HasSuffix(name, "_time"):
			t.Errorf("%s has no unit in its name", name)
		}
	}
	for _, name := range []string{"warmroute_upstream_first_byte_seconds", "warmroute_request_duration_seconds", "warmroute_proxy_overhead_seconds"} {
		if f := families[name]; f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s is not a histogram", name)
		}
	}
}
