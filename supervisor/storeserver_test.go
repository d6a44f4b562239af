package supervisor

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// An activation that takes over unfinished durable work says so at INFO,
// with the instance and its generation; one with nothing pending does not.
func TestResumedWorkLogged(t *testing.T) {
	events := filepath.Join(t.TempDir(), "events")
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs: []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/jobs"},
			Env: []string{"TESTHOST_EVENTS=" + events}}},
		Logger:     logger,
		Store:      memstore.New(),
		BackoffMin: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(r.URL.Path, "/", 4)
		serveCall(s, w, r, "/"+parts[1], parts[2], 7, "/"+parts[3])
	}))
	pids := []int{s.Plugins()[0].PID}
	t.Cleanup(func() {
		srv.Close()
		pids = append(pids, s.Plugins()[0].PID)
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
		if t.Failed() {
			t.Logf("supervisor log:\n%s", logs)
		}
	})
	restored := func() []string { return logs.lines(`"level":"INFO"`, "restored from store") }

	// Work that finishes: nothing to restore, then or later.
	if r, err := testutil.Do(context.Background(), "POST", srv.URL+"/jobs/quiet/submit?name=q", "", nil); err != nil || r.Code != 202 {
		t.Fatalf("submit: %v %+v", err, r)
	}
	happened := func(line string) func() bool {
		return func() bool { b, _ := os.ReadFile(events); return strings.Contains(string(b), line) }
	}
	testutil.WaitFor(t, 10*time.Second, "the quiet job done", happened("done q"))

	// Work the process dies in after declaring it applied: the restarted
	// plugin's activation of r1 resumes it.
	if r, err := testutil.Do(context.Background(), "POST", srv.URL+"/jobs/r1/submit?name=j1&mode=crash", "", nil); err != nil || r.Code != 202 {
		t.Fatalf("submit: %v %+v", err, r)
	}
	testutil.WaitFor(t, 20*time.Second, "the job resumed", happened("run j1 resume=true"))
	testutil.WaitFor(t, 5*time.Second, "the takeover logged", func() bool { return len(restored()) == 1 })
	line := restored()[0]
	for _, want := range []string{`"instance":"/jobs/r1"`, `"generation":7`, `"resume":true`, `"plugin":"p"`} {
		if !strings.Contains(line, want) {
			t.Errorf("takeover line lacks %s: %s", want, line)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the resumed job done", happened("done j1"))
	if n := len(restored()); n != 1 {
		t.Fatalf("%d restore lines, want 1 (the quiet instance and first activations say nothing)", n)
	}
}

// loadFails is a memory store whose Load fails while fail is set, as a
// store that does not answer does.
type loadFails struct {
	statestore.Store
	fail atomic.Bool
}

var errStoreDown = errors.New("store down (test)")

func (l *loadFails) Load(ctx context.Context, inst statestore.InstanceKey, gen uint64) ([]statestore.Tray, error) {
	if l.fail.Load() {
		return nil, errStoreDown
	}
	return l.Store.Load(ctx, inst, gen)
}

// An activation whose state did not load answers 503 + Retry-After naming
// the store (nothing ran: safe to retry), not 500, and leaves nothing
// live; once the store answers, the same id activates.
func TestActivationWithoutStateIs503(t *testing.T) {
	store := &loadFails{Store: memstore.New()}
	store.fail.Store(true)
	s, srv := serveSupervisor(t, Config{
		Specs: []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/jobs"}}},
		Store: store,
	})
	r, err := testutil.Do(context.Background(), "POST", srv.URL+"/jobs/j/submit?name=a", "", nil)
	if err != nil || r.Code != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || !strings.Contains(r.Body, "state store unavailable") {
		t.Fatalf("activation with the store down: %v %+v, want 503 + Retry-After 'state store unavailable'", err, r)
	}
	if s.Live("/jobs", "j") {
		t.Fatal("an activation whose state did not load left the instance live")
	}
	store.fail.Store(false)
	r, err = testutil.Do(context.Background(), "POST", srv.URL+"/jobs/j/submit?name=a", "", nil)
	if err != nil || r.Code != http.StatusAccepted {
		t.Fatalf("activation with the store back: %v %+v, want 202", err, r)
	}
}
