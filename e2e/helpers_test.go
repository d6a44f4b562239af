package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// status is GET /_pinned/status as the tests read it: one decoder for every
// test (fields are added here, not in a struct of each test's own).
type status struct {
	Worker struct {
		ClientID string `json:"clientId"`
		Lease    string `json:"lease"`
	} `json:"worker"`
	Plugins []struct {
		Name       string   `json:"name"`
		PID        int      `json:"pid"`
		State      string   `json:"state"`
		Restarts   int      `json:"restarts"`
		Degraded   bool     `json:"degraded"`
		Namespaces []string `json:"namespaces"`
	} `json:"plugins"`
	Instances []struct {
		Namespace   string `json:"namespace"`
		ID          string `json:"id"`
		Generation  uint64 `json:"generation"`
		Connections int    `json:"connections"`
	} `json:"instances"`
}

// gen is the generation ns/id runs under here, 0 if it does not run here.
func (s status) gen(ns, id string) uint64 {
	for _, in := range s.Instances {
		if in.Namespace == ns && in.ID == id {
			return in.Generation
		}
	}
	return 0
}

// runs reports whether ns/id runs here.
func (s status) runs(ns, id string) bool { return s.gen(ns, id) != 0 }

// statusOf reads a's status; an error when it does not answer 200 with one
// (a node that is down or restarting).
func statusOf(a *testutil.Agent) (status, error) {
	var st status
	r, err := a.Do(http.MethodGet, "/_pinned/status", "")
	if err != nil {
		return st, err
	}
	if r.Code != http.StatusOK {
		return st, fmt.Errorf("status: %d %s", r.Code, r.Body)
	}
	if err := r.JSONErr(&st); err != nil {
		return st, fmt.Errorf("status: %w: %s", err, r.Body)
	}
	return st, nil
}

// getStatus is statusOf that fails t.
func getStatus(t *testing.T, a *testutil.Agent) status {
	t.Helper()
	st, err := statusOf(a)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// counterValue parses a counter's answer, {"value":N}.
func counterValue(body string) (int64, error) {
	var v struct {
		Value *int64 `json:"value"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Value == nil {
		return 0, fmt.Errorf("not a counter value: %q (%v)", strings.TrimSpace(body), err)
	}
	return *v.Value, nil
}
