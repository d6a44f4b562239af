package supervisor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
)

// Quick crashes degrade the plugin's namespaces, said once however many
// more crashes follow; a stable run ends the degradation, said once too.
func TestCrashLoopDegradesOnceAndRecovers(t *testing.T) {
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs:              []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}},
		Logger:             logger,
		CrashLoopThreshold: 2,
		StablePeriod:       2 * time.Second,
		BackoffMin:         10 * time.Millisecond,
		BackoffMax:         20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.SplitN(r.URL.Path, "/", 4)
		serveCall(s, w, r, "/"+parts[1], parts[2], 1, "/"+parts[3])
	}))
	seen := []int{}
	t.Cleanup(func() {
		srv.Close()
		s.Stop(context.Background())
		testutil.CheckGone(t, seen)
		checkNoPlugins(t)
		if t.Failed() {
			t.Logf("supervisor log:\n%s", logs)
		}
	})
	status := func() PluginStatus { return s.Plugins()[0] }
	pid := status().PID
	seen = append(seen, pid)
	code := func() int {
		r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/a/pid", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Code
	}
	if c := code(); c != 200 {
		t.Fatalf("before any crash: %d", c)
	}
	degradedLines := func() int { return len(logs.lines("plugin is crash-looping", `"plugin":"p"`)) }
	recoveredLines := func() int {
		return len(logs.lines(`"level":"INFO"`, "plugin recovered; namespace no longer degraded", `"plugin":"p"`))
	}
	// Three quick crashes, each of the restarted process: the second
	// reaches the threshold, the third finds the plugin degraded already.
	for i := 1; i <= 3; i++ {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the plugin restarted", func() bool {
			st := status()
			return st.State == StateRunning && st.PID != 0 && st.PID != pid
		})
		pid = status().PID
		seen = append(seen, pid)
		if want := i >= 2; status().Degraded != want {
			t.Fatalf("after crash %d: degraded %v, want %v", i, status().Degraded, want)
		}
	}
	r, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/a/pid", "", nil)
	if err != nil || r.Code != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "5" || !strings.Contains(r.Body, "degraded") ||
		plugins.ClassifyAnswer(r.Code, r.Header.Get(plugins.HeaderRefusal)) != plugins.AnswerRefused {
		t.Fatalf("degraded namespace answered %v %+v, want 503 + Retry-After 5 'degraded', refused in-band (a forwarder places the id elsewhere)", err, r)
	}
	if n := degradedLines(); n != 1 {
		t.Fatalf("%d degradation log lines after three crashes, want 1", n)
	}
	if n := recoveredLines(); n != 0 {
		t.Fatalf("%d recovery log lines while degraded", n)
	}
	testutil.WaitFor(t, 10*time.Second, "recovery after a stable run", func() bool { return !status().Degraded })
	if c := code(); c != 200 {
		t.Fatalf("recovered namespace answered %d", c)
	}
	testutil.WaitFor(t, 5*time.Second, "the recovery logged", func() bool { return recoveredLines() == 1 })
	if !strings.Contains(logs.String(), `"namespaces":["/misc"]`) {
		t.Fatalf("degradation and recovery lines do not name the namespace")
	}
	if n := degradedLines(); n != 1 {
		t.Fatalf("%d degradation log lines, want 1", n)
	}

	// The stable run reset the count: a quick crash now is the first of a
	// new series, even of a process younger than the stable period (a hot
	// swap started it), and only the threshold's crash degrades again.
	if err := s.Reload(context.Background(), "/misc"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the swapped-in process serving", func() bool {
		st := status()
		return st.State == StateRunning && st.PID != 0 && st.PID != pid
	})
	for i := 1; i <= 2; i++ {
		pid = status().PID
		seen = append(seen, pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the plugin restarted", func() bool {
			st := status()
			return st.State == StateRunning && st.PID != 0 && st.PID != pid
		})
		if want := i >= 2; status().Degraded != want {
			t.Fatalf("after crash %d of a new series: degraded %v, want %v", i, status().Degraded, want)
		}
	}
	seen = append(seen, status().PID)
}

// The delay before each restart of a crash series doubles from BackoffMin:
// the n-th restart comes no sooner than BackoffMin·2^(n-1) after the crash.
// (TestBackoff checks the formula; this checks that restarts follow it.)
func TestRestartBackoffGrows(t *testing.T) {
	const lo = 100 * time.Millisecond
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs:              []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}},
		Logger:             logger,
		CrashLoopThreshold: 100, // never degraded here: only the delays count
		StablePeriod:       time.Minute,
		BackoffMin:         lo,
		BackoffMax:         time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := []int{}
	t.Cleanup(func() {
		s.Stop(context.Background())
		testutil.CheckGone(t, seen)
		checkNoPlugins(t)
		if t.Failed() {
			t.Logf("supervisor log:\n%s", logs)
		}
	})
	status := func() PluginStatus { return s.Plugins()[0] }
	pid := status().PID
	seen = append(seen, pid)
	for n := 1; n <= 5; n++ {
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "the plugin restarted", func() bool {
			st := status()
			return st.State == StateRunning && st.PID != 0 && st.PID != pid
		})
		took := time.Since(killed)
		pid = status().PID
		seen = append(seen, pid)
		if want := lo << (n - 1); took < want {
			t.Fatalf("restart %d came %s after the crash, want at least %s", n, took, want)
		}
	}
	if r := status().Restarts; r != 5 {
		t.Fatalf("%d restarts counted, want 5", r)
	}
}
