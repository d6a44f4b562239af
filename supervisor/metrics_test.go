package supervisor

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every configured plugin has its pinned_plugin_restarts_total and pinned_plugin_up series
// from the start, at 0: increase(pinned_plugin_restarts_total[10m]) sees the first restart,
// and a plugin that never came up is a 0, not a missing series.
func TestPluginSeriesExistFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := New(Config{Registerer: reg, Specs: []Spec{
		{Name: "chat", Path: "/opt/pinned/chat", Namespaces: []string{"/threads"}},
		{Name: "counter", Path: "/opt/pinned/counter", Namespaces: []string{"/counters"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "plugin" {
					continue
				}
				if got[f.GetName()] == nil {
					got[f.GetName()] = map[string]float64{}
				}
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				got[f.GetName()][l.GetValue()] = v
			}
		}
	}
	for _, name := range []string{"pinned_plugin_restarts_total", "pinned_plugin_up"} {
		for _, plugin := range []string{"chat", "counter"} {
			if v, ok := got[name][plugin]; !ok || v != 0 {
				t.Errorf("%s{plugin=%q}: %v (exported: %v), want 0", name, plugin, v, ok)
			}
		}
	}
}
