package frontdoor

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// status is this node's worker as GET /_pinned/status shows it.
func (rig *doorRig) status(t *testing.T) pinboard.WorkerStatus {
	t.Helper()
	code, body, _ := rig.call(t, "GET", "/_pinned/status", "op-token", "")
	var out struct{ Worker pinboard.WorkerStatus }
	if err := json.Unmarshal([]byte(body), &out); code != http.StatusOK || err != nil {
		t.Fatalf("status: %d %s", code, body)
	}
	return out.Worker
}

// listed is clientID as GET /registry/workers shows it.
func (rig *doorRig) listed(t *testing.T, clientID string) pinboard.WorkerView {
	t.Helper()
	code, body, _ := rig.call(t, "GET", "/registry/workers", "op-token", "")
	var out struct{ Workers []pinboard.WorkerView }
	if err := json.Unmarshal([]byte(body), &out); code != http.StatusOK || err != nil {
		t.Fatalf("workers: %d %s", code, body)
	}
	for _, v := range out.Workers {
		if v.ClientID == clientID {
			return v
		}
	}
	t.Fatalf("%s not listed: %s", clientID, body)
	return pinboard.WorkerView{}
}

// gauge is pinned_draining{source}.
func (rig *doorRig) draining(t *testing.T, source string) float64 {
	t.Helper()
	fams, err := rig.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "pinned_draining" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == source {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("pinned_draining{source=%q} not exported", source)
	return -1
}

// A local drain (`pinnedd drain --deadline 30s`) shows in status, in
// /registry/workers, in the log, in pinned_draining, and in the 503 a new
// activation gets; an operator drain likewise, under its own source.
func TestLocalDrainIsVisible(t *testing.T) {
	rig, w := hostRig(t)
	if st := rig.status(t); st.Draining || rig.draining(t, "local") != 0 {
		t.Fatalf("draining before any drain: %+v", st)
	}
	before := time.Now()
	if code, body, _ := rig.call(t, "POST", "/_pinned/drain", "op-token", `{"deadline":30}`); code != http.StatusOK {
		t.Fatalf("drain: %d %s", code, body)
	}
	st := rig.status(t)
	if !st.Draining || !slices.Equal(st.DrainSources, []string{"local"}) || st.DrainDeadline < before.Add(29*time.Second).UnixMilli() {
		t.Errorf("status after a local drain: %+v", st)
	}
	if !strings.Contains(rig.logs.String(), `msg="drain started" source=local`) {
		t.Errorf("no drain log line:\n%s", rig.logs)
	}
	if g := rig.draining(t, "local"); g != 1 {
		t.Errorf("pinned_draining{source=local} = %v", g)
	}
	w.HeartbeatNow(t.Context()) // a failed one leaves the listing below stale
	if v := rig.listed(t, w.ClientID()); !v.Draining || !slices.Equal(v.DrainSources, []string{"local"}) {
		t.Errorf("/registry/workers after a local drain: %+v", v)
	}
	code, body, _ := rig.call(t, "GET", "/misc/fresh/value", "", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(testutil.ErrorOf(t, body), "this node is draining") {
		t.Errorf("new activation while draining: %d %s", code, body)
	}

	if code, body, _ := rig.call(t, "POST", "/_pinned/undrain", "op-token", ""); code != http.StatusOK {
		t.Fatalf("undrain: %d %s", code, body)
	}
	if st := rig.status(t); st.Draining || rig.draining(t, "local") != 0 {
		t.Errorf("status after undrain: %+v", st)
	}
	if !strings.Contains(rig.logs.String(), `msg="drain ended" source=local`) {
		t.Errorf("no drain end log line:\n%s", rig.logs)
	}

	// The operator's cordon, riding the heartbeat ack.
	if code, body, _ := rig.call(t, "POST", "/registry/drain", "op-token", `{"clientId":"`+w.ClientID()+`","deadline":null}`); code != http.StatusOK {
		t.Fatalf("operator drain: %d %s", code, body)
	}
	w.HeartbeatNow(t.Context()) // a failed one leaves the listing below stale
	if st := rig.status(t); !st.Draining || !st.Cordoned || !slices.Equal(st.DrainSources, []string{"operator"}) {
		t.Errorf("status after an operator cordon: %+v", st)
	}
	if v := rig.listed(t, w.ClientID()); !v.Draining || !v.Cordoned || !slices.Equal(v.DrainSources, []string{"operator"}) {
		t.Errorf("/registry/workers after an operator cordon: %+v", v)
	}
	if g := rig.draining(t, "operator"); g != 1 {
		t.Errorf("pinned_draining{source=operator} = %v", g)
	}
	if !strings.Contains(rig.logs.String(), `msg="drain started" source=operator`) {
		t.Errorf("no operator drain log line:\n%s", rig.logs)
	}
	if code, body, _ := rig.call(t, "POST", "/registry/undrain", "op-token", `{"clientId":"`+w.ClientID()+`"}`); code != http.StatusOK {
		t.Fatalf("operator undrain: %d %s", code, body)
	}
	w.HeartbeatNow(t.Context()) // a failed one leaves the listing below stale
	if st := rig.status(t); st.Draining {
		t.Errorf("status after operator undrain: %+v", st)
	}
	if !strings.Contains(rig.logs.String(), `msg="drain ended" source=operator`) {
		t.Errorf("no operator drain end log line:\n%s", rig.logs)
	}
}
