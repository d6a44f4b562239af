package pgstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/pgstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
	"github.com/pinnedd/pinnedd/statestore/storetest"
)

func open(t testing.TB, dsn string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	// Each store remembers its database so reopen and attach reach the same one.
	var mu sync.Mutex
	dsns := map[statestore.Store]string{}
	dsnOf := func(s statestore.Store) string {
		mu.Lock()
		defer mu.Unlock()
		return dsns[s]
	}
	openAt := func(t *testing.T, dsn string) statestore.Store {
		s := open(t, dsn)
		mu.Lock()
		dsns[s] = dsn
		mu.Unlock()
		return s
	}
	storetest.Run(t,
		func(t *testing.T) statestore.Store { return openAt(t, pgtest.NewDatabase(t)) },
		storetest.WithReopen(func(t *testing.T, s statestore.Store) statestore.Store {
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openAt(t, dsnOf(s))
		}),
		storetest.WithAttach(func(t *testing.T, s statestore.Store) statestore.Store {
			return openAt(t, dsnOf(s))
		}),
	)
}

// TestTrayIndexRows: the table an operator reads shows one row per tray, as in the seed.
func TestTrayIndexRows(t *testing.T) {
	ctx := t.Context()
	s := open(t, pgtest.NewDatabase(t))
	defer s.Close()
	if err := s.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	inst := statestore.InstanceKey{Namespace: "/threads", ID: "t1"}
	if _, err := s.Commit(ctx, inst, 3, []statestore.Mutation{
		statestore.SetField{Tray: statestore.TrayKey{NS: "log", ID: "~"}, Name: "messages", Value: []byte(`{}`)},
		statestore.AppendItems{Tray: statestore.TrayKey{NS: "client_commands", ID: "c1"}, Payloads: [][]byte{[]byte(`{"cmd":1}`)}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, inst, 4, []statestore.Mutation{
		statestore.SetField{Tray: statestore.TrayKey{NS: "log", ID: "~"}, Name: "messages", Value: []byte(`{"m":1}`)},
	}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool().Query(ctx, `SELECT ns, id, tray_ns, tray_id, marked, generation, updated_at
		FROM pinned_tray_index ORDER BY tray_ns, tray_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var ns, id, trayNS, trayID string
		var marked bool
		var gen int64
		var updated time.Time
		if err := rows.Scan(&ns, &id, &trayNS, &trayID, &marked, &gen, &updated); err != nil {
			t.Fatal(err)
		}
		if updated.IsZero() {
			t.Fatalf("updated_at not set")
		}
		got = append(got, strings.Join([]string{ns, id, trayNS, trayID, map[bool]string{true: "t", false: "f"}[marked], strconv.FormatInt(gen, 10)}, "|"))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"/threads|t1|client_commands|c1|t|3", "/threads|t1|log|~|f|4"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("pinned_tray_index:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var fenceGen int64
	if err := s.Pool().QueryRow(ctx, `SELECT generation FROM pinned_instance_fence WHERE ns = '/threads' AND id = 't1'`).Scan(&fenceGen); err != nil || fenceGen != 4 {
		t.Fatalf("pinned_instance_fence generation = %d, %v; want 4", fenceGen, err)
	}
}

// TestSetupMigratesOnce: nodes starting together record each schema version exactly once.
func TestSetupMigratesOnce(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const nodes = 6
	stores := make([]*pgstore.Store, nodes)
	for i := range stores {
		stores[i] = open(t, dsn)
		defer stores[i].Close()
	}
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() { errs[i] = s.Setup(context.Background()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d Setup: %v", i, err)
		}
	}
	var rows, distinct int
	if err := stores[0].Pool().QueryRow(t.Context(),
		`SELECT count(*), count(DISTINCT version) FROM pinned_schema_version`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != distinct || rows < 1 {
		t.Fatalf("pinned_schema_version has %d rows for %d versions", rows, distinct)
	}
}

// TestRefusesNewerSchema: a node must not write into a schema it does not know.
func TestRefusesNewerSchema(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	defer s.Close()
	if err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(t.Context(), `INSERT INTO pinned_schema_version (version) VALUES (999)`); err != nil {
		t.Fatal(err)
	}
	if err := s.Setup(t.Context()); err == nil || !strings.Contains(err.Error(), "schema version 999") {
		t.Fatalf("Setup on a newer schema: err = %v, want a refusal", err)
	}
}

func BenchmarkCommit(b *testing.B) {
	s := open(b, pgtest.NewDatabase(b))
	defer s.Close()
	storetest.BenchCommit(b, s)
}

// TestKeysCollateByBytes: the server here may well default to C.UTF-8, so the conformance
// suite's byte-order cases would pass without the schema's COLLATE "C"; check the columns.
func TestKeysCollateByBytes(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	defer s.Close()
	if err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool().Query(t.Context(), `SELECT table_name || '.' || column_name FROM information_schema.columns
		WHERE table_name LIKE 'pinned\_%' AND data_type = 'text' AND coalesce(collation_name, '') <> 'C'`)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("text columns without COLLATE \"C\": %v", bad)
	}
}

// A writer cut off between its fence upsert and COMMIT (here: a transaction begun as the store
// begins its own, then left open) holds the fence row lock; the server ends it after
// IdleInTransactionTimeout, so the next owner's Load goes through instead of waiting for a dead
// connection to be noticed.
func TestAbandonedTransactionFreesTheFence(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	next := open(t, dsn)
	defer next.Close()
	if err := next.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	old := open(t, dsn)
	defer old.Close()
	inst := statestore.InstanceKey{Namespace: "/counters", ID: "cut"}
	if _, err := old.Commit(t.Context(), inst, 1, nil); err != nil {
		t.Fatal(err)
	}
	tx, err := old.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) // before old.Close, which waits for the connection
	var timeout string
	if err := tx.QueryRow(t.Context(), "SHOW idle_in_transaction_session_timeout").Scan(&timeout); err != nil || timeout != pgstore.IdleInTransactionTimeout {
		t.Fatalf("the store's transactions run with idle_in_transaction_session_timeout %q (%v), want %s", timeout, err, pgstore.IdleInTransactionTimeout)
	}
	if _, err := tx.Exec(t.Context(), `UPDATE pinned_instance_fence SET last_seq = last_seq WHERE ns = $1 AND id = $2`, inst.Namespace, inst.ID); err != nil {
		t.Fatal(err)
	}
	// The old owner says nothing more: its transaction idles with the row lock.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := next.Load(ctx, inst, 2); err != nil {
		t.Fatalf("the next owner's Load waited on an abandoned transaction's lock: %v", err)
	}
	if err := tx.Commit(t.Context()); err == nil {
		t.Fatal("the abandoned transaction committed after the server should have ended it")
	}
}

func fenceRows(t *testing.T, s *pgstore.Store) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pinned_instance_fence`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCollectedFencesLeaveNoRows: reads of many fresh ids leave a fence row each, and a
// collection removes every one of them; the floor row fences their stale owners.
func TestCollectedFencesLeaveNoRows(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	defer s.Close()
	if err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		if _, err := s.Load(t.Context(), statestore.InstanceKey{Namespace: "/counters", ID: "stranger-" + strconv.Itoa(i)}, uint64(100+i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := fenceRows(t, s); got != n {
		t.Fatalf("%d fence rows after %d reads, want %d", got, n, n)
	}
	dropped, err := s.CollectFences(t.Context(), 1000, nil)
	if err != nil || dropped != n {
		t.Fatalf("CollectFences = %d, %v; want %d", dropped, err, n)
	}
	if got := fenceRows(t, s); got != 0 {
		t.Fatalf("%d fence rows after collection, want 0", got)
	}
	var floor int64
	if err := s.Pool().QueryRow(t.Context(), `SELECT generation FROM pinned_fence_floor`).Scan(&floor); err != nil || floor != 1000 {
		t.Fatalf("pinned_fence_floor = %d, %v; want 1000", floor, err)
	}
}

// TestCollectSkipsAnInstanceInUse: a fence row a writer holds locked is in use, and is not
// collected (the collector skips it rather than waiting).
func TestCollectSkipsAnInstanceInUse(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t))
	defer s.Close()
	if err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	inst := statestore.InstanceKey{Namespace: "/counters", ID: "busy"}
	if err := s.Fence(t.Context(), inst, 3); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM pinned_instance_fence WHERE ns = $1 AND id = $2 FOR UPDATE`, inst.Namespace, inst.ID); err != nil {
		t.Fatal(err)
	}
	if dropped, err := s.CollectFences(t.Context(), 10, nil); err != nil || dropped != 0 {
		t.Fatalf("CollectFences with the row locked = %d, %v; want 0", dropped, err)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if g, err := s.Generation(t.Context(), inst); err != nil || g != 3 {
		t.Fatalf("Generation = %d, %v; want 3", g, err)
	}
}

// TestStaleOwnerQueuedBehindCollection: a stale owner whose upsert waits on the row lock of a
// collection that then drops the row inserts a new row once the lock goes; the floor the
// collection committed with the drop must still refuse it. The collection is played by hand
// (the same statements in one transaction) so the test can hold it open.
func TestStaleOwnerQueuedBehindCollection(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := open(t, dsn)
	defer s.Close()
	if err := s.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	inst := statestore.InstanceKey{Namespace: "/counters", ID: "raced"}
	if err := s.Fence(t.Context(), inst, 5); err != nil {
		t.Fatal(err)
	}
	collector := open(t, dsn)
	defer collector.Close()
	tx, err := collector.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	for _, q := range []string{
		`SELECT generation FROM pinned_fence_floor FOR UPDATE`,
		`SELECT 1 FROM pinned_instance_fence WHERE ns = '/counters' AND id = 'raced' FOR UPDATE`,
		`DELETE FROM pinned_instance_fence WHERE ns = '/counters' AND id = 'raced'`,
		`UPDATE pinned_fence_floor SET generation = 10`,
	} {
		if _, err := tx.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	stale := make(chan error, 1)
	go func() {
		_, err := s.Commit(context.Background(), inst, 5, []statestore.Mutation{
			statestore.SetField{Tray: statestore.TrayKey{NS: "log", ID: "~"}, Name: "m", Value: []byte("stale")},
		})
		stale <- err
	}()
	// Wait until the stale commit queues on the row lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := collector.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stale commit never waited on the collection's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stale:
		if !errors.Is(err, statestore.ErrFenced) {
			t.Fatalf("stale commit after the collection: err = %v, want ErrFenced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stale commit did not return")
	}
	if n := fenceRows(t, s); n != 0 {
		t.Fatalf("%d fence rows after the refused commit, want 0", n)
	}
}
