package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// The counter keeps its value in a tray: an acknowledged increment survives
// kill -9 of the plugin and of pinnedd (embedded store in the data dir).
func TestCounterSurvivesKill9(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	a := testutil.StartAgent(t, nil, "--dev", "--data-dir", dir)
	for i := 1; i <= 3; i++ {
		expect(t, a, "POST", "/counters/alice/increment", 200, "")
	}
	// kill -9 the plugin: the instance comes back with its value.
	old := pluginPID(t, a, "builtin")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin restarted", func() bool {
		pid := pluginPID(t, a, "builtin")
		return pid != 0 && pid != old
	})
	testutil.WaitFor(t, 10*time.Second, "value after plugin kill", func() bool {
		r := a.MustDo("GET", "/counters/alice/value", "")
		return r.Code == 200 && strings.TrimSpace(r.Body) == `{"value":3}`
	})
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":4}`)

	// kill -9 pinnedd itself, restart on the same data dir.
	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b := testutil.StartAgent(t, nil, "--dev", "--data-dir", dir)
	expect(t, b, "GET", "/counters/alice/value", 200, `{"value":4}`)
	expect(t, b, "POST", "/counters/alice/increment", 200, `{"value":5}`)
	expect(t, b, "GET", "/counters/bob/value", 200, `{"value":0}`)
}

// Work a handler declared applied is redelivered with resume=true after the
// plugin dies mid-run, without any client request, and settles.
func TestAppliedWorkRedeliveredAfterPluginCrash(t *testing.T) {
	t.Parallel()
	a, events := testhostAgent(t, "--plugin", "/jobs="+testutil.Bin(t, "testhost"))
	if r := a.MustDo("POST", "/jobs/j1/submit?name=first&mode=crash", ""); r.Code != 202 {
		t.Fatalf("submit: %d %s", r.Code, r.Body)
	}
	testutil.WaitFor(t, 15*time.Second, "redelivered and done", func() bool {
		return countEvents(t, events, "done first") == 1
	})
	got := strings.Join(eventLines(t, events), "|")
	if !strings.Contains(got, "run first resume=false|applied first|") || !strings.Contains(got, "run first resume=true|applied first|done first") {
		t.Fatalf("events %q", got)
	}
	if n := a.Metric(`pinned_plugin_restarts_total{plugin="testhost"}`); n != 1 {
		t.Fatalf("plugin restarts = %v", n)
	}
}

// The same after kill -9 of pinnedd: on restart the leader's scanner finds
// the marked tray and wakes the instance, with no client involved.
func TestAppliedWorkResumesAfterAgentKill9(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	args := []string{"--plugin", "/jobs=" + testutil.Bin(t, "testhost"), "--data-dir", dir, "--scan-interval", "200ms"}
	a, events := testhostAgent(t, args...)
	if r := a.MustDo("POST", "/jobs/j2/submit?name=second&mode=hang", ""); r.Code != 202 {
		t.Fatalf("submit: %d %s", r.Code, r.Body)
	}
	// Kill only once the batch is durably marked applied.
	testutil.WaitFor(t, 10*time.Second, "first delivery applied", func() bool { return countEvents(t, events, "applied second") == 1 })
	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b := testutil.StartAgent(t, []string{"TESTHOST_EVENTS=" + events, "PINNEDD_PLUGIN_ENV=TESTHOST_EVENTS"}, append([]string{"--dev"}, args...)...)
	if err := testutil.Eventually(15*time.Second, func() bool { return countEvents(t, events, "done second") == 1 }); err != nil {
		t.Fatalf("not resumed by the scanner; events %q", eventLines(t, events))
	}
	if countEvents(t, events, "run second resume=true") != 1 {
		t.Fatalf("events %q", eventLines(t, events))
	}
	_ = b
}
