package pinboard

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// oneNodeDirectory is a directory on a real one-node Raft cluster in a
// temporary data dir, once it leads.
func oneNodeDirectory(t *testing.T) (*raftstore.Store, *Directory) {
	t.Helper()
	m := directory.New()
	store, err := raftstore.Open(context.Background(), raftstore.Config{
		NodeID: "n1", RaftAddr: "127.0.0.1:0", APIAddr: "http://127.0.0.1:1", DataDir: t.TempDir(), Bootstrap: true,
		Logger: slog.New(slog.DiscardHandler), HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
	}, m)
	if err != nil {
		t.Fatal(err)
	}
	dir := NewDirectory(m, store)
	t.Cleanup(func() {
		dir.Close()
		_ = store.Close(context.Background())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return store, dir
}

// Started as leader work, housekeeping creates the cluster secret at once
// and then collects workers whose lease lapsed past the retention and
// drains past theirs, keeping live ones.
func TestHousekeepingAsLeaderWork(t *testing.T) {
	store, dir := oneNodeDirectory(t)
	ctx := context.Background()
	now := time.Now()
	long := now.Add(-2 * time.Duration(directory.DefaultWorkerRetention) * time.Millisecond).UnixMilli()
	for _, w := range []struct {
		id   string
		at   int64
		ttlS int64
	}{{"gone", long, 1}, {"live", now.UnixMilli(), 3600}} {
		res, err := dir.Do(ctx, directory.Register{
			ClientID: w.id, SessionID: "s-" + w.id, NodeID: w.id, AdvertiseURL: "http://" + w.id, Namespaces: []string{"/c"},
			Headroom: 10, TTLMs: w.ttlS * 1000, Now: w.at,
		})
		if err != nil || res.Code != directory.CodeOK {
			t.Fatalf("register %s: %v %v", w.id, res.Code, err)
		}
	}
	expired := now.Add(-time.Duration(directory.DrainRetention)*time.Millisecond - time.Hour).UnixMilli()
	if res, err := dir.Do(ctx, directory.DrainWorker{ClientID: "live", Deadline: expired, Now: expired}); err != nil || res.Code != directory.CodeOK {
		t.Fatalf("drain: %v %v", res.Code, err)
	}
	if len(dir.Machine().Secret()) != 0 {
		t.Fatal("a new directory already has a cluster secret")
	}

	var logs testutil.SyncBuffer
	hk := NewHousekeeping(dir, 20*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	store.RunAsLeader("directory", hk.Run)

	deadline := time.Now().Add(10 * time.Second)
	for {
		m := dir.Machine()
		_, drained := m.DrainOf("live")
		_, goneKnown := m.Worker("gone")
		if len(m.Secret()) == 32 && !goneKnown && !drained {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: secret %d bytes, lapsed worker known %v, expired drain kept %v; log:\n%s", len(m.Secret()), goneKnown, drained, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := dir.Machine().Worker("live"); !ok {
		t.Fatal("housekeeping forgot a worker whose lease is live")
	}
	// The line follows the apply that the state above shows.
	testutil.WaitFor(t, 5*time.Second, "the collection logged", func() bool {
		return strings.Contains(logs.String(), "workers_forgotten=1") && strings.Contains(logs.String(), "drains_expired=1")
	})
}

// Run returns once its context ends, as raftstore's leader loop needs
// before the next term's work.
func TestHousekeepingReturnsWhenCancelled(t *testing.T) {
	_, dir := oneNodeDirectory(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewHousekeeping(dir, time.Millisecond, slog.New(slog.DiscardHandler)).Run(ctx)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(dir.Machine().Secret()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no cluster secret after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5s after its context ended")
	}
}
