package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

const pgBin = "/usr/lib/postgresql/15/bin"

// throwawayPG is a PostgreSQL server of the test's own, in a temp dir on a
// free port, so stopping it disturbs no other test.
type throwawayPG struct {
	dir, port string
}

// pgAsPostgres runs a PostgreSQL tool as the postgres user (initdb refuses
// root).
func pgAsPostgres(t *testing.T, tool string, args ...string) {
	t.Helper()
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(pgBin, tool)}, args...)...)
	if os.Getuid() != 0 {
		cmd = exec.Command(filepath.Join(pgBin, tool), args...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
	}
}

func startThrowawayPG(t *testing.T) *throwawayPG {
	t.Helper()
	base, err := os.MkdirTemp("", "pinnedd-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if os.Getuid() == 0 {
		if out, err := exec.Command("chown", "-R", "postgres:postgres", base).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
	}
	_, port, _ := strings.Cut(testutil.FreeAddr(t), ":")
	pg := &throwawayPG{dir: filepath.Join(base, "data"), port: port}
	pgAsPostgres(t, "initdb", "-D", pg.dir, "-A", "trust", "-U", "postgres", "--no-sync")
	pg.start(t)
	t.Cleanup(func() {
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pgBin, "pg_ctl"), "-D", pg.dir, "-m", "immediate", "-w", "stop").Run()
	})
	return pg
}

func (pg *throwawayPG) start(t *testing.T) {
	t.Helper()
	pgAsPostgres(t, "pg_ctl", "-D", pg.dir, "-w", "-l", filepath.Join(pg.dir, "server.log"),
		"-o", fmt.Sprintf("-p %s -k %s -c listen_addresses=127.0.0.1 -c fsync=off", pg.port, pg.dir), "start")
}

func (pg *throwawayPG) stop(t *testing.T) {
	t.Helper()
	pgAsPostgres(t, "pg_ctl", "-D", pg.dir, "-m", "fast", "-w", "stop")
}

func (pg *throwawayPG) dsn() string {
	return "postgres://postgres@127.0.0.1:" + pg.port + "/postgres?sslmode=disable"
}

// Postgres stopped under a fleet: new ids answer 503 + Retry-After with
// the reason at once (no 500, no hang), every node's /readyz turns 503 with
// the reason after the grace, live instances keep serving reads; once
// Postgres is back every node is ready again, new ids activate, and no
// acknowledged count is lost.
func TestPostgresOutageIsBoundedAndReported(t *testing.T) {
	t.Parallel()
	pg := startThrowawayPG(t)
	db := []string{"--database-url", pg.dsn()}
	n1 := newNode(t, "n1", append([]string{"--bootstrap"}, db...)...).start(t, true)
	n2 := newNode(t, "n2", append([]string{"--join", n1.url()}, db...)...).start(t, true)
	nodes := []*node{n1, n2}
	testutil.WaitFor(t, 15*time.Second, "placements past the quarantine", func() bool {
		return statusDo(t, n1, "POST", "/counters/kept/increment").Code == 200
	})
	acked := int64(1)
	for range 3 {
		for _, n := range nodes {
			r := statusDo(t, n, "POST", "/counters/kept/increment")
			v, err := counterValue(r.Body)
			if r.Code != 200 || err != nil {
				t.Fatalf("increment before the outage: %d %s", r.Code, r.Body)
			}
			acked = v
		}
	}

	// The outage begins as the stop does: Postgres refuses new connections
	// while it shuts down, before stop returns.
	stopped := time.Now()
	pg.stop(t)
	// New ids: a prompt 503 + Retry-After that says why, on every node.
	for i, n := range nodes {
		start := time.Now()
		r := statusDo(t, n, "POST", fmt.Sprintf("/counters/new%d/increment", i))
		if d := time.Since(start); d > 8*time.Second {
			t.Fatalf("a new id during the outage answered after %s, want within the store's 5s deadline", d)
		}
		if r.Code != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || !strings.Contains(r.Body, "state store unavailable") {
			t.Fatalf("new id via %s during the outage: %d Retry-After %q %s, want 503 + Retry-After 'state store unavailable: ...'",
				n.id, r.Code, r.Header.Get("Retry-After"), r.Body)
		}
	}
	// A live instance still answers what needs no store.
	if r := statusDo(t, n1, "GET", "/counters/kept/value"); r.Code != 200 {
		t.Fatalf("read of a live instance during the outage: %d %s", r.Code, r.Body)
	}
	// A write to it answers within the store's deadline, and says it may
	// have run: 504, never a hang nor a 503 a client would retry blindly.
	// The failed commit resets the instance, which cannot load its state
	// until the store is back: later writes answer 503 + Retry-After
	// (nothing ran), or 504 again.
	for i, n := range nodes {
		start := time.Now()
		r := statusDo(t, n, "POST", "/counters/kept/increment")
		if d := time.Since(start); d > 8*time.Second {
			t.Fatalf("an increment of a live instance during the outage answered after %s, want within the store's 5s deadline", d)
		}
		unknown := r.Code == http.StatusGatewayTimeout && strings.Contains(r.Body, `"outcome":"unknown"`)
		refused := i > 0 && r.Code == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != ""
		if !unknown && !refused {
			t.Fatalf("increment via %s during the outage: %d %s, want 504 outcome unknown (or, after the first, 503 + Retry-After)", n.id, r.Code, r.Body)
		}
	}
	for _, n := range nodes {
		testutil.WaitFor(t, 15*time.Second, n.id+" /readyz 503 with the reason", func() bool {
			r := statusDo(t, n, "GET", "/readyz")
			return r.Code == http.StatusServiceUnavailable && strings.Contains(r.Body, "state store unavailable")
		})
		if got := n.a.Metric("pinned_state_store_up"); got != 0 {
			t.Fatalf("pinned_state_store_up on %s = %v during the outage", n.id, got)
		}
		if _, err := n.a.WaitLog(5*time.Second, `"level":"ERROR"`, "state store unavailable"); err != nil {
			t.Fatalf("%s logged no ERROR for the outage: %v", n.id, err)
		}
	}
	if d := time.Since(stopped); d < 5*time.Second {
		t.Fatalf("not ready after %s: the grace is 5s", d)
	}

	pg.start(t)
	for _, n := range nodes {
		testutil.WaitFor(t, 15*time.Second, n.id+" ready again", func() bool { return statusDo(t, n, "GET", "/readyz").Code == 200 })
		if _, err := n.a.WaitLog(5*time.Second, "state store reachable again"); err != nil {
			t.Fatalf("%s logged no recovery: %v", n.id, err)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "new ids served again", func() bool {
		return statusDo(t, n2, "POST", "/counters/after/increment").Code == 200
	})
	var r testutil.Response
	testutil.WaitFor(t, 15*time.Second, "the kept counter served", func() bool {
		r = statusDo(t, n1, "POST", "/counters/kept/increment")
		return r.Code == 200
	})
	if v, err := counterValue(r.Body); err != nil || v <= acked {
		t.Fatalf("kept counter after the outage: %s, want above the last acknowledged %d", r.Body, acked)
	}
}
