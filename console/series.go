package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics a sample reads, each summed over its labels. They are the
// node's own collectors (README "Metrics"), so the charts count exactly
// what /metrics exports.
const (
	metricRequests        = "pinned_request_duration_seconds" // a histogram: its sample count
	metricActivations     = "pinned_activations_total"
	metricResolutions     = "pinboard_placement_resolutions_total"
	metricForwardFailures = "pinboard_forward_failures_total"
	metricConnections     = "pinboard_connections"
)

// Default sampling: one point every 5 s for the last 10 minutes.
const (
	DefaultInterval = 5 * time.Second
	DefaultKeep     = 120
)

// Series keeps the last Keep intervals of this node's counts in memory:
// how many requests its plugins served, instances it activated, ids its
// front door placed, and forwards that failed, in each interval. Nothing
// is stored on disk: a restarted node starts an empty history.
type Series struct {
	gather   prometheus.Gatherer
	interval time.Duration
	keep     int
	log      *slog.Logger

	mu      sync.Mutex
	failing bool       // the last reading failed (logged once, until one works)
	end     time.Time  // when the newest point was taken
	pts     [][4]int64 // oldest first: requests, activations, placements, forward failures
	last    totals     // the counters at end
	have    bool       // last holds a reading
}

// totals is one reading of the counters.
type totals struct {
	counts      [4]float64
	resolutions map[string]float64 // by outcome
	connections float64
}

// NewSeries samples gather every interval (DefaultInterval when 0),
// keeping keep points (DefaultKeep when 0).
func NewSeries(gather prometheus.Gatherer, interval time.Duration, keep int, log *slog.Logger) *Series {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if keep <= 0 {
		keep = DefaultKeep
	}
	if log == nil {
		log = slog.Default()
	}
	return &Series{gather: gather, interval: interval, keep: keep, log: log}
}

// Run samples until ctx ends. The first reading only sets the baseline.
func (s *Series) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	s.Sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.Sample(now)
		}
	}
}

// Sample reads the counters at now and appends the interval since the
// previous reading. A counter that went down (it cannot, short of a
// restart of its collector) counts from zero rather than negative.
func (s *Series) Sample(now time.Time) {
	cur, err := s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// A gather error names a collector that failed; the rest is
		// still good, but a partial reading would draw a false dip.
		if !s.failing {
			s.log.Warn("console: reading the metrics for the charts failed; the charts pause until it works", "err", err)
		}
		s.failing = true
		return
	}
	if s.failing {
		s.log.Info("console: reading the metrics for the charts works again")
		s.failing = false
	}
	if s.have {
		var p [4]int64
		for i := range p {
			d := cur.counts[i] - s.last.counts[i]
			if d < 0 {
				d = cur.counts[i]
			}
			p[i] = int64(d + 0.5)
		}
		s.pts = append(s.pts, p)
		if len(s.pts) > s.keep {
			s.pts = s.pts[len(s.pts)-s.keep:]
		}
	}
	s.last, s.have, s.end = cur, true, now
}

func (s *Series) read() (totals, error) {
	mfs, err := s.gather.Gather()
	if err != nil {
		return totals{}, err
	}
	out := totals{resolutions: map[string]float64{}}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricRequests:
			for _, m := range mf.GetMetric() {
				out.counts[0] += float64(m.GetHistogram().GetSampleCount())
			}
		case metricActivations:
			out.counts[1] += sumCounters(mf)
		case metricResolutions:
			for _, m := range mf.GetMetric() {
				v := m.GetCounter().GetValue()
				out.resolutions[label(m, "outcome")] += v
				if label(m, "outcome") == "placed" {
					out.counts[2] += v
				}
			}
		case metricForwardFailures:
			out.counts[3] += sumCounters(mf)
		case metricConnections:
			for _, m := range mf.GetMetric() {
				out.connections += m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

func sumCounters(mf *dto.MetricFamily) (sum float64) {
	for _, m := range mf.GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Snapshot is the history as the console reads it: one column per count,
// oldest first, each point the count of one interval ending at
// End - (len-1-i)*IntervalMs. Columns keep the JSON small: it rides in
// every GET /registry/stats (about 1.5 KiB a node when full).
type Snapshot struct {
	IntervalMs      int64              `json:"intervalMs"`
	End             int64              `json:"end"` // Unix ms of the newest point; 0: none yet
	Requests        []int64            `json:"requests"`
	Activations     []int64            `json:"activations"`
	Placements      []int64            `json:"placements"`
	ForwardFailures []int64            `json:"forwardFailures"`
	Resolutions     map[string]float64 `json:"resolutions"` // front-door resolutions so far, by outcome
	Connections     float64            `json:"connections"` // client connections open at End
}

// Snapshot copies the history.
func (s *Series) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Snapshot{
		IntervalMs: s.interval.Milliseconds(), Resolutions: map[string]float64{},
		Requests: make([]int64, len(s.pts)), Activations: make([]int64, len(s.pts)),
		Placements: make([]int64, len(s.pts)), ForwardFailures: make([]int64, len(s.pts)),
	}
	if s.have {
		out.End = s.end.UnixMilli()
		out.Connections = s.last.connections
		for k, v := range s.last.resolutions {
			out.Resolutions[k] = v
		}
	}
	for i, p := range s.pts {
		out.Requests[i], out.Activations[i], out.Placements[i], out.ForwardFailures[i] = p[0], p[1], p[2], p[3]
	}
	return out
}
