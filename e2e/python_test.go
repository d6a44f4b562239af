package e2e

import (
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/faulty"
	"github.com/pinnedd/pinnedd/statestore/memstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
	"github.com/pinnedd/pinnedd/supervisor"
)

// pythonCounterArgs are an agent's flags for the Python counter
// (examples/python/counter) serving /counters in place of the built-in one.
func pythonCounterArgs(t *testing.T) []string {
	t.Helper()
	script, path := testutil.PythonPlugin(t, "examples/python/counter")
	return []string{"--plugin", "/counters=" + script, "--plugin-env", "/counters=PYTHONPATH=" + path}
}

// The Python counter, supervised as a Go plugin is: its value is in the
// store, so increments acknowledged while the plugin is killed -9 under
// load survive, as does the value across kill -9 of pinnedd.
func TestPythonCounterSurvivesKill9(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	args := append([]string{"--dev", "--data-dir", dir}, pythonCounterArgs(t)...)
	a := testutil.StartAgent(t, nil, args...)
	for i := 1; i <= 3; i++ {
		expect(t, a, "POST", "/counters/alice/increment", 200, fmt.Sprintf(`{"value":%d}`, i))
	}
	old := pluginPID(t, a, "counter.py")

	// Increments from four clients while the plugin dies: every one that
	// was acknowledged must be in the value afterwards.
	var acked, tried atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tried.Add(1)
				r, err := testutil.Do(ctx, "POST", a.URL+"/counters/alice/increment", "", nil)
				if err == nil && r.Code == 200 {
					acked.Add(1)
				}
			}
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "increments under load", func() bool { return acked.Load() >= 20 })
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin restarted", func() bool {
		pid := pluginPID(t, a, "counter.py")
		return pid != 0 && pid != old
	})
	before := acked.Load()
	testutil.WaitFor(t, 10*time.Second, "increments after the restart", func() bool { return acked.Load() >= before+20 })
	stop()
	wg.Wait()
	testutil.CheckGone(t, []int{old})

	var v struct{ Value int64 }
	a.MustDo("GET", "/counters/alice/value", "").JSON(t, &v)
	if v.Value < 3+acked.Load() || v.Value > 3+tried.Load() {
		t.Fatalf("value %d after %d acknowledged and %d tried increments (plus 3): an acknowledged increment was lost, or one counted twice",
			v.Value, acked.Load(), tried.Load())
	}
	t.Logf("value %d: %d acknowledged, %d tried", v.Value, acked.Load(), tried.Load())

	// kill -9 pinnedd itself, restart on the same data dir.
	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b := testutil.StartAgent(t, nil, args...)
	expect(t, b, "GET", "/counters/alice/value", 200, fmt.Sprintf(`{"value":%d}`, v.Value))
	expect(t, b, "POST", "/counters/alice/increment", 200, fmt.Sprintf(`{"value":%d}`, v.Value+1))
	expect(t, b, "GET", "/counters/bob/value", 200, `{"value":0}`)
}

