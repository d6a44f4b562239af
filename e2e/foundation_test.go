package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

func pluginPID(t *testing.T, a *testutil.Agent, name string) int {
	t.Helper()
	for _, p := range getStatus(t, a).Plugins {
		if p.Name == name {
			return p.PID
		}
	}
	t.Fatalf("no plugin %q", name)
	return 0
}

// expect asserts one request's status and (if want != "") exact body.
func expect(t *testing.T, a *testutil.Agent, method, path string, code int, want string) testutil.Response {
	t.Helper()
	r := a.MustDo(method, path, "")
	if r.Code != code || (want != "" && strings.TrimSpace(r.Body) != want) {
		t.Fatalf("%s %s = %d %q, want %d %q", method, path, r.Code, strings.TrimSpace(r.Body), code, want)
	}
	return r
}

// testhostAgent runs --dev with the test plugin serving its namespaces.
func testhostAgent(t *testing.T, extra ...string) (*testutil.Agent, string) {
	t.Helper()
	// The plugins append to it as the account a root pinnedd runs them as.
	events := testutil.SharedFile(t, "events")
	bin := testutil.Bin(t, "testhost")
	args := []string{"--dev"}
	for _, ns := range []string{"/hooks", "/keep", "/slow", "/fail", "/misc"} {
		args = append(args, "--plugin", ns+"="+bin)
	}
	a := testutil.StartAgent(t, []string{"TESTHOST_EVENTS=" + events, "PINNEDD_PLUGIN_ENV=TESTHOST_EVENTS"}, append(args, extra...)...)
	return a, events
}

func eventLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func countEvents(t *testing.T, path, prefix string) int {
	n := 0
	for _, l := range eventLines(t, path) {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// The README's quick start, step by step.
func TestDevCounterFlow(t *testing.T) {
	t.Parallel()
	a := testutil.StartAgent(t, nil, "--dev")
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":2}`)
	expect(t, a, "GET", "/counters/alice/value", 200, `{"value":2}`)
	expect(t, a, "POST", "/counters/bob/increment", 200, `{"value":1}`)
	expect(t, a, "GET", "/counters/alice/value", 200, `{"value":2}`)
	expect(t, a, "GET", "/healthz", 200, `{"status":"ok"}`)
	expect(t, a, "GET", "/readyz", 200, "")

	st := getStatus(t, a)
	if len(st.Instances) != 2 || st.Instances[0].ID != "alice" || st.Instances[1].ID != "bob" {
		t.Fatalf("instances = %+v, want alice and bob", st.Instances)
	}
	if st.Instances[0].Generation == 0 || st.Instances[0].Generation == st.Instances[1].Generation {
		t.Fatalf("generations %d and %d: want distinct, non-zero", st.Instances[0].Generation, st.Instances[1].Generation)
	}
	if got := a.Metric(`pinned_activations_total{namespace="/counters"}`); got != 2 {
		t.Fatalf("activations = %v, want 2", got)
	}
	if !strings.Contains(a.Logs(), "DEV MODE") {
		t.Fatal("--dev did not log the DEV MODE warning")
	}

	out, err := exec.Command(testutil.Bin(t, "pinnedd"), "status", "--addr", a.URL).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "/counters/alice") || !strings.Contains(string(out), "builtin") {
		t.Fatalf("pinnedd status: %v\n%s", err, out)
	}
	out, err = exec.Command(testutil.Bin(t, "pinnedd"), "status", "--addr", a.URL, "--token", "wrong").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "401") || !strings.Contains(string(out), "PINBOARD_TOKEN") {
		t.Fatalf("pinnedd status with a wrong token: %v\n%s", err, out)
	}
}

// examples/counter built as its own binary and loaded with --plugin.
func TestExternalCounterPlugin(t *testing.T) {
	t.Parallel()
	a := testutil.StartAgent(t, nil, "--dev", "--plugin", "/counters="+testutil.Bin(t, "counter"))
	expect(t, a, "POST", "/counters/x/increment", 200, `{"value":1}`)
	expect(t, a, "GET", "/counters/x/value", 200, `{"value":1}`)
	st := getStatus(t, a)
	var names []string
	for _, p := range st.Plugins {
		names = append(names, fmt.Sprintf("%s=%v", p.Name, p.Namespaces))
	}
	if got := strings.Join(names, " "); got != "counter=[/counters] builtin=[/threads /tickers]" {
		t.Fatalf("plugins = %s", got)
	}
}

