package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// outageReqTimeout bounds every client request of the outage test: a
// request that outlives it has an unknown outcome.
const outageReqTimeout = 5 * time.Second

// outageDoShort is a.Do within outageReqTimeout.
func outageDoShort(a *testutil.Agent, method, path string) (testutil.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), outageReqTimeout)
	defer cancel()
	return testutil.Do(ctx, method, a.URL+path, "", map[string]string{"Authorization": "Bearer " + testutil.Token})
}

// outageJSONError reports whether body is a JSON object with a non-empty "error"
// (or "message") string: a clear error, not a stack trace or nothing.
func outageJSONError(body string) bool {
	var e map[string]any
	if json.Unmarshal([]byte(body), &e) != nil {
		return false
	}
	for _, k := range []string{"error", "message"} {
		if s, ok := e[k].(string); ok && s != "" {
			return true
		}
	}
	return false
}

// outageIncrementLoop increments /counters/<id> back to back, one request at a
// time, and records every outcome.
type outageIncrementLoop struct {
	mu        sync.Mutex
	acked     []int64     // values of 200 answers, in order
	ackedAt   []time.Time // when each came back
	unknown   int         // 5xx with a JSON error, or no answer in time
	errCodes  map[string]int
	bad       []string // answers that are neither an ack nor a clear error
	slowest   time.Duration
	requests  int
	stop      chan struct{}
	stopped   chan struct{}
	violation string // an acked value not above the previous one
}

