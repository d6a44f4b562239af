package frontdoor

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// Once an owner's lease lapsed, GET /registry/workers
// lists the surviving worker only; ?all=1 shows the lapsed one too.
func TestRegistryWorkersListsLiveByDefault(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "alive", "n1", time.Hour, "/counters")
	rig.register(t, "lapsed", "n2", -time.Minute, "/counters")
	list := func(query string) []string {
		t.Helper()
		code, body, _ := rig.call(t, "GET", "/registry/workers"+query, "op-token", "")
		if code != http.StatusOK {
			t.Fatalf("workers%s: %d %s", query, code, body)
		}
		var out struct{ Workers []pinboard.WorkerView }
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range out.Workers {
			ids = append(ids, w.ClientID)
		}
		return ids
	}
	if got := list(""); len(got) != 1 || got[0] != "alive" {
		t.Errorf("workers = %v, want only the live one", got)
	}
	if got := list("?all=1"); len(got) != 2 {
		t.Errorf("workers?all=1 = %v, want both", got)
	}
	if code, body, _ := rig.call(t, "GET", "/registry/workers?all=yes", "op-token", ""); code != http.StatusBadRequest || !strings.Contains(testutil.ErrorOf(t, body), "all must be 1 or 0") {
		t.Errorf("workers?all=yes: %d %s", code, body)
	}
}

// Drains and undrains name the client id the directory does not know
// with a 404 that says how to find the right one, and change nothing.
func TestOperatorDrainUnknownClient(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "known", "n1", time.Hour, "/counters")
	for _, c := range []struct{ path, body string }{
		{"/registry/drain", `{"clientId":"nosuch","deadline":null}`},
		{"/registry/undrain", `{"clientId":"nosuch"}`},
	} {
		code, body, _ := rig.call(t, "POST", c.path, "op-token", c.body)
		if code != http.StatusNotFound || !strings.Contains(testutil.ErrorOf(t, body), `unknown client id "nosuch"`) {
			t.Errorf("%s: %d %s, want 404 unknown client id", c.path, code, body)
		}
	}
	if ds := rig.m.Drains(); len(ds) != 0 {
		t.Errorf("drains after refused requests: %+v", ds)
	}
	if code, body, _ := rig.call(t, "POST", "/registry/drain", "op-token", `{"clientId":"known","deadline":null}`); code != http.StatusOK {
		t.Errorf("drain of a known worker: %d %s", code, body)
	}
}

// An operator drain by node id holds for the worker the node registers
// after a restart (a new client id); undraining the node lifts it. Bad
// targets are a 4xx that changes nothing.
func TestOperatorDrainByNodeID(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "w1", "n1", time.Hour, "/counters")
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/registry/drain", `{"deadline":null}`, 400, "nodeId (or clientId, for one worker process) is required"},
		{"/registry/drain", `{"nodeId":"n1","clientId":"w1","deadline":null}`, 400, "give nodeId or clientId, not both"},
		{"/registry/undrain", `{}`, 400, "nodeId (or clientId, for one worker process) is required"},
		{"/registry/drain", `{"nodeId":"n9","deadline":null}`, 404, `unknown node id "n9"`},
		{"/registry/undrain", `{"nodeId":"n9"}`, 404, `unknown node id "n9"`},
		{"/registry/drain", `{"clientId":"n1","deadline":null}`, 404, "that is a node id; drain the node with `pinnedd drain n1`"},
	} {
		code, body, _ := rig.call(t, "POST", c.path, "op-token", c.body)
		if code != c.code || !strings.Contains(testutil.ErrorOf(t, body), c.want) {
			t.Errorf("%s %s: %d %s, want %d %q", c.path, c.body, code, body, c.code, c.want)
		}
	}
	if ds := rig.m.Drains(); len(ds) != 0 {
		t.Fatalf("drains after refused requests: %+v", ds)
	}

	code, body, _ := rig.call(t, "POST", "/registry/drain", "op-token", `{"nodeId":"n1","deadline":null}`)
	if code != http.StatusOK || strings.TrimSpace(body) != `{"deadline":null,"nodeId":"n1","ok":true}` {
		t.Fatalf("cordon n1: %d %s", code, body)
	}
	// n1 restarts: its old worker deregisters, a new process registers.
	if res, err := rig.dir.Do(t.Context(), directory.Deregister{ClientID: "w1", SessionID: "s-w1"}); err != nil || res.Code != directory.CodeOK {
		t.Fatalf("deregister w1: %v %v", res.Code, err)
	}
	rig.register(t, "w1-restarted", "n1", time.Hour, "/counters")
	workers := func() map[string]pinboard.WorkerView {
		t.Helper()
		_, body, _ := rig.call(t, "GET", "/registry/workers", "op-token", "")
		var out struct{ Workers []pinboard.WorkerView }
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		m := map[string]pinboard.WorkerView{}
		for _, w := range out.Workers {
			m[w.ClientID] = w
		}
		return m
	}
	if w := workers()["w1-restarted"]; !w.Draining || !w.Cordoned || strings.Join(w.DrainSources, ",") != pinboard.DrainSourceOperator {
		t.Fatalf("the restarted node's worker is not cordoned: %+v", w)
	}
	if code, body, _ := rig.call(t, "GET", "/counters/x/value", "", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Fatalf("a new id with the only node cordoned: %d %s", code, body)
	}
	code, body, _ = rig.call(t, "POST", "/registry/undrain", "op-token", `{"nodeId":"n1"}`)
	if code != http.StatusOK || strings.TrimSpace(body) != `{"nodeId":"n1","ok":true}` {
		t.Fatalf("undrain n1: %d %s", code, body)
	}
	if w := workers()["w1-restarted"]; w.Draining {
		t.Fatalf("still draining after undrain: %+v", w)
	}
}

