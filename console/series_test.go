package console

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The node's own collectors, as supervisor and frontdoor name them.
type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.HistogramVec
	activations prometheus.Counter
	resolutions *prometheus.CounterVec
	failures    *prometheus.CounterVec
	conns       prometheus.Gauge
}

func newMetrics(t *testing.T) metrics {
	t.Helper()
	m := metrics{
		reg:         prometheus.NewRegistry(),
		requests:    prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricRequests}, []string{"namespace", "code"}),
		activations: prometheus.NewCounter(prometheus.CounterOpts{Name: metricActivations}),
		resolutions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricResolutions}, []string{"outcome"}),
		failures:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricForwardFailures}, []string{"outcome"}),
		conns:       prometheus.NewGauge(prometheus.GaugeOpts{Name: metricConnections}),
	}
	m.reg.MustRegister(m.requests, m.activations, m.resolutions, m.failures, m.conns)
	return m
}

func TestSeriesCountsEachInterval(t *testing.T) {
	m := newMetrics(t)
	s := NewSeries(m.reg, time.Second, 3, nil)
	t0 := time.UnixMilli(1_000_000)
	if got := s.Snapshot(); got.End != 0 || len(got.Requests) != 0 {
		t.Fatalf("before any reading: %+v", got)
	}
	m.requests.WithLabelValues("/counters", "200").Observe(0.01) // before the baseline: not charted
	s.Sample(t0)
	for range 5 {
		m.requests.WithLabelValues("/counters", "200").Observe(0.01)
	}
	m.requests.WithLabelValues("/threads", "503").Observe(0.01)
	m.activations.Add(2)
	m.resolutions.WithLabelValues("placed").Add(3)
	m.resolutions.WithLabelValues("forwarded").Add(7)
	m.failures.WithLabelValues("unreachable").Inc()
	m.failures.WithLabelValues("unknown").Inc()
	m.conns.Set(4)
	s.Sample(t0.Add(time.Second))
	got := s.Snapshot()
	if got.End != t0.Add(time.Second).UnixMilli() || got.IntervalMs != 1000 {
		t.Fatalf("end %d interval %d", got.End, got.IntervalMs)
	}
	want := [4][]int64{{6}, {2}, {3}, {2}}
	for i, col := range [][]int64{got.Requests, got.Activations, got.Placements, got.ForwardFailures} {
		if len(col) != 1 || col[0] != want[i][0] {
			t.Errorf("column %d: %v, want %v", i, col, want[i])
		}
	}
	if got.Resolutions["placed"] != 3 || got.Resolutions["forwarded"] != 7 || got.Connections != 4 {
		t.Errorf("totals: %v, connections %v", got.Resolutions, got.Connections)
	}

	// Quiet intervals are zeros, and only the last keep are kept.
	for i := 2; i <= 5; i++ {
		s.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	got = s.Snapshot()
	if len(got.Requests) != 3 || got.Requests[0] != 0 || got.Requests[2] != 0 {
		t.Errorf("after quiet intervals: %v, want three zeros", got.Requests)
	}
	m.activations.Inc()
	s.Sample(t0.Add(6 * time.Second))
	if got := s.Snapshot().Activations; len(got) != 3 || got[2] != 1 {
		t.Errorf("activations %v, want the newest point 1", got)
	}
}

// A reading that fails draws nothing (a partial one would show a false
// dip), and the next good one counts from the last good reading.
func TestSeriesSkipsAFailedReading(t *testing.T) {
	m := newMetrics(t)
	fail := false
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		if fail {
			return nil, errors.New("a collector failed")
		}
		return m.reg.Gather()
	})
	s := NewSeries(g, time.Second, 10, slog.New(slog.DiscardHandler))
	t0 := time.UnixMilli(1_000_000)
	s.Sample(t0)
	m.activations.Add(3)
	fail = true
	s.Sample(t0.Add(time.Second))
	if got := s.Snapshot(); len(got.Activations) != 0 || got.End != t0.UnixMilli() {
		t.Fatalf("after a failed reading: %+v", got)
	}
	fail = false
	s.Sample(t0.Add(2 * time.Second))
	if got := s.Snapshot().Activations; len(got) != 1 || got[0] != 3 {
		t.Fatalf("activations %v, want [3]", got)
	}
}