// Durable work in a Python host: a run that declared itself applied when
// the plugin was killed -9 is redelivered with resume set, with no client
// request, and finishes; and an instance's cluster call reaches another
// plugin's instance through the node with its process's credential.
func TestPythonWorkResumesAndClusterCalls(t *testing.T) {
	t.Parallel()
	jobs, path := testutil.PythonPlugin(t, "e2e/testdata/pyhost")
	args := append([]string{"--dev", "--data-dir", t.TempDir(), "--plugin", "/jobs=" + jobs,
		"--plugin-env", "/jobs=PYTHONPATH=" + path}, pythonCounterArgs(t)...)
	a := testutil.StartAgent(t, nil, args...)

	type status struct {
		Deliveries []bool
		Steps      int
		Done       bool
	}
	get := func() status {
		var s status
		r := a.MustDo("GET", "/jobs/j1/status", "")
		if r.Code != 200 {
			return status{}
		}
		r.JSON(t, &s)
		return s
	}
	if r := a.MustDo("POST", "/jobs/j1/submit?steps=30", ""); r.Code != 202 {
		t.Fatalf("submit: %d %s", r.Code, r.Body)
	}
	// The plugin's JSON log line is pinnedd's, with its level and fields.
	if _, err := a.WaitLog(10*time.Second, `"level":"WARN"`, `"msg":"job submitted"`, `"steps":30`, `"instance":"/jobs/j1"`, `"plugin":"pyhost.py"`); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the run under way", func() bool {
		s := get()
		return len(s.Deliveries) == 1 && s.Steps >= 2
	})
	old := pluginPID(t, a, "pyhost.py")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// No request comes in: pinnedd re-activates the instance with marked
	// work after the restart, and the SDK redelivers it.
	var final status
	testutil.WaitFor(t, 20*time.Second, "the work redelivered and done", func() bool {
		if pid := pluginPID(t, a, "pyhost.py"); pid == 0 || pid == old {
			return false
		}
		final = get()
		return final.Done
	})
	if len(final.Deliveries) != 2 || final.Deliveries[0] || !final.Deliveries[1] {
		t.Fatalf("deliveries (resume flags) %v, want [false true]", final.Deliveries)
	}
	testutil.CheckGone(t, []int{old})

	for i := 1; i <= 2; i++ {
		r := a.MustDo("POST", "/jobs/j1/call?path=/counters/bob/increment", "")
		want := fmt.Sprintf(`{"status":200,"body":{"value":%d}}`, i)
		if r.Code != 200 || strings.TrimSpace(r.Body) != want {
			t.Fatalf("cluster call: %d %s, want 200 %s", r.Code, r.Body, want)
		}
	}
	expect(t, a, "GET", "/counters/bob/value", 200, `{"value":2}`)
}

// The Python plugin gets least privilege as a Go one does: an agent with
// the deployment token, the database URL and another secret in its
// environment runs it with none of them (nor a cluster-call token), and
// requests written to its data socket by another process are refused
// with 403 and run nothing, whether they lack the secret, carry a wrong
// one, or carry the right one twice.
func TestPythonPluginLeastPrivilege(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	args := append([]string{"--dev", "--data-dir", t.TempDir()}, pythonCounterArgs(t)...)
	a := testutil.StartAgent(t, []string{"DATABASE_URL=" + dsn, "UNRELATED_SECRET=must-not-leak"}, args...)
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":1}`)

	pid := pluginPID(t, a, "counter.py")
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	var socket, secret string
	for _, kv := range strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "PINBOARD_"), k == "DATABASE_URL", k == plugins.EnvClusterCallToken, k == "UNRELATED_SECRET":
			t.Errorf("the Python plugin's environment has %s", k)
		case strings.Contains(v, testutil.Token), strings.Contains(v, dsn), strings.Contains(v, "must-not-leak"):
			t.Errorf("the Python plugin's environment carries a secret in %s", k)
		case k == plugins.EnvDataSocket:
			socket = v
		case k == "PATH":
			secret = "not-" + v // a value the plugin cannot hold as its secret
		}
	}
	if socket == "" {
		t.Fatalf("the Python plugin's environment names no %s", plugins.EnvDataSocket)
	}

	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		name    string
		secrets []string
	}{{"no secret", nil}, {"a wrong secret", []string{secret}}, {"two secrets", []string{secret, secret}}} {
		req, _ := http.NewRequest("POST", "http://plugin/increment", nil)
		req.Header.Set(plugins.HeaderNamespace, "/counters")
		req.Header.Set(plugins.HeaderID, "alice")
		for _, s := range tc.secrets {
			req.Header.Add(plugins.HeaderSocketSecret, s)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("raw write to the data socket with %s: %d %s, want 403", tc.name, resp.StatusCode, body)
		}
	}
	expect(t, a, "GET", "/counters/alice/value", 200, `{"value":1}`)
	expect(t, a, "POST", "/counters/alice/increment", 200, `{"value":2}`)
}

