package testutil

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Status is an agent's GET /_pinned/status as tests read it: the one
// decoder of it for the e2e tests and the benchmarks (add a field here
// rather than declare another struct).
type Status struct {
	Worker struct {
		ClientID string `json:"clientId"`
		Lease    string `json:"lease"`
	} `json:"worker"`
	Plugins []struct {
		Name       string   `json:"name"`
		Path       string   `json:"path"`
		PID        int      `json:"pid"`
		State      string   `json:"state"`
		Restarts   int      `json:"restarts"`
		Degraded   bool     `json:"degraded"`
		Namespaces []string `json:"namespaces"`
		User       string   `json:"user"`
	} `json:"plugins"`
	Instances []struct {
		Env         string `json:"env"`
		Hostname    string `json:"hostname"`
		Namespace   string `json:"namespace"`
		ID          string `json:"id"`
		Generation  uint64 `json:"generation"`
		Connections int    `json:"connections"`
	} `json:"instances"`
}

// Gen is the generation ns/id runs under on the node, 0 if it does not run
// there.
func (s Status) Gen(ns, id string) uint64 {
	for _, in := range s.Instances {
		if in.Namespace == ns && in.ID == id {
			return in.Generation
		}
	}
	return 0
}

// Runs reports whether ns/id runs on the node.
func (s Status) Runs(ns, id string) bool { return s.Gen(ns, id) != 0 }

// Status reads the agent's status; an error when it does not answer 200
// with one (a node that is down or restarting).
func (a *Agent) Status() (Status, error) {
	var st Status
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

// LiveWorkers counts the live workers the agent's directory lists.
func (a *Agent) LiveWorkers() (int, error) {
	r, err := a.Do(http.MethodGet, "/registry/workers", "")
	if err != nil {
		return 0, err
	}
	if r.Code != http.StatusOK {
		return 0, fmt.Errorf("workers: %d %s", r.Code, r.Body)
	}
	var out struct {
		Workers []struct {
			Live bool `json:"live"`
		} `json:"workers"`
	}
	if err := r.JSONErr(&out); err != nil {
		return 0, fmt.Errorf("workers: %w", err)
	}
	n := 0
	for _, w := range out.Workers {
		if w.Live {
			n++
		}
	}
	return n, nil
}

// WaitFleet waits until each node of a fleet just started sees every
// node's worker live, then waits out the directory's cold-start quarantine
// once, on an id no test uses (/counters/warmup: every fleet runs the
// counter host), so the caller's first placement is served.
func WaitFleet(t testing.TB, timeout time.Duration, nodes ...*Agent) {
	t.Helper()
	for _, a := range nodes {
		WaitForErr(t, timeout, a.URL+" sees every worker live", func() error {
			n, err := a.LiveWorkers()
			if err == nil && n != len(nodes) {
				err = fmt.Errorf("%d live workers, want %d", n, len(nodes))
			}
			return err
		})
	}
	WaitForErr(t, timeout, "the cold-start quarantine over", func() error {
		r, err := nodes[0].Do(http.MethodGet, "/counters/warmup/value", "")
		if err == nil && r.Code != http.StatusOK {
			err = fmt.Errorf("%d %s", r.Code, r.Body)
		}
		return err
	})
}
