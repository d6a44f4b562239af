package pinboard

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
)

// recordingWaker is the scanner's callback: it records each key it is
// asked to wake and fails the ones in fail.
type recordingWaker struct {
	fail map[string]bool
	mu   sync.Mutex
	woke []string
}

func (w *recordingWaker) Wake(_ context.Context, k directory.Key) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.woke = append(w.woke, k.Namespace+"/"+k.ID)
	if w.fail[k.Namespace+"/"+k.ID] {
		return false, errors.New("no live worker")
	}
	return true, nil
}

func (w *recordingWaker) calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.woke)
}

// markedStore is a real bbolt state store holding marked work for the
// given instances and only a field (nothing marked) for /c/idle.
func markedStore(t *testing.T, marked ...string) statestore.Store {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	if err := st.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	tray := statestore.TrayKey{NS: "log", ID: "~"}
	commit := func(id string, m statestore.Mutation) {
		if _, err := st.Commit(ctx, statestore.InstanceKey{Namespace: "/c", ID: id}, 1, []statestore.Mutation{m}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range marked {
		commit(id, statestore.AppendItems{Tray: tray, Payloads: [][]byte{[]byte("work")}})
	}
	commit("idle", statestore.SetField{Tray: tray, Name: "n", Value: []byte("1")})
	return st
}

// One pass walks every marked instance across pages, in key order, goes
// on past a failed wake, and skips instances with nothing marked.
func TestMarkedScannerWakesEveryMarkedInstance(t *testing.T) {
	st := markedStore(t, "a", "b", "c", "d", "e")
	w := &recordingWaker{fail: map[string]bool{"/c/b": true}}
	var logs testutil.SyncBuffer
	s := NewMarkedScanner(st, w, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	s.page = 2 // pages of 2, 2 and 1
	s.scan(context.Background())
	if got, want := w.calls(), []string{"/c/a", "/c/b", "/c/c", "/c/d", "/c/e"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if n := strings.Count(logs.String(), "woke an instance to resume its marked work"); n != 4 {
		t.Fatalf("logged %d wakes, want 4 (one failed):\n%s", n, logs.String())
	}
}

// Run scans every interval until its context ends; a store that fails a
// listing is logged and scanned again on the next tick.
func TestMarkedScannerRunsUntilCancelled(t *testing.T) {
	st := markedStore(t, "a", "b")
	w := &recordingWaker{}
	var logs testutil.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewMarkedScanner(st, w, 10*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil))).Run(ctx)
	}()
	waitFor(t, "two passes", func() bool { return len(w.calls()) >= 4 })
	if got := w.calls()[:4]; !slices.Equal(got, []string{"/c/a", "/c/b", "/c/a", "/c/b"}) {
		t.Fatalf("first two passes woke %v", got)
	}

	_ = st.Close() // every listing now fails with ErrClosed
	waitFor(t, "the failed listing logged", func() bool { return strings.Contains(logs.String(), "scan for marked work") })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5s after its context ended")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
