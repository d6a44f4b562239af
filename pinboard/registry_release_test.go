package pinboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// release sends body to the POST /registry/release handler and returns
// the status and the decoded answer.
func (rig *doorRig) release(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	rig.api.registryRelease(rec, httptest.NewRequest("POST", "/registry/release", strings.NewReader(body)))
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("release answered %d %q", rec.Code, rec.Body)
	}
	return rec.Code, out
}

// A worker gives back one id: checked against its session and the
// placement's generation, idempotent, and the id is placed anew after.
func TestWorkerGivesBackOneID(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *APIConfig) { c.Registry = NewRegistry(c.Dir, time.Minute) })
	rig.register(t, "wa", "na", time.Hour, "/jobs")
	rig.register(t, "wb", "nb", time.Hour, "/jobs")
	key := directory.Key{Namespace: "/jobs", ID: "j1"}
	now := time.Now().UnixMilli()
	res, err := rig.dir.Do(t.Context(), directory.Claim{Key: key, ClientID: "wa", Now: now})
	if err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %v", res.Code, err)
	}
	gen := res.Placement.Generation
	body := func(client, session string, g uint64) string {
		return fmt.Sprintf(`{"clientId":%q,"sessionId":%q,"namespace":"/jobs","id":"j1","generation":%d}`, client, session, g)
	}
	stillPlaced := func(what string) {
		t.Helper()
		if p, ok := rig.m.Placement(key); !ok || p.Generation != gen || p.Owner != "wa" {
			t.Fatalf("%s changed the placement: %+v %v", what, p, ok)
		}
	}
	for _, c := range []struct {
		name, body string
		code       int
		has        string
	}{
		{"another generation", body("wa", "s-wa", gen+1), http.StatusConflict, fmt.Sprintf("generation %d, not %d", gen, gen+1)},
		{"another worker", body("wb", "s-wb", gen), http.StatusConflict, "held by another worker"},
		{"a replaced session", body("wa", "s-old", gen), http.StatusConflict, "register again"},
		{"an unknown client", body("nobody", "s", gen), http.StatusNotFound, `unknown client id "nobody"`},
		{"no generation", body("wa", "s-wa", 0), http.StatusBadRequest, "generation must be"},
		{"no session", body("wa", "", gen), http.StatusBadRequest, "sessionId are required"},
		{"a bad namespace", strings.Replace(body("wa", "s-wa", gen), "/jobs", "jobs", 1), http.StatusBadRequest, `invalid namespace "jobs": want /name`},
		{"an unknown field type", `{"clientId":"wa","sessionId":"s-wa","namespace":"/jobs","id":"j1","generation":"1"}`, http.StatusBadRequest, "invalid JSON"},
	} {
		code, out := rig.release(t, c.body)
		if msg, _ := out["error"].(string); code != c.code || !strings.Contains(msg, c.has) {
			t.Errorf("%s: %d %v, want %d with %q", c.name, code, out, c.code, c.has)
		}
		stillPlaced(c.name)
	}
	if code, out := rig.release(t, body("wa", "s-wa", gen)); code != http.StatusOK || out["released"] != true {
		t.Fatalf("release: %d %v", code, out)
	}
	if _, ok := rig.m.Placement(key); ok {
		t.Fatal("released, still placed")
	}
	// The same call again (a retry after an unknown outcome) is no error.
	if code, out := rig.release(t, body("wa", "s-wa", gen)); code != http.StatusOK || out["released"] != false {
		t.Fatalf("release again: %d %v", code, out)
	}
	res, err = rig.dir.Do(t.Context(), directory.Claim{Key: key, ClientID: "wa", Now: time.Now().UnixMilli()})
	if err != nil || res.Code != directory.CodeGranted || res.Placement.Generation <= gen {
		t.Fatalf("placed anew: %v %+v %v", res.Code, res.Placement, err)
	}
	// The old generation's release leaves the new placement alone.
	if code, _ := rig.release(t, body("wa", "s-wa", gen)); code != http.StatusConflict {
		t.Fatalf("old generation after re-placement: %d", code)
	}
	if p, ok := rig.m.Placement(key); !ok || p.Generation != res.Placement.Generation {
		t.Fatalf("old generation's release changed the placement: %+v %v", p, ok)
	}
}

// What the registry makes of a worker's answer to POST /_pinned/wind_down.
func TestWindDownAnswer(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		n      int
		err    string
	}{
		{200, `{"instances":2}`, 2, ""},
		{200, `{"instances":0}`, 0, ""},
		{200, `{}`, 0, `without {"instances": N}`},
		{200, `OK`, 0, `without {"instances": N}`},
		{200, `{"instances":"2"}`, 0, `without {"instances": N}`},
		{200, `{"instances":-1}`, 0, "negative"},
		{503, `{"error":"lease expired"}`, 0, "answered 503: lease expired"},
		{404, `not here`, 0, "answered 404"},
	} {
		n, err := windDownAnswer(c.status, []byte(c.body))
		if n != c.n || (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%d %s: %d %v, want %d %q", c.status, c.body, n, err, c.n, c.err)
		}
	}
}
