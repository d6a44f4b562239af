package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// --dev with Postgres and no --data-dir: the directory restarts from
// nothing, the state store does not. The generations the new directory
// issues must still be above the ones the store has seen, or every write
// would be fenced.
func TestDevPostgresRestartKeepsState(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a := testutil.StartAgent(t, nil, "--dev", "--database-url", dsn)
	expect(t, a, "POST", "/counters/pg/increment", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/pg/increment", 200, `{"value":2}`)
	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b := testutil.StartAgent(t, nil, "--dev", "--database-url", dsn)
	expect(t, b, "GET", "/counters/pg/value", 200, `{"value":2}`)
	expect(t, b, "POST", "/counters/pg/increment", 200, `{"value":3}`)
}

// Two workers sharing Postgres: kill -9 the owner, the survivor restores
// the counter from the store and goes on from the last acknowledged value.
func TestFleetFailoverRestoresFromPostgres(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	nodes := startFleet(t, "--database-url", dsn)
	for i := 0; i < 4; i++ {
		if r := nodes[i%3].a.MustDo("POST", "/counters/f/increment", ""); r.Code != 200 {
			t.Fatalf("increment: %d %s", r.Code, r.Body)
		}
	}
	owner := ownerOf(t, nodes, "/counters", "f")
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var survivor *node
	for _, n := range nodes {
		if n != owner {
			survivor = n
		}
	}
	var r testutil.Response
	testutil.WaitFor(t, 20*time.Second, "f restored on a survivor", func() bool {
		r = survivor.a.MustDo("GET", "/counters/f/value", "")
		return r.Code == 200
	})
	if strings.TrimSpace(r.Body) != `{"value":4}` {
		t.Fatalf("value after failover = %s, want 4", r.Body)
	}
}

// An owner frozen past its lease (SIGSTOP, then SIGCONT) refuses on waking
// and never serves from its stale instance: every acknowledged value, from
// any node, is above every value before it.
func TestFrozenOwnerNeverServesStale(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	nodes := startFleet(t, "--database-url", dsn)
	last := 0
	inc := func(n *node) (int, bool) {
		r, err := n.a.Do("POST", "/counters/z/increment", "")
		if err != nil || r.Code != 200 {
			return 0, false
		}
		var v struct{ Value int }
		r.JSON(t, &v)
		if v.Value <= last {
			t.Fatalf("%s served %d after %d: a stale instance answered", n.id, v.Value, last)
		}
		last = v.Value
		return v.Value, true
	}
	for i := 0; i < 3; i++ {
		inc(nodes[i])
	}
	owner := ownerOf(t, nodes, "/counters", "z")
	staleGen := instanceGen(t, owner, "z")
	if staleGen == 0 {
		t.Fatalf("%s owns z but does not report its generation", owner.id)
	}
	owner.a.Signal(syscall.SIGSTOP)
	var other *node
	for _, n := range nodes {
		if n != owner {
			other = n
		}
	}
	testutil.WaitFor(t, 20*time.Second, "z moves on", func() bool { _, ok := inc(other); return ok })
	owner.a.Signal(syscall.SIGCONT)
	// Right after waking, and for a while, the old owner must not serve z
	// from its stale instance: it refuses (lease expired) or forwards to
	// the new owner.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		inc(owner)
		inc(other)
	}
	// The stale activation is gone; z may have come back to this node, but
	// only under a newer generation.
	testutil.WaitFor(t, 10*time.Second, "the woken node quits its stale instance", func() bool {
		return instanceGen(t, owner, "z") != staleGen
	})
}

// instanceGen is the generation counter id runs under on n, 0 if not live.
func instanceGen(t *testing.T, n *node, id string) uint64 {
	t.Helper()
	return getStatus(t, n.a).Gen("/counters", id)
}