// The Python SDK's own tests (pytest, sdk/python/tests) run with every
// go test ./..., so CI runs them; among them the check that the committed
// gRPC stubs match the .proto files.
func TestPythonSDKUnitTests(t *testing.T) {
	t.Parallel()
	testutil.NeedPython(t)
	cmd := exec.Command(testutil.Python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Dir = filepath.Join("..", "sdk", "python")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pytest: %v\n%s", err, out)
	}
	t.Logf("pytest:\n%s", out)
}

// A hot swap of the Python plugin under load, twice: the old processes
// wind their instances down and exit, no acknowledged increment is lost
// (the final value is exactly the acknowledged count), and clients only
// ever see answers they may retry.
func TestPythonHotSwapUnderLoad(t *testing.T) {
	t.Parallel()
	args := append([]string{"--dev", "--swap-deadline", "2s"}, pythonCounterArgs(t)...)
	a := testutil.StartAgent(t, nil, args...)
	swapTwiceUnderLoad(t, a, "counter.py")
	if n := a.Metric(`pinned_plugin_restarts_total{plugin="counter.py"}`); n != 0 {
		t.Fatalf("the swaps counted as %v crashes", n)
	}
}

// The seed's tutorial 2 against the Python chat (examples/python/chat),
// with the chat's Node clients unchanged: a durable thread on Postgres
// survives SIGTERM and kill -9 of pinnedd; a reply cut off mid-stream
// restarts from its first word under the same message id and completes.
func TestPythonTutorial2DurableChat(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	script, path := testutil.PythonPlugin(t, "examples/python/chat")
	args := []string{"--dev", "--database-url", dsn, "--scan-interval", "200ms", "--plugin", "/threads=" + script,
		"--plugin-env", "/threads=PYTHONPATH=" + path, "--plugin-env", "/threads=CHAT_WORD_DELAY=" + chatWordDelay}
	env := []string{"PINNEDD_DRAIN_DEADLINE=2s", "PINBOARD_TOKEN=" + testutil.Token}
	tutorial2(t, dsn, env, args)
}

// The seed's tutorial 3 against the Python chat: a front door and two
// workers on Postgres; kill -9 of the worker streaming a reply, and the
// survivor finishes it under the same message id once the lease expires.
func TestPythonTutorial3FleetChat(t *testing.T) {
	t.Parallel()
	script, path := testutil.PythonPlugin(t, "examples/python/chat")
	tutorial3(t, []string{"PINBOARD_TOKEN=" + testutil.Token}, "--plugin", "/threads="+script,
		"--plugin-env", "/threads=PYTHONPATH="+path, "--plugin-env", "/threads=CHAT_WORD_DELAY="+chatWordDelay)
}

// The Python SDK's output gate against pinnedd's own Store service (the
// supervisor's, over memstore) whose commits fail or stall on demand:
// e2e/testdata/pygate/pygate.py says what it checks.
func TestPythonOutputGate(t *testing.T) {
	t.Parallel()
	testutil.NeedPython(t)
	store := faulty.New(memstore.New())
	store.SetHook(func(_ context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		switch {
		case faulty.Touches(muts, "t", faulty.SetsField("boom")):
			return errors.New("injected commit failure")
		case faulty.Touches(muts, "t", faulty.SetsField("slow")):
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	})
	socket := filepath.Join(t.TempDir(), "store.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(plugins.StoreServerOptions()...)
	proto.RegisterStoreServer(srv, supervisor.NewStoreServer(store, func(string) bool { return true }))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	sdk, err := filepath.Abs(filepath.Join("..", "sdk", "python"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Python, filepath.Join("testdata", "pygate", "pygate.py"), socket, filepath.Join(sdk, "tests"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(sdk, "src"), "PYTHONDONTWRITEBYTECODE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("pygate.py: %v\n%s%s", err, out, stderr.String())
	}
}