func TestConcurrentFirstRequestsActivateOnce(t *testing.T) {
	t.Parallel()
	a, events := testhostAgent(t)
	const n = 24
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := a.Do("GET", "/slow/same/ping", "")
			if err == nil {
				codes[i] = r.Code
			}
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("request %d: status %d", i, c)
		}
	}
	if got := a.Metric(`pinned_activations_total{namespace="/slow"}`); got != 1 {
		t.Fatalf("activations = %v, want 1", got)
	}
	if got := countEvents(t, events, "activate /slow same"); got != 1 {
		t.Fatalf("host built %d instances, want 1", got)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t)
	expect(t, a, "GET", "/nope/x/y", 404, `{"error":"unknown namespace"}`)
	expect(t, a, "GET", "/NOPE/x", 404, `{"error":"unknown namespace"}`)
	expect(t, a, "GET", "/", 404, `{"error":"unknown namespace"}`)
	for _, id := range []string{
		"", "a%20b", "a%2Fb", ".hidden", "..", "%2E%2E", "x%00y", "ü", strings.Repeat("a", 257),
	} {
		r := a.MustDo("GET", "/misc/"+id+"/ping", "")
		if r.Code != 400 || !strings.Contains(r.Body, "invalid id") {
			t.Errorf("id %q: %d %s, want 400 invalid id", id, r.Code, r.Body)
		}
	}
	// Traversal never reaches an instance: the mux cleans the path first.
	r := a.MustDo("GET", "/misc/../healthz", "")
	if r.Code == 200 && strings.Contains(r.Body, `"namespace"`) {
		t.Fatalf("traversal reached an instance: %s", r.Body)
	}
	expect(t, a, "GET", "/misc/"+strings.Repeat("a", 256)+"/ping", 200, "")
	if got := a.Metric(`pinned_activations_total{namespace="/misc"}`); got != 1 {
		t.Fatalf("activations after bad input = %v, want only the valid one", got)
	}
	// The instance never sees pinnedd's routing headers, even forged ones.
	r, err := testutil.Do(context.Background(), "GET", a.URL+"/misc/h/ping", "", map[string]string{"X-Pinned-Namespace": "/other"})
	if err != nil || !strings.Contains(r.Body, `"pinnedHeader":""`) || !strings.Contains(r.Body, `"path":"/ping"`) {
		t.Fatalf("header leak or wrong path: %v %s", err, r.Body)
	}
	// A panicking handler is a 500, not a dead plugin.
	pid := pluginPID(t, a, "testhost")
	expect(t, a, "GET", "/misc/p/panic", 500, `{"error":"internal error"}`)
	if pluginPID(t, a, "testhost") != pid {
		t.Fatal("a handler panic restarted the plugin")
	}
	// A host that cannot build its instance: 500, nothing live.
	expect(t, a, "GET", "/fail/f/x", 500, `{"error":"activation failed"}`)
	for _, in := range getStatus(t, a).Instances {
		if in.Namespace == "/fail" {
			t.Fatalf("failed activation left an instance: %+v", in)
		}
	}
}

func TestPluginKilledIsRestarted(t *testing.T) {
	t.Parallel()
	a := testutil.StartAgent(t, nil, "--dev")
	expect(t, a, "POST", "/counters/k/increment", 200, `{"value":1}`)
	old := pluginPID(t, a, "builtin")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := testutil.Eventually(10*time.Second, func() bool {
		pid = pluginPID(t, a, "builtin")
		return pid != 0 && pid != old
	}); err != nil {
		t.Fatalf("plugin not restarted: %v", err)
	}
	if !testutil.Alive(pid) || testutil.Alive(old) {
		t.Fatalf("new plugin %d alive=%v, old %d alive=%v", pid, testutil.Alive(pid), old, testutil.Alive(old))
	}
	// The next request succeeds on the new process (a fresh instance:
	// in-memory state is the durable-state issue's business).
	expect(t, a, "POST", "/counters/k/increment", 200, "")
	if got := a.Metric(`pinned_plugin_restarts_total{plugin="builtin"}`); got != 1 {
		t.Fatalf("restarts metric = %v, want 1", got)
	}
	if got := a.Metric(`pinned_evictions_total{namespace="/counters",reason="crash"}`); got != 1 {
		t.Fatalf("crash evictions = %v, want 1", got)
	}
}

func TestCrashLoopDegradesNamespace(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t, "--plugin-stable-period", "1m")
	// The threshold is 3 consecutive quick crashes: after each of the
	// first two the plugin comes back and serves, not degraded; the third
	// degrades it.
	for i := 0; i < 3; i++ {
		if err := testutil.Eventually(10*time.Second, func() bool {
			r, err := a.Do("GET", "/misc/c/ping", "")
			return err == nil && r.Code == 200
		}); err != nil {
			t.Fatalf("plugin not serving after %d crashes: %v", i, err)
		}
		for _, p := range getStatus(t, a).Plugins {
			if p.Degraded {
				t.Fatalf("plugin %s degraded after %d crashes, want only after 3", p.Name, i)
			}
		}
		_, _ = a.Do("GET", "/misc/c/crash", "")
	}
	var r testutil.Response
	if err := testutil.Eventually(10*time.Second, func() bool {
		r = a.MustDo("GET", "/misc/fresh/ping", "")
		return r.Code == 503 && strings.Contains(r.Body, "degraded")
	}); err != nil {
		t.Fatalf("after 3 crashes: %d %s, want 503 degraded", r.Code, r.Body)
	}
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("degraded refusal without Retry-After")
	}
	degraded := false
	for _, p := range getStatus(t, a).Plugins {
		degraded = degraded || p.Degraded
	}
	if !degraded {
		t.Fatal("status does not show the plugin degraded")
	}
}

