package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// status is GET /_pinned/status: testutil's decoder, shared with the
// benchmarks.
type status = testutil.Status

// statusOf reads a's status; an error when it does not answer 200 with one
// (a node that is down or restarting).
func statusOf(a *testutil.Agent) (status, error) { return a.Status() }

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
