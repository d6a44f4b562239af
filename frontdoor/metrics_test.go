package frontdoor

import (
	"slices"
	"testing"
)

// Every known label value of the front door's labelled counters is
// exported at 0 before anything happened, so alerts on increase() have a
// series from the start.
func TestLabelledCountersStartAtZero(t *testing.T) {
	rig := newDoorRig(t, nil)
	families, err := rig.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"pinboard_placement_resolutions_total": {"placed", "forwarded", "local", "quarantined", "no-backends", "starting", "error"},
		"pinboard_forward_failures_total":      {"unreachable", "unknown", "refused", "misdirected", "canceled", "too-large"},
		"pinboard_relayed_streams_ended_total": {"complete", "client-gone", "upstream-failed", "shutdown", "refused"},
		"pinned_attestation_failures_total":    {"missing", "malformed", "forged", "expired", "replayed", "no-key"},
	}
	seen := map[string]bool{}
	for _, fam := range families {
		values, ok := want[fam.GetName()]
		if !ok {
			continue
		}
		seen[fam.GetName()] = true
		var got []string
		for _, m := range fam.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s %v = %v at start", fam.GetName(), m.GetLabel(), v)
			}
			got = append(got, m.GetLabel()[0].GetValue())
		}
		slices.Sort(got)
		values = slices.Sorted(slices.Values(values))
		if !slices.Equal(got, values) {
			t.Errorf("%s label values %v, want %v", fam.GetName(), got, values)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s not exported at start", name)
		}
	}
}