func TestKill9OfAgentTakesPluginsAlong(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t)
	pids := []int{pluginPID(t, a, "testhost"), pluginPID(t, a, "builtin")}
	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := testutil.Eventually(5*time.Second, func() bool {
		return !testutil.Alive(pids[0]) && !testutil.Alive(pids[1])
	}); err != nil {
		t.Fatalf("plugins %v outlived kill -9 of pinnedd", pids)
	}
}

func TestIdleEvictionRunsHooks(t *testing.T) {
	t.Parallel()
	a, events := testhostAgent(t)
	expect(t, a, "GET", "/hooks/h1/x", 200, "")
	if err := testutil.Eventually(10*time.Second, func() bool {
		return a.Metric(`pinned_evictions_total{namespace="/hooks",reason="idle"}`) == 1
	}); err != nil {
		t.Fatal("idle instance was not evicted")
	}
	got := strings.Join(eventLines(t, events), "|")
	for _, want := range []string{"start /hooks h1", "idle /hooks h1", "task-done /hooks h1", "stop /hooks h1"} {
		if !strings.Contains(got, want) {
			t.Fatalf("events %q lack %q", got, want)
		}
	}
	// Order: the task returns before the stop hook runs.
	if strings.Index(got, "task-done") > strings.Index(got, "stop /hooks") {
		t.Fatalf("stop ran before the task returned: %q", got)
	}
	// Evicted means released: the next request activates afresh.
	expect(t, a, "GET", "/hooks/h1/x", 200, "")
	if got := a.Metric(`pinned_activations_total{namespace="/hooks"}`); got != 2 {
		t.Fatalf("activations = %v, want 2", got)
	}

	// An idle hook that keeps the instance: asked repeatedly, never evicted.
	expect(t, a, "GET", "/keep/k1/x", 200, "")
	if err := testutil.Eventually(10*time.Second, func() bool { return countEvents(t, events, "idle /keep k1") >= 2 }); err != nil {
		t.Fatal("kept instance was not asked again")
	}
	if got := a.Metric(`pinned_evictions_total{namespace="/keep",reason="idle"}`); got != 0 {
		t.Fatalf("kept instance evicted (%v)", got)
	}
}

