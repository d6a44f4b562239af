package supervisor

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins/proto"
	dto "github.com/prometheus/client_model/go"
)

// startSupervisor runs a real plugin binary under a supervisor and serves
// /<ns>/<id>/<rest> through it on a loopback HTTP server.
func startSupervisor(t testing.TB, bin string, nss ...string) (*Supervisor, *httptest.Server) {
	t.Helper()
	return serveSupervisor(t, Config{Specs: []Spec{{Name: "p", Path: bin, Namespaces: nss}}})
}

// serveSupervisor is startSupervisor with a Config of the test's own (a
// nil Logger discards).
func serveSupervisor(t testing.TB, cfg Config) (*Supervisor, *httptest.Server) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(r.URL.Path, "/", 4)
		rest := "/"
		if len(parts) == 4 {
			rest += parts[3]
		}
		serveCall(s, w, r, "/"+parts[1], parts[2], 1, rest)
	}))
	// The first incarnations' and the last: a test may have crashed or
	// swapped some in between (checkNoPlugins sees every one).
	var pids []int
	for _, p := range s.Plugins() {
		pids = append(pids, p.PID)
	}
	t.Cleanup(func() {
		srv.Close()
		for _, p := range s.Plugins() {
			pids = append(pids, p.PID)
		}
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	})
	return s, srv
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 20: 30 * time.Second} {
		if got := backoff(n, 100*time.Millisecond, 30*time.Second); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// The data plane carries a never-ending SSE stream event by event.
func TestDataPlaneFlushesThrough(t *testing.T) {
	_, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/misc/s/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	testutil.ReadCountedEvents(t, resp.Body, 3)
	// Request bodies and queries travel too.
	r, err := testutil.Do(context.Background(), "POST", srv.URL+"/misc/b/echo?q=1", "payload", nil)
	if err != nil || !strings.Contains(r.Body, `"body":"payload"`) || !strings.Contains(r.Body, `"query":"q=1"`) {
		t.Fatalf("echo: %v %s", err, r.Body)
	}
}

// Eviction of an instance under an open stream ends the stream.
// Quit returns only once the instance is out of the table, also when an
// eviction of it is already under way (Evict alone returns at once then).
func TestQuitWaitsOutAnEvictionUnderWay(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/slowstop")
	resp, err := http.Get(srv.URL + "/slowstop/q/ping")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	k := Key{Namespace: "/slowstop", ID: "q"}
	go s.Evict(context.Background(), k, 0) // its Stop hook takes 500ms
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		in := s.instances[k]
		evicting := in != nil && in.evicting
		s.mu.Unlock()
		if evicting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first eviction never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Quit(ctx, k)
	if ctx.Err() != nil {
		t.Fatal("Quit ran out its deadline")
	}
	s.mu.Lock()
	left := s.instances[k] != nil
	s.mu.Unlock()
	if left { // the status lists it, lease and all
		t.Fatal("Quit returned with the instance still in the table")
	}
}

func TestEvictEndsOpenStreams(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	resp, err := http.Get(srv.URL + "/misc/e/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if !s.Evict(context.Background(), Key{Namespace: "/misc", ID: "e"}, time.Second) {
		t.Fatal("instance not live")
	}
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, br); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stream still open after eviction")
	}
	if s.Live("/misc", "e") {
		t.Fatal("evicted instance still live")
	}
	if got := reasonLabel(proto.Reason_REASON_OPERATOR); got != "operator" {
		t.Fatalf("reason label %q", got)
	}
}

// The idle timer is neither stopped nor reset per request: one that fires
// while a request is open leaves the instance be, and the request's end
// arms it again, so the instance goes once it has been idle for the
// timeout.
func TestIdleTimerWaitsOutOpenRequests(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	s.mu.Lock()
	s.cfg.DetachedTimeout = 200 * time.Millisecond
	s.mu.Unlock()
	live := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		in := s.instances[Key{Namespace: "/misc", ID: "i"}]
		return in != nil && !in.evicting
	}
	if r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/i/pid", "", nil); err != nil || r.Code != 200 {
		t.Fatalf("activate: %v %v", err, r)
	}
	// Open across several timeouts: the timer armed by the first
	// request's end fires meanwhile.
	if r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/i/sleep?ms=800", "", nil); err != nil || r.Code != 200 || r.Body != "slept" {
		t.Fatalf("sleep: %v %v", err, r)
	}
	if !live() {
		t.Fatal("evicted while a request was open")
	}
	// Counted once the eviction has ended (live turns false as it begins).
	idleEvictions := func() float64 {
		var m dto.Metric
		if err := s.metrics.evictions.WithLabelValues("/misc", "idle").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	testutil.WaitFor(t, 10*time.Second, "an idle eviction once the instance is idle", func() bool { return idleEvictions() == 1 })
	if live() {
		t.Fatal("evicted, and still live")
	}
}

// A request cut by its instance's eviction is answered as one its plugin
// did not answer (504, outcome unknown: it reached the plugin and may have
// run), not with net/http's implicit empty 200.
func TestEvictionUnderARequestAnswers504(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	type answer struct {
		r   testutil.Response
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/ev/sleep?ms=60000", "", nil)
		got <- answer{r, err}
	}()
	// Inside the plugin, not merely admitted: evicted before it reaches
	// the plugin, the request is honestly a 503 (it certainly did not run).
	testutil.WaitFor(t, 10*time.Second, "the request inside the plugin", func() bool {
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/ev/sleeping", "", nil)
		return err == nil && r.Code == 200 && r.Body == "1"
	})
	if !s.Evict(context.Background(), Key{Namespace: "/misc", ID: "ev"}, 0) {
		t.Fatal("instance not live")
	}
	var a answer
	select {
	case a = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("request still open after eviction")
	}
	if a.err != nil {
		t.Fatalf("request cut without an answer: %v", a.err)
	}
	if a.r.Code != http.StatusGatewayTimeout || !strings.Contains(a.r.Body, `"outcome":"unknown"`) {
		t.Fatalf("answer %d %q, want 504 with outcome unknown", a.r.Code, a.r.Body)
	}
}
