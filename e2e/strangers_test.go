package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// Reads of fresh ids by a client with no token leave no state behind: each activation fenced its
// id in Postgres, and once the instances are evicted (their placements released) the fence
// collection drops every such row. An id that wrote keeps its fence and its state.
func TestStrangersReadsLeaveNoFenceRows(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a := testutil.StartAgent(t, nil, "--dev", "--database-url", dsn,
		"--detached-timeout", "500ms", "--fence-gc-interval", "200ms")
	expect(t, a, "POST", "/counters/kept/increment", 200, `{"value":1}`)
	const n = 30
	for i := range n {
		expect(t, a, "GET", fmt.Sprintf("/counters/stranger-%d/value", i), 200, `{"value":0}`)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows := func() (fences, strangers int) {
		if err := conn.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE id LIKE 'stranger-%')
			FROM pinned_instance_fence`).Scan(&fences, &strangers); err != nil {
			t.Fatal(err)
		}
		return fences, strangers
	}
	var fences, strangers int
	testutil.WaitFor(t, 30*time.Second, "the strangers' fence rows collected", func() bool {
		fences, strangers = rows()
		return strangers == 0
	})
	if fences != 1 {
		t.Fatalf("%d fence rows left, want 1 (the id that wrote)", fences)
	}
	// The id that wrote keeps its state, and a stranger's id comes back as new.
	expect(t, a, "GET", "/counters/kept/value", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/stranger-0/increment", 200, `{"value":1}`)
}