// A wind-down of a namespace nobody serves, or of an id with no
// placement, is a 404 that names it, not "0 instances".
func TestWindDownUnknownTargets(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "w1", "n1", time.Hour, "/counters")
	for _, c := range []struct {
		body, want string
	}{
		{`{"namespace":"/nope","deadline":0}`, "unknown namespace /nope"},
		{`{"namespace":"/nope","id":"x","deadline":0}`, "unknown namespace /nope"},
		{`{"namespace":"/counters","id":"x","deadline":0}`, "no placement for /counters/x"},
	} {
		code, body, _ := rig.call(t, "POST", "/registry/wind_down", "op-token", c.body)
		if code != http.StatusNotFound || testutil.ErrorOf(t, body) != c.want {
			t.Errorf("wind_down %s: %d %s, want 404 %q", c.body, code, body, c.want)
		}
	}
}

// An empty id (`pinnedd wind-down /counters "$ID"` with ID unset) is a
// 400, not a wind-down of the whole namespace; an absent id still means
// the namespace.
func TestWindDownEmptyIDRefused(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "w1", "n1", time.Hour, "/counters")
	code, body, _ := rig.call(t, "POST", "/registry/wind_down", "op-token", `{"namespace":"/counters","id":"","deadline":0}`)
	if code != http.StatusBadRequest || !strings.Contains(testutil.ErrorOf(t, body), "id is empty") {
		t.Errorf("wind_down with an empty id: %d %s, want 400 id is empty", code, body)
	}
	if code, body, _ := rig.call(t, "POST", "/registry/wind_down", "op-token", `{"namespace":"/counters","deadline":0}`); code != http.StatusOK {
		t.Errorf("wind_down of the namespace: %d %s", code, body)
	}
}

// When every live worker of a namespace is draining, a new id's 503 says
// so rather than that there are no workers.
func TestNoBackendsSaysDraining(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.register(t, "w1", "n1", time.Hour, "/counters")
	rig.register(t, "w2", "n2", time.Hour, "/counters")
	for _, id := range []string{"w1", "w2"} {
		if code, body, _ := rig.call(t, "POST", "/registry/drain", "op-token", `{"clientId":"`+id+`","deadline":null}`); code != http.StatusOK {
			t.Fatalf("drain %s: %d %s", id, code, body)
		}
	}
	code, body, resp := rig.call(t, "GET", "/counters/x/value", "", "")
	if code != http.StatusServiceUnavailable || testutil.ErrorOf(t, body) != "every live worker for namespace /counters is draining (2 of 2)" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("new id with every worker draining: %d %s", code, body)
	}
	rig.register(t, "w3", "n3", -time.Minute, "/counters") // lapsed: not counted
	if _, body, _ := rig.call(t, "GET", "/counters/x/value", "", ""); !strings.Contains(body, "(2 of 2)") {
		t.Errorf("a lapsed worker counted: %s", body)
	}
}
