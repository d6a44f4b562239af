package agent

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/supervisor"
)

// startWithHosts starts a one-node --dev cluster (no placement quarantine)
// in its own data dir, serving /misc from the testhost plugin, and
// activates /misc/a on it.
func startWithHosts(t *testing.T, logs *testutil.SyncBuffer) *Agent {
	t.Helper()
	cfg := noHostsConfig(t, logs)
	cfg.NoHosts, cfg.Dev = false, true
	cfg.Specs = []supervisor.Spec{{Name: "testhost", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}}
	cfg.ScanInterval, cfg.StopGrace = time.Second, 2*time.Second
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	t.Cleanup(func() { _ = a.Stop(Ending{}) })
	waitReady(t, a)
	resp, err := http.Get(a.advertise + "/misc/a/pid")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(a.sup.Instances()) != 1 {
		t.Fatalf("GET /misc/a/pid: %s, %d instances", resp.Status, len(a.sup.Instances()))
	}
	if _, _, ok := a.machine.Owner(directory.Key{Namespace: "/misc", ID: "a"}); !ok {
		t.Fatal("/misc/a is running but not placed")
	}
	return a
}

// A SIGTERM's stop drains the instances first, then takes every part down
// in order, deregistering the worker.
func TestStopDrainsThenDeregisters(t *testing.T) {
	var logs testutil.SyncBuffer
	a := startWithHosts(t, &logs)
	if err := a.Stop(Ending{DrainDeadline: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"tell systemd the node is stopping", "refuse new activations", "drain instances", "refuse new requests",
		"stop instances and plugins", "stop background work", "deregister the worker", "stop the front door",
		"close the directory", "close Raft", "close the state store", "release the data dir",
	}
	if got := stepsLogged(t, logs.String()); !slices.Equal(got, want) {
		t.Fatalf("stop with hosts took steps %q, want %q", got, want)
	}
	inOrder(t, want, shutdownOrder)
	if !strings.Contains(logs.String(), `"msg":"drained"`) {
		t.Fatalf("an idle instance did not drain before the deadline:\n%s", logs.String())
	}
	if w, ok := a.machine.Worker(a.worker.ClientID()); !ok || w.SessionID != "" {
		t.Fatalf("worker after the stop: %+v (known %v), want deregistered", w, ok)
	}
}

// A node that failed (here: as after a Raft storage fault) neither drains
// nor deregisters, and its error is Stop's; its instances still go, and
// their placements are given back through the supervisor's eviction hook.
func TestFailedNodeSkipsDrainAndRaftWrites(t *testing.T) {
	var logs testutil.SyncBuffer
	a := startWithHosts(t, &logs)
	boom := errors.New("boom")
	if err := a.Stop(Ending{Err: boom, StorageFault: true}); !errors.Is(err, boom) {
		t.Fatalf("Stop of a failed node: %v, want its error", err)
	}
	want := []string{
		"tell systemd the node is stopping", "refuse new requests", "stop instances and plugins", "stop background work",
		"stop the front door", "close the directory", "close Raft", "close the state store", "release the data dir",
	}
	if got := stepsLogged(t, logs.String()); !slices.Equal(got, want) {
		t.Fatalf("a failed node stopped with steps %q, want %q", got, want)
	}
	if w, ok := a.machine.Worker(a.worker.ClientID()); !ok || w.SessionID == "" {
		t.Fatalf("worker after a storage fault: %+v (known %v), want still registered", w, ok)
	}
	if _, _, ok := a.machine.Owner(directory.Key{Namespace: "/misc", ID: "a"}); ok {
		t.Fatal("the evicted instance's placement was not released")
	}
}
