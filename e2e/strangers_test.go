package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// Reads of fresh ids by a client with no token leave no state behind: each activation fenced its
// id in Postgres, and once the instances are evicted (their placements released) the fence
// collection drops every such row. The same for Statewire clients that stream under client ids
// of their own: no tray, and the threads' fences go too. An id that wrote keeps its fence and
// its state.
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
	// Statewire clients that only watch: each opens a stream to a fresh thread under a client
	// id of its own, reads the snapshot and leaves.
	for i := range n {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/threads/stranger-%d/stream", a.URL, i),
			strings.NewReader(fmt.Sprintf(`{"clientId":"watcher-%d"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if resp.StatusCode != 200 || err != nil || !strings.Contains(line, `"snapshot"`) {
			t.Fatalf("stream %d: %d %q %v", i, resp.StatusCode, line, err)
		}
		cancel()
		resp.Body.Close()
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows := func() (fences, strangers, trays int) {
		if err := conn.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE id LIKE 'stranger-%'),
			(SELECT count(*) FROM pinned_tray_index WHERE id LIKE 'stranger-%')
			FROM pinned_instance_fence`).Scan(&fences, &strangers, &trays); err != nil {
			t.Fatal(err)
		}
		return fences, strangers, trays
	}
	var fences, strangers, trays int
	testutil.WaitFor(t, 30*time.Second, "the strangers' fence rows collected", func() bool {
		fences, strangers, trays = rows()
		return strangers == 0
	})
	if fences != 1 || trays != 0 {
		t.Fatalf("%d fence rows and %d tray rows of strangers left, want 1 fence (the id that wrote) and no tray", fences, trays)
	}
	// The id that wrote keeps its state, and a stranger's id comes back as new.
	expect(t, a, "GET", "/counters/kept/value", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/stranger-0/increment", 200, `{"value":1}`)
}