func TestStreamsFlushThrough(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.URL+"/misc/s/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// The handler never ends on its own: each event must arrive while the
	// stream is open.
	testutil.ReadCountedEvents(t, resp.Body, 3)
	// The client leaving frees the instance's connection.
	cancel()
	if err := testutil.Eventually(5*time.Second, func() bool {
		for _, in := range getStatusRaw(a) {
			if in == "s:0" {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal("closed stream still counted as a connection")
	}
}

func getStatusRaw(a *testutil.Agent) []string {
	st, err := statusOf(a)
	if err != nil {
		return nil
	}
	var out []string
	for _, in := range st.Instances {
		out = append(out, fmt.Sprintf("%s:%d", in.ID, in.Connections))
	}
	return out
}

func TestUpgradePassesThrough(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t)
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(a.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "GET /misc/u/upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"hello", "again"} {
		fmt.Fprintf(conn, "%s\n", msg)
		line, err := br.ReadString('\n')
		if err != nil || line != "echo: "+msg+"\n" {
			t.Fatalf("echo of %q = %q, %v", msg, line, err)
		}
	}
}

// An upgraded connection is bounded as a kept-alive one is: once it moved
// nothing either way for --http-idle-timeout, it is closed; while it
// talks, it stays.
func TestUpgradeIdleIsBounded(t *testing.T) {
	t.Parallel()
	a, _ := testhostAgent(t, "--http-idle-timeout", "2s")
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(a.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprint(conn, "GET /misc/idle/upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	// Talking for longer than the bound, a line every half second.
	for i := range 6 {
		fmt.Fprintf(conn, "ping %d\n", i)
		if line, err := br.ReadString('\n'); err != nil || line != fmt.Sprintf("echo: ping %d\n", i) {
			t.Fatalf("echo %d while talking: %q, %v", i, line, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Quiet: the front door closes it (the read ends with EOF, well before
	// the 30 s deadline this test set).
	start := time.Now()
	if _, err := br.ReadString('\n'); !errors.Is(err, io.EOF) {
		t.Fatalf("a quiet upgraded connection: %v after %v, want it closed", err, time.Since(start))
	}
}

func TestSIGTERMStopsEverythingAndExitsZero(t *testing.T) {
	t.Parallel()
	a, events := testhostAgent(t)
	expect(t, a, "GET", "/hooks/bye/x", 200, "")
	// An open stream must not hold the shutdown up: it ends when its
	// instance is evicted.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.URL+"/misc/s/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	pids := []int{pluginPID(t, a, "testhost"), pluginPID(t, a, "builtin")}
	a.Signal(syscall.SIGTERM)
	code, err := a.Wait(15 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	for _, pid := range pids {
		if testutil.Alive(pid) {
			t.Fatalf("plugin %d alive after a clean exit", pid)
		}
	}
	if !strings.Contains(strings.Join(eventLines(t, events), "|"), "stop /hooks bye") {
		t.Fatal("shutdown did not run the instance's stop hook")
	}
}

func TestDevRefusedInProduction(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(testutil.Bin(t, "pinnedd"), "agent", "--dev", "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "APP_ENV=production")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--dev refused") {
		t.Fatalf("--dev in production: %v\n%s", err, out)
	}
	a := testutil.StartAgent(t, []string{"APP_ENV=prod", "PINBOARD_ALLOW_DEV_IN_PRODUCTION=1"}, "--dev")
	expect(t, a, "POST", "/counters/p/increment", 200, `{"value":1}`)
}

// A second pinnedd on a data dir in use fails at once with a clear error
// (the lock is also what proves a restarted node's predecessor is dead).
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	testutil.StartAgent(t, nil, "--dev", "--data-dir", dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), "agent", "--dev", "--http-addr", "127.0.0.1:0", "--data-dir", dir).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "in use by another pinnedd process") {
		t.Fatalf("second agent on a data dir in use: %v\n%s", err, out)
	}
	if strings.Count(string(out), "in use") != 1 || !strings.Contains(string(out), "held by pid ") {
		t.Fatalf("the error names the holder once: %s", out)
	}
}

// A fleet node refuses a token that cannot guard a fleet, and says how to
// make one; the env template's placeholder is refused too.
func TestWeakTokenRefused(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"x", "CHANGE-ME", "dev-token"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), "agent", "--no-hosts", "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
		cmd.Env = append(os.Environ(), "PINBOARD_TOKEN="+tok)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "pinnedd token generate") {
			t.Fatalf("PINBOARD_TOKEN=%s: %v\n%s", tok, err, out)
		}
	}
}

// kill -9 skips the agent's own cleanup: the next agent clears what it
// left. A dev agent's temporary data dir goes when the next dev agent
// starts; a data dir's plugin sockets go when the node restarts on it.
func TestKill9LeavesNothingBehindNextStart(t *testing.T) {
	t.Parallel()
	// The plugins' account (the suite runs as root) must reach the
	// sockets pinnedd makes in TMPDIR: not a 0700 t.TempDir.
	tmp := testutil.SharedDir(t)
	env := []string{"TMPDIR=" + tmp}
	devDirs := func() []string { m, _ := filepath.Glob(filepath.Join(tmp, "pinnedd-dev-*")); return m }
	kill9 := func(a *testutil.Agent) {
		a.Signal(syscall.SIGKILL)
		if _, err := a.Wait(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	a := testutil.StartAgent(t, env, "--dev")
	first := devDirs()
	if len(first) != 1 {
		t.Fatalf("dev data dirs under TMPDIR: %v", first)
	}
	kill9(a)
	b := testutil.StartAgent(t, env, "--dev")
	if _, err := b.WaitLog(10*time.Second, "removed data dirs of dev agents that are gone"); err != nil {
		t.Fatalf("%v\n%s", err, b.Logs())
	}
	if now := devDirs(); len(now) != 1 || now[0] == first[0] {
		t.Fatalf("dev data dirs after a restart: %v (the killed agent's was %s)", now, first[0])
	}

	dir := filepath.Join(t.TempDir(), "data")
	c := testutil.StartAgent(t, env, "--dev", "--data-dir", dir)
	kill9(c)
	// Plugins run as another account (as root): their sockets are in a
	// directory of their own, through the link in run/ (the data dir is
	// closed to them); else in run/ itself.
	socks, _ := filepath.Glob(filepath.Join(dir, "run", "*.sock"))
	theirs, _ := filepath.Glob(filepath.Join(dir, "run", "sockets", "*", "*.sock"))
	if len(socks)+len(theirs) == 0 {
		t.Fatalf("no plugin socket under %s/run to leave behind", dir)
	}
	d := testutil.StartAgent(t, env, "--dev", "--data-dir", dir)
	if _, err := d.WaitLog(10*time.Second, "removed a dead predecessor's runtime files"); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
}