func outageStartIncrementLoop(a *testutil.Agent, id string) *outageIncrementLoop {
	l := &outageIncrementLoop{errCodes: map[string]int{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(l.stopped)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			start := time.Now()
			r, err := outageDoShort(a, http.MethodPost, "/counters/"+id+"/increment")
			took := time.Since(start)
			l.mu.Lock()
			l.requests++
			l.slowest = max(l.slowest, took)
			switch {
			case err != nil:
				// No answer within outageReqTimeout (or the connection
				// broke): the increment may or may not have happened.
				l.unknown++
				l.errCodes["transport: "+outageShortErr(err)]++
			case r.Code == http.StatusOK:
				v, perr := counterValue(r.Body)
				if perr != nil {
					l.bad = append(l.bad, fmt.Sprintf("200 %v", perr))
					break
				}
				if n := len(l.acked); n > 0 && v <= l.acked[n-1] && l.violation == "" {
					l.violation = fmt.Sprintf("acked %d after %d", v, l.acked[n-1])
				}
				l.acked = append(l.acked, v)
				l.ackedAt = append(l.ackedAt, time.Now())
			case r.Code >= 500 && outageJSONError(r.Body):
				// The counter applies the increment to its memory before
				// waiting for the store: its outcome is unknown.
				l.unknown++
				l.errCodes[fmt.Sprintf("%d %s", r.Code, outageTrimBody(r.Body))]++
			default:
				l.bad = append(l.bad, fmt.Sprintf("%d %q", r.Code, outageTrimBody(r.Body)))
			}
			l.mu.Unlock()
			if err != nil {
				// Do not spin if the node refuses connections at once.
				select {
				case <-l.stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	}()
	return l
}

func outageShortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

func outageTrimBody(b string) string {
	b = strings.TrimSpace(b)
	if len(b) > 160 {
		b = b[:160] + "..."
	}
	return b
}

// acks returns how many increments were acknowledged and when the last was.
func (l *outageIncrementLoop) acks() (int, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.acked) == 0 {
		return 0, time.Time{}
	}
	return len(l.acked), l.ackedAt[len(l.ackedAt)-1]
}

func (l *outageIncrementLoop) halt() {
	close(l.stop)
	<-l.stopped
}

// outageCutPostgres terminates every backend of database db, again and
// again, for d: nothing of pinnedd's pool survives, and new connections are
// killed as soon as they show up. With refuse, the database also refuses
// new connections meanwhile (ALLOW_CONNECTIONS false), so not one commit
// slips through between two rounds. It returns how many backends it ended.
func outageCutPostgres(t *testing.T, admin *pgx.Conn, db string, d time.Duration, refuse bool) int {
	t.Helper()
	if refuse {
		allow := func(on bool) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS %t", pgx.Identifier{db}.Sanitize(), on)); err != nil {
				t.Fatalf("ALLOW_CONNECTIONS %t on %s: %v", on, db, err)
			}
		}
		allow(false)
		defer allow(true)
	}
	killed := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rows, err := admin.Query(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
		if err != nil {
			cancel()
			t.Fatalf("terminate backends of %s: %v", db, err)
		}
		for rows.Next() {
			var ok bool
			if err := rows.Scan(&ok); err == nil && ok {
				killed++
			}
		}
		rows.Close()
		cancel()
		if err := rows.Err(); err != nil {
			t.Fatalf("terminate backends of %s: %v", db, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return killed
}

// Postgres goes away twice under a stream of increments: every backend of
// the node's database is terminated, repeatedly, for a second. No
// acknowledged increment may be lost, acknowledged values only grow, the
// requests caught in the outage fail clearly (or time out, an unknown
// outcome), and increments succeed again within seconds. Then a garbage
// value in the store makes an activation fail with a clear 5xx, and nothing
// else.
func TestPostgresOutageNoHalfWrites(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := cfg.Database
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	defer admin.Close(context.Background())

	a := testutil.StartAgent(t, nil, "--dev", "--database-url", dsn)
	mustInc := func(a *testutil.Agent, id string, want int64) {
		t.Helper()
		r, err := outageDoShort(a, http.MethodPost, "/counters/"+id+"/increment")
		if err != nil || r.Code != http.StatusOK {
			t.Fatalf("increment %s: %v %d %s", id, err, r.Code, r.Body)
		}
		if v, err := counterValue(r.Body); err != nil || v != want {
			t.Fatalf("increment %s = %s, want %d", id, strings.TrimSpace(r.Body), want)
		}
	}
	// Two more ids, for the corrupt-row check at the end.
	mustInc(a, "bad", 1)
	mustInc(a, "good", 1)

	loop := outageStartIncrementLoop(a, "o")
	stopped := false
	defer func() {
		if !stopped {
			loop.halt()
		}
	}()
	waitAcks := func(what string, n int, after time.Time, timeout time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		var got int
		var last time.Time
		if err := testutil.Eventually(timeout, func() bool {
			got, last = loop.acks()
			return got >= n && last.After(after)
		}); err != nil {
			loop.mu.Lock()
			defer loop.mu.Unlock()
			t.Fatalf("%s: %d acks (want %d after %s) within %s; errors %v, bad %q",
				what, got, n, after.Format(time.StampMilli), timeout, loop.errCodes, loop.bad)
		}
		return time.Since(start)
	}
	waitAcks("warm-up", 20, time.Time{}, 10*time.Second)

	for round := 1; round <= 2; round++ {
		before, _ := loop.acks()
		cutStart := time.Now()
		// The first outage only terminates backends, as a failover or a
		// restart of Postgres does; the second also refuses connections.
		refuse := round == 2
		killed := outageCutPostgres(t, admin, db, time.Second, refuse)
		cutEnd := time.Now()
		during, _ := loop.acks()
		// Recovery: the first increment acknowledged after the cut.
		rec := waitAcks(fmt.Sprintf("recovery after outage %d", round), during+1, cutEnd, 10*time.Second)
		t.Logf("outage %d (refusing connections: %t): %s, %d backends terminated, %d acks during it, first ack %s after it ended",
			round, refuse, cutEnd.Sub(cutStart).Round(time.Millisecond), killed, during-before, rec.Round(time.Millisecond))
		if killed == 0 {
			t.Fatalf("outage %d terminated no backend of %s: the cut did not happen", round, db)
		}
		// Settle: a run of acks before the next outage.
		now, _ := loop.acks()
		waitAcks(fmt.Sprintf("steady after outage %d", round), now+20, cutEnd, 10*time.Second)
	}
	loop.halt()
	stopped = true

	loop.mu.Lock()
	acked, unknown, bad, violation := loop.acked, loop.unknown, loop.bad, loop.violation
	t.Logf("client: %d requests, %d acked, %d unknown %v, slowest %s",
		loop.requests, len(acked), unknown, loop.errCodes, loop.slowest.Round(time.Millisecond))
	loop.mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("answers that are neither an ack nor a clear 5xx error: %q", bad)
	}
	if violation != "" {
		t.Errorf("acknowledged values not strictly increasing: %s", violation)
	}

	r, err := outageDoShort(a, http.MethodGet, "/counters/o/value")
	if err != nil || r.Code != http.StatusOK {
		t.Fatalf("final value: %v %d %s", err, r.Code, r.Body)
	}
	final, err := counterValue(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	checkFinal := func(where string, v int64) {
		t.Helper()
		maxAcked := acked[len(acked)-1]
		if v < int64(len(acked)) || v < maxAcked || v > int64(len(acked)+unknown) {
			t.Errorf("%s: value %d, want between %d acked (highest %d) and %d acked+unknown",
				where, v, len(acked), maxAcked, len(acked)+unknown)
		}
	}
	checkFinal("GET after the outages", final)

	// What the store holds once the frontier caught up is what was served:
	// read it from Postgres, then from a new process that starts from the
	// store alone.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", db, err)
	}
	defer conn.Close(context.Background())
	field := func(id string) []byte {
		t.Helper()
		var v []byte
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := conn.QueryRow(qctx, `SELECT value FROM pinned_tray_fields
			WHERE ns = '/counters' AND id = $1 AND tray_ns = 'counter' AND tray_id = '~' AND name = 'value'`, id).Scan(&v)
		if err != nil {
			t.Fatalf("read %s's value from pinned_tray_fields: %v", id, err)
		}
		return v
	}
	var stored []byte
	testutil.WaitFor(t, 10*time.Second, "the store catches up with the served value", func() bool {
		stored = field("o")
		return string(stored) == fmt.Sprint(final)
	})

	a.Signal(syscall.SIGTERM)
	if code, err := a.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("agent stop: exit %d, %v\n%s", code, err, a.Logs())
	}
	for _, line := range strings.Split(a.Logs(), "\n") {
		if strings.Contains(line, "panic") {
			t.Errorf("agent logged a panic: %s", line)
		}
	}

	// Garbage in the stored value of an instance that is not active.
	tag, err := conn.Exec(ctx, `UPDATE pinned_tray_fields SET value = $1
		WHERE ns = '/counters' AND id = 'bad' AND tray_ns = 'counter' AND tray_id = '~' AND name = 'value'`,
		[]byte("{not json\xff"))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("corrupt bad's value: %v (%d rows)", err, tag.RowsAffected())
	}

	b := testutil.StartAgent(t, nil, "--dev", "--database-url", dsn)
	r, err = outageDoShort(b, http.MethodGet, "/counters/o/value")
	if err != nil || r.Code != http.StatusOK {
		t.Fatalf("value after restart: %v %d %s", err, r.Code, r.Body)
	}
	if v, err := counterValue(r.Body); err != nil || v != final {
		t.Errorf("value after restart = %s, want %d", strings.TrimSpace(r.Body), final)
	}
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodGet} {
		path := "/counters/bad/value"
		if method == http.MethodPost {
			path = "/counters/bad/increment"
		}
		r, err := outageDoShort(b, method, path)
		if err != nil {
			t.Fatalf("%s %s with a corrupt stored value: %v (want a clear 5xx)", method, path, err)
		}
		if r.Code < 500 || !outageJSONError(r.Body) {
			t.Errorf("%s %s with a corrupt stored value = %d %q, want a 5xx with a JSON error", method, path, r.Code, outageTrimBody(r.Body))
		} else {
			t.Logf("%s %s with a corrupt stored value: %d %s", method, path, r.Code, outageTrimBody(r.Body))
		}
	}
	// The cause is in the node's log, for the operator.
	cause := ""
	for _, line := range strings.Split(b.Logs(), "\n") {
		if strings.Contains(line, "/counters/bad") && strings.Contains(line, "activat") && strings.Contains(line, "invalid character") {
			cause = line
			break
		}
	}
	if cause == "" {
		t.Errorf("no log line of pinnedd names the corrupt value as the cause of /counters/bad's failed activation")
	} else {
		t.Logf("logged: %s", cause)
	}
	if got := field("bad"); string(got) != "{not json\xff" {
		t.Errorf("the corrupt value was overwritten with %q", got)
	}
	mustInc(b, "good", 2)
	mustInc(b, "o", final+1)
	if !testutil.Alive(b.PID()) {
		t.Fatalf("agent died\n%s", b.Logs())
	}
	for _, line := range strings.Split(b.Logs(), "\n") {
		if strings.Contains(line, "panic") {
			t.Errorf("agent logged a panic: %s", line)
		}
	}
}
