package metrics_test

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// A histogram shows a value only if a finite bucket holds it, and shows it
// usefully only if neighbouring bounds are close enough for quantiles to
// mean something. Each histogram must cover what it measures.
func TestHistogramsCoverWhatTheyMeasure(t *testing.T) {
	for _, tc := range []struct {
		name string
		of   func(*metrics.Metrics) prometheus.Observer
		// values the system produces and an operator must be able to tell apart
		values map[string]time.Duration
	}{
		{"klaxon_delivery_latency_seconds", func(m *metrics.Metrics) prometheus.Observer { return m.DeliveryLatency.WithLabelValues("webhook") },
			map[string]time.Duration{
				"a webhook on the same network":                 20 * time.Millisecond,
				"one timed-out send (30 s) and its retry":       31 * time.Second,
				"twelve attempts of exponential backoff":        17 * time.Minute,
				"Hawk's default minPeriod digest":               time.Minute,
				"an hourly digest":                              time.Hour,
				"the longest minPeriod digest (rules' maximum)": rules.MaxWindowPeriod,
			}},
		{"klaxon_event_lag_seconds", func(m *metrics.Metrics) prometheus.Observer { return m.EventLag },
			map[string]time.Duration{
				"a consumer keeping up":                 50 * time.Millisecond,
				"a backlog replayed after a 2 h outage": 2 * time.Hour,
				"a backlog replayed after a day down":   24 * time.Hour,
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := metrics.New(reg)
			tc.of(m).Observe(0)
			bounds := bucketBounds(t, reg, tc.name)
			for what, d := range tc.values {
				if s := d.Seconds(); s > bounds[len(bounds)-1] {
					t.Errorf("%s (%s) is above the last bucket (%g s): only +Inf holds it", what, d, bounds[len(bounds)-1])
				}
			}
			for i := 1; i < len(bounds); i++ {
				if r := bounds[i] / bounds[i-1]; r > 4 {
					t.Errorf("buckets %g and %g are %.1f× apart: quantiles between them are guesses", bounds[i-1], bounds[i], r)
				}
			}
		})
	}
}

func bucketBounds(t *testing.T, reg *prometheus.Registry, name string) []float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		h := mf.GetMetric()[0].GetHistogram()
		if mf.GetName() != name || h == nil {
			continue
		}
		var bounds []float64
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				bounds = append(bounds, b.GetUpperBound())
			}
		}
		return bounds
	}
	t.Fatalf("no histogram %s", name)
	return nil
}
