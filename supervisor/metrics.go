package supervisor

import "github.com/prometheus/client_golang/prometheus"

// metrics are the worker-side pinned_* collectors this package maintains.
type metrics struct {
	activations *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	restarts    *prometheus.CounterVec
	instances   *prometheus.GaugeVec
	pluginUp    *prometheus.GaugeVec
	requests    *prometheus.HistogramVec
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
		reg.MustRegister(m.activations, m.evictions, m.restarts, m.instances, m.pluginUp, m.requests)
	}
	return m
}
