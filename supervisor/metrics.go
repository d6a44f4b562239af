package supervisor

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// metrics are the worker-side pinned_* collectors this package maintains.
type metrics struct {
	activations *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	restarts    *prometheus.CounterVec
	unanswered  *prometheus.CounterVec
	instances   *prometheus.GaugeVec
	pluginUp    *prometheus.GaugeVec
	requests    *prometheus.HistogramVec
	// observers caches requests' children by namespace and status: the
	// label lookup (hashing, an Itoa) is per request otherwise.
	observers sync.Map // requestLabels -> prometheus.Observer
}

type requestLabels struct {
	ns   string
	code int
}

// observe records one served request.
func (m *metrics) observe(ns string, code int, d time.Duration) {
	k := requestLabels{ns, code}
	o, ok := m.observers.Load(k)
	if !ok {
		o, _ = m.observers.LoadOrStore(k, m.requests.WithLabelValues(ns, strconv.Itoa(code)))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		activations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pinned_activations_total", Help: "Instances activated on this node.",
		}, []string{"namespace"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pinned_evictions_total", Help: "Instances evicted on this node, by reason.",
		}, []string{"namespace", "reason"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pinned_plugin_restarts_total", Help: "Plugin processes restarted after they exited unexpectedly.",
		}, []string{"plugin"}),
		unanswered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pinned_plugin_unanswered_total", Help: "Instance requests their plugin did not answer, by outcome: unreachable (nothing reached it: 503, it did not run), unknown (sent, then cut: 504, it may have run) or too-large (a chunked body ran over the front door's cap on its way: 413).",
		}, []string{"plugin", "outcome"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pinned_instances", Help: "Instances live on this node.",
		}, []string{"namespace"}),
		pluginUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pinned_plugin_up", Help: "1 while the plugin process is serving.",
		}, []string{"plugin"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pinned_request_duration_seconds",
			Help:    "Instance requests served on this node, from arrival to the end of the response.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60},
		}, []string{"namespace", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.activations, m.evictions, m.restarts, m.unanswered, m.instances, m.pluginUp, m.requests)
	}
	return m
}

// unansweredOutcomes are pinned_plugin_unanswered_total's outcomes, each
// exported at 0 for every plugin from the start.
var unansweredOutcomes = []string{httpx.OutcomeUnreachable, httpx.OutcomeUnknown, httpx.OutcomeTooLarge}

// plugin exports every labelled series of a configured plugin at 0 from
// the start: an alert over a window (a restart's increase) needs the 0
// before the first event.
func (m *metrics) plugin(name string) {
	m.restarts.WithLabelValues(name)
	m.pluginUp.WithLabelValues(name)
	for _, o := range unansweredOutcomes {
		m.unanswered.WithLabelValues(name, o)
	}
}
