package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// cliResult is one finished run of the pinnedd binary.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cliEnv is the test process's environment without the variables the CLI
// reads, so each run says exactly what it sets.
func cliEnv(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "PINBOARD_TOKEN", "PINBOARD_TOKEN_FILE", "PINNEDD_ADDR", "PINNEDD_TIMEOUT":
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

// runCLI runs `pinnedd args...` with env added to a clean environment, and
// fails the test if it runs for more than a minute.
func runCLI(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), args...)
	cmd.Env = cliEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	default:
		t.Fatalf("pinnedd %q: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("pinnedd %q ran for a minute: %s", args, res)
	}
	return res
}

// countingServer listens on 127.0.0.1 and counts requests: the address a
// command must NOT reach.
func countingServer(t *testing.T) (url string, hits *atomic.Int64) {
	t.Helper()
	hits = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, `{"error":"decoy"}`, http.StatusTeapot)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), hits
}

type pluginStatus struct {
	Plugins []struct {
		Name        string   `json:"name"`
		PID         int      `json:"pid"`
		Incarnation int      `json:"incarnation"`
		Namespaces  []string `json:"namespaces"`
	} `json:"plugins"`
}

func counterPID(t *testing.T, a *testutil.Agent) int {
	var st pluginStatus
	a.MustDo("GET", "/_pinned/status", "").JSON(t, &st)
	for _, p := range st.Plugins {
		for _, ns := range p.Namespaces {
			if ns == "/counters" {
				return p.PID
			}
		}
	}
	t.Fatalf("no plugin serves /counters: %+v", st)
	return 0
}

// TestCLIAgainstDevAgent runs the CLI binary against one real --dev agent:
// flags after arguments reach the agent they name, errors exit non-zero
// with the agent's words, and token-less calls work on a dev node.
func TestCLIAgainstDevAgent(t *testing.T) {
	a := testutil.StartAgent(t, nil, "--dev")
	hostPort := strings.TrimPrefix(a.URL, "http://")
	token := "PINBOARD_TOKEN=" + testutil.Token

	t.Run("reload with --addr after the namespace reaches the named agent", func(t *testing.T) {
		// The decoy is the address a dropped --addr would fall back to.
		decoy, hits := countingServer(t)
		if r := a.MustDo("POST", "/counters/x/increment", ""); r.Code != 200 {
			t.Fatalf("increment: %d %s", r.Code, r.Body)
		}
		before := counterPID(t, a)
		r := runCLI(t, []string{token, "PINNEDD_ADDR=" + decoy}, "plugins", "reload", "/counters", "--addr", a.URL)
		if r.code != 0 || !strings.Contains(r.stdout, "reloaded") {
			t.Fatalf("plugins reload /counters --addr %s: %s", a.URL, r)
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("the reload went to the default address (%d requests), not to --addr", n)
		}
		testutil.WaitFor(t, 20*time.Second, "a new /counters plugin process", func() bool {
			pid := counterPID(t, a)
			return pid != 0 && pid != before
		})
	})

	t.Run("flags before the command reach the agent they name", func(t *testing.T) {
		decoy, hits := countingServer(t)
		r := runCLI(t, []string{token, "PINNEDD_ADDR=" + decoy}, "--addr", a.URL, "--timeout", "20s", "plugins", "list", "--json")
		if r.code != 0 || !strings.Contains(r.stdout, `"plugins"`) || hits.Load() != 0 {
			t.Fatalf("pinnedd --addr %s plugins list --json: %s (decoy hit %d times)", a.URL, r, hits.Load())
		}
	})

	t.Run("host:port as --addr, flags after", func(t *testing.T) {
		r := runCLI(t, []string{token}, "workers", "--json", "--addr", hostPort)
		if r.code != 0 || !strings.Contains(r.stdout, `"workers"`) {
			t.Fatalf("workers --addr %s: %s", hostPort, r)
		}
		port := hostPort[strings.LastIndex(hostPort, ":"):]
		if r := runCLI(t, []string{token}, "status", "--addr", port); r.code != 0 {
			t.Fatalf("status --addr %s: %s", port, r)
		}
	})

	t.Run("remove of an unknown node fails", func(t *testing.T) {
		r := runCLI(t, []string{token}, "remove", "nosuchnode", "--addr", a.URL)
		if r.code == 0 || strings.Contains(r.stdout, "removed") {
			t.Fatalf("remove nosuchnode succeeded: %s", r)
		}
		if !strings.Contains(r.stderr, "no member named") || !strings.Contains(r.stderr, "404") {
			t.Fatalf("remove nosuchnode does not say there is no such member: %s", r)
		}
	})

	t.Run("wrong token gets 401 and the hint", func(t *testing.T) {
		// The front door's own 401 names the fix already; raftstore's (members)
		// gets the CLI's hint.
		for _, args := range [][]string{{"workers"}, {"members"}, {"status", "--token", "not-the-token"}} {
			r := runCLI(t, []string{"PINBOARD_TOKEN=not-the-token"}, append(args, "--addr", a.URL)...)
			if r.code == 0 || !strings.Contains(r.stderr, "401") || !strings.Contains(r.stderr, "PINBOARD_TOKEN") || !strings.Contains(r.stderr, "--token") {
				t.Fatalf("%s with a wrong token: %s", args[0], r)
			}
		}
	})

	t.Run("plugins list --json", func(t *testing.T) {
		r := runCLI(t, []string{token}, "plugins", "list", "--json", "--addr", a.URL)
		var out pluginStatus
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || len(out.Plugins) == 0 || out.Plugins[0].PID == 0 {
			t.Fatalf("plugins list --json: %s", r)
		}
	})

	t.Run("status says the node is dev", func(t *testing.T) {
		r := runCLI(t, []string{token}, "status", "--addr", a.URL)
		if r.code != 0 {
			t.Fatalf("status: %s", r)
		}
		if !strings.Contains(r.stdout, "mode") || !strings.Contains(strings.Fields(lineWith(r.stdout, "mode"))[1], "dev") {
			t.Fatalf("status has no mode dev line: %s", r)
		}
	})

	t.Run("a dev node needs no token from loopback", func(t *testing.T) {
		for _, args := range [][]string{{"status"}, {"workers"}, {"members"}} {
			if r := runCLI(t, nil, append(args, "--addr", a.URL)...); r.code != 0 {
				t.Fatalf("%s without a token on a dev node: %s", args[0], r)
			}
		}
	})

	t.Run("unknown namespace and client id fail with the agent's message", func(t *testing.T) {
		r := runCLI(t, []string{token}, "wind-down", "/nope", "x", "--addr", a.URL)
		if r.code == 0 || !strings.Contains(r.stderr, "404") {
			t.Fatalf("wind-down /nope x: %s", r)
		}
		r = runCLI(t, []string{token}, "drain", "--node", "no-such-client", "--addr", a.URL, "--cordon")
		if r.code == 0 || !strings.Contains(r.stderr, "404") {
			t.Fatalf("drain --node no-such-client: %s", r)
		}
	})

	t.Run("drain and undrain by node id", func(t *testing.T) {
		st := getStatusView(t, a)
		r := runCLI(t, []string{token}, "drain", st.NodeID, "--cordon", "--addr", a.URL)
		if r.code != 0 || strings.TrimSpace(r.stdout) != "drain set on node "+st.NodeID {
			t.Fatalf("drain %s --cordon: %s", st.NodeID, r)
		}
		testutil.WaitFor(t, 10*time.Second, "status says cordoned by the operator", func() bool {
			r := runCLI(t, []string{token}, "status", "--addr", a.URL)
			return strings.Contains(lineWith(r.stdout, "worker"), "draining (operator, cordoned)")
		})
		r = runCLI(t, []string{token}, "undrain", st.NodeID, "--addr", a.URL)
		if r.code != 0 || strings.TrimSpace(r.stdout) != "undrained node "+st.NodeID {
			t.Fatalf("undrain %s: %s", st.NodeID, r)
		}
		testutil.WaitFor(t, 10*time.Second, "status no longer draining", func() bool {
			r := runCLI(t, []string{token}, "status", "--addr", a.URL)
			return r.code == 0 && !strings.Contains(r.stdout, "draining")
		})
		r = runCLI(t, []string{token}, "drain", "no-such-node", "--addr", a.URL, "--cordon")
		if r.code != 1 || !strings.Contains(r.stderr, `unknown node id "no-such-node"`) {
			t.Fatalf("drain no-such-node: %s", r)
		}
	})

	t.Run("a bad id or namespace fails with the agent's reason, in the characters typed", func(t *testing.T) {
		for args, want := range map[[2]string]string{
			{"/counters", "héllo"}: `answered 400: invalid id "héllo": character 'é' not allowed`,
			{"/Counters", "x"}:     `answered 400: invalid namespace "/Counters": only a-z, 0-9, - and _ after the slash`,
		} {
			r := runCLI(t, []string{token}, "wind-down", args[0], args[1], "--addr", a.URL)
			if r.code == 0 || !strings.Contains(r.stderr, want) {
				t.Fatalf("wind-down %s %s: %s\nwant stderr with: %s", args[0], args[1], r, want)
			}
		}
		r := runCLI(t, []string{token}, "plugins", "reload", "/Nope", "--addr", a.URL)
		if want := `answered 400: invalid namespace "/Nope"`; r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Fatalf("plugins reload /Nope: %s\nwant stderr with: %s", r, want)
		}
	})

	t.Run("leave of the only voter fails and the node stays", func(t *testing.T) {
		r := runCLI(t, []string{token}, "leave", "--addr", a.URL, "--deadline", "1s")
		if r.code == 0 || !strings.Contains(r.stderr, "409") || strings.Contains(r.stdout, "left") {
			t.Fatalf("leave of a one-node cluster: %s", r)
		}
		if r := a.MustDo("GET", "/healthz", ""); r.Code != 200 {
			t.Fatalf("the node stopped: %d", r.Code)
		}
	})

	t.Run("usage errors change nothing and reach no agent", func(t *testing.T) {
		decoy, hits := countingServer(t)
		for _, args := range [][]string{
			{"drain", "--cordon", "--deadline", "10s"},
			{"drain", "--deadline=-5s"},
			{"wind-down", "/counters", "--deadline=-5s"},
			{"wind-down", "/counters", ""}, // an unset $ID: not the whole namespace
			{"drain", "", "--cordon"},      // an unset $NODE: not this agent
			{"undrain", ""},
			{"drain", "n1", "--node", "c1"},
			{"drain", "n1", "n2"},
			{"undrain", "n1", "--node", "c1"},
			{"plugins", "reload", "/counters", "--adr", a.URL},
			{"stauts"},
			{"status", "--addr", "ftp://x"},
		} {
			r := runCLI(t, []string{token, "PINNEDD_ADDR=" + decoy}, args...)
			if r.code != 2 || r.stderr == "" {
				t.Fatalf("pinnedd %q: %s; want exit 2 with a message", args, r)
			}
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("usage errors sent %d requests", n)
		}
	})
}

func getStatusView(t *testing.T, a *testutil.Agent) statusView {
	t.Helper()
	var st statusView
	a.MustDo("GET", "/_pinned/status", "").JSON(t, &st)
	if st.NodeID == "" {
		t.Fatalf("status without a node id: %+v", st)
	}
	return st
}

func lineWith(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return prefix + " <none>"
}

// TestRefusedThenListening: a command started before its agent listens
// rides out the refused connections. The listener opens only after the CLI
// reported its first refusal, so the retry is what the test sees.
func TestRefusedThenListening(t *testing.T) {
	addr := testutil.FreeAddr(t)
	cmd := exec.Command(testutil.Bin(t, "pinnedd"), "status", "--json", "--addr", addr)
	cmd.Env = cliEnv(nil)
	var stdout, stderr testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	// stdin is not a terminal (exec gives /dev/null): the full window, so a
	// script may start an agent and call it at once.
	testutil.WaitFor(t, 10*time.Second, "the CLI reports a refused connection", func() bool {
		return strings.Contains(stderr.String(), "refused the connection; retrying for up to 10s")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_pinned/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"nodeId": "late-node"})
	})}
	go srv.Serve(ln)
	defer srv.Close()
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil || !strings.Contains(stdout.String(), "late-node") {
			t.Fatalf("status once the agent listened: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the CLI did not finish once the address listened\nstderr: %s", stderr.String())
	}
}

// TestNothingListens: with nothing ever listening, the retry is bounded and
// the error names the address.
func TestNothingListens(t *testing.T) {
	addr := testutil.FreeAddr(t)
	start := time.Now()
	r := runCLI(t, nil, "members", "--addr", addr, "--timeout", "1s")
	if r.code == 0 || !strings.Contains(r.stderr, "cannot reach the agent at http://"+addr) {
		t.Fatalf("members against nothing: %s", r)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("gave up after %s, want about --timeout (1s)", el)
	}
}

// TestNothingListensOnATerminal: typed at a prompt (stdin a terminal), a
// command against an address where nothing listens gives up after the short
// window, not the 10 s a script gets.
func TestNothingListensOnATerminal(t *testing.T) {
	tty := openPTY(t)
	addr := testutil.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), "status", "--addr", addr)
	cmd.Env = cliEnv(nil)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	el := time.Since(start)
	if err == nil || !strings.Contains(stderr.String(), "retrying for up to 2s") || !strings.Contains(stderr.String(), "connection refused for 2s") {
		t.Fatalf("status against nothing, on a terminal: %v\nstderr: %s", err, stderr.String())
	}
	if el > 8*time.Second {
		t.Fatalf("gave up after %s on a terminal, want about 2s", el)
	}
}

// openPTY opens a pseudo-terminal and returns its terminal side, closed with
// the test.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the pty's terminal side: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

// TestTimeoutSilentPeer: a peer that accepts and never answers fails the
// command after --timeout, saying so.
func TestTimeoutSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				<-stop // hold the connection, answer nothing
				c.Close()
			}()
		}
	}()
	defer func() {
		ln.Close()
		close(stop)
		conns.Wait()
	}()
	for _, args := range [][]string{
		{"status", "--addr", ln.Addr().String(), "--timeout", "1s"},
		{"members", "--timeout=1s", "--addr", ln.Addr().String()}, // through raftstore's client
	} {
		start := time.Now()
		r := runCLI(t, nil, args...)
		el := time.Since(start)
		if r.code == 0 || !strings.Contains(r.stderr, "did not answer within 1s") {
			t.Fatalf("pinnedd %q against a silent peer: %s", args, r)
		}
		if el > 15*time.Second {
			t.Fatalf("pinnedd %q gave up after %s, want about 1s", args, el)
		}
	}
}

// TestVersionStamp: a binary built in this checkout names its build, and
// -ldflags -X main.version overrides it.
func TestVersionStamp(t *testing.T) {
	r := runCLI(t, nil, "--version")
	if r.code != 0 || strings.Contains(r.stdout, "version dev\n") || strings.TrimSpace(r.stdout) == "pinnedd version" {
		t.Fatalf("pinnedd --version: %s", r)
	}
	bin := filepath.Join(t.TempDir(), "pinnedd")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v1.2.3", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--version"}, {"version"}, {"-v"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil || string(out) != "pinnedd v1.2.3\n" {
			t.Fatalf("pinnedd %q with -X main.version=v1.2.3: %q, %v; want one line, the same for every form", args, out, err)
		}
	}
}

// TestTokenGenerate: stdout is the token and nothing else.
func TestTokenGenerate(t *testing.T) {
	r := runCLI(t, nil, "token", "generate")
	tok := strings.TrimSuffix(r.stdout, "\n")
	if r.code != 0 || strings.ContainsAny(tok, " \n") || validateToken(tok) != nil || r.stderr != "" {
		t.Fatalf("token generate: %s", r)
	}
}

// TestCompletionScripts: each script is printed and names pinnedd's
// completion hook; the hook answers with the commands.
func TestCompletionScripts(t *testing.T) {
	for _, sh := range []string{"bash", "zsh"} {
		r := runCLI(t, nil, "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "--generate-bash-completion") {
			t.Fatalf("completion %s: %s", sh, r)
		}
	}
	r := runCLI(t, nil, "--generate-bash-completion")
	for _, cmd := range []string{"status", "wind-down", "plugins", "leave"} {
		if !strings.Contains(r.stdout, cmd+"\n") {
			t.Fatalf("completion candidates lack %s: %s", cmd, r)
		}
	}
	// The bash script itself, as a shell that sourced it completes; no
	// completion runs a command (the decoy is where one would go).
	decoy, hits := countingServer(t)
	script := `source <(pinnedd completion bash)
COMP_WORDS=(pinnedd plugins re); COMP_CWORD=2; _pinnedd_complete; echo "${COMPREPLY[@]}"
COMP_WORDS=(pinnedd wind-down /threads --dead); COMP_CWORD=3; _pinnedd_complete; echo "${COMPREPLY[@]}"
COMP_WORDS=(pinnedd status --); COMP_CWORD=2; _pinnedd_complete; echo "${COMPREPLY[@]}"
COMP_WORDS=(pinnedd --addr x pl); COMP_CWORD=3; _pinnedd_complete; echo "${COMPREPLY[@]}"
COMP_WORDS=(pinnedd status -- ""); COMP_CWORD=3; _pinnedd_complete; echo "[${COMPREPLY[@]}]"`
	bash := exec.Command("bash", "-c", script)
	bash.Env = cliEnv([]string{"PATH=" + filepath.Dir(testutil.Bin(t, "pinnedd")) + ":" + os.Getenv("PATH"), "PINNEDD_ADDR=" + decoy})
	out, err := bash.CombinedOutput()
	want := "reload remove\n--deadline\n--addr --token --token-file --timeout --ca --insecure --json --help\nplugins\n[]\n"
	if err != nil || string(out) != want {
		t.Fatalf("bash completion: %v\n%s\nwant:\n%s", err, out, want)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("completing a line ran it: %d requests reached the agent", n)
	}
}

// TestLeaveWaitsForExit: `pinnedd leave` says what the node does, and
// returns once it has left and exited (0); the cluster keeps the others.
func TestLeaveWaitsForExit(t *testing.T) {
	env := []string{"PINBOARD_TOKEN=" + testutil.Token}
	node := func(id string, extra ...string) *testutil.Agent {
		args := append([]string{
			"--node-id", id, "--http-addr", testutil.FreeAddr(t), "--raft-addr", testutil.FreeAddr(t),
			"--data-dir", filepath.Join(t.TempDir(), id), "--plugin", "/counters=" + testutil.Bin(t, "counter"),
			"--raft-timeout", "300ms", "--local-state",
		}, extra...)
		return testutil.StartAgent(t, env, args...)
	}
	n1 := node("n1", "--bootstrap")
	n2 := node("n2", "--join", n1.URL)
	testutil.WaitFor(t, 20*time.Second, "n2 a member", func() bool {
		r := runCLI(t, env, "members", "--json", "--addr", n1.URL)
		return r.code == 0 && strings.Contains(r.stdout, `"n2"`)
	})
	r := runCLI(t, env, "leave", "--deadline", "1s", "--addr", strings.TrimPrefix(n2.URL, "http://"))
	want := "n2 is leaving: draining (deadline 1s), then it leaves the cluster and exits\nn2 left the cluster\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("leave: %s\nwant stdout:\n%s", r, want)
	}
	if code, err := n2.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("n2 after leave: exit %d, %v", code, err)
	}
	r = runCLI(t, env, "members", "--json", "--addr", n1.URL)
	if r.code != 0 || strings.Contains(r.stdout, `"n2"`) {
		t.Fatalf("members after n2 left: %s", r)
	}
}

// TestTokenFile: the agent and the CLI read the token from --token-file (or
// PINBOARD_TOKEN_FILE), trimmed, so it never shows on a command line (ps);
// given together with --token or PINBOARD_TOKEN, or empty, it is refused.
func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  "+testutil.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	agentArgs := func(extra ...string) []string {
		return append([]string{
			"--node-id", "n1", "--http-addr", testutil.FreeAddr(t), "--raft-addr", testutil.FreeAddr(t),
			"--data-dir", filepath.Join(t.TempDir(), "n1"), "--bootstrap", "--no-hosts", "--local-state",
			"--raft-timeout", "300ms",
		}, extra...)
	}
	// testutil gives every agent PINBOARD_TOKEN; the last value wins.
	a := testutil.StartAgent(t, []string{"PINBOARD_TOKEN="}, agentArgs("--token-file", file)...)
	if r := runCLI(t, nil, "members", "--json", "--addr", a.URL, "--token-file", file); r.code != 0 || !strings.Contains(r.stdout, `"n1"`) {
		t.Fatalf("members --token-file: %s", r)
	}
	if r := runCLI(t, []string{"PINBOARD_TOKEN_FILE=" + file}, "members", "--json", "--addr", a.URL); r.code != 0 {
		t.Fatalf("members with PINBOARD_TOKEN_FILE: %s", r)
	}
	if r := runCLI(t, nil, "members", "--addr", a.URL); r.code == 0 || !strings.Contains(r.stderr, "401") {
		t.Fatalf("members without a token: %s", r)
	}
	for name, c := range map[string]struct {
		env  []string
		args []string
		want string
	}{
		"CLI, --token too":          {nil, []string{"members", "--addr", a.URL, "--token-file", file, "--token", "x"}, "use one"},
		"CLI, PINBOARD_TOKEN too":   {[]string{"PINBOARD_TOKEN=x"}, []string{"members", "--addr", a.URL, "--token-file", file}, "use one"},
		"CLI, an empty file":        {nil, []string{"members", "--addr", a.URL, "--token-file", empty}, "is empty"},
		"CLI, no such file":         {nil, []string{"members", "--addr", a.URL, "--token-file", filepath.Join(dir, "nope")}, "no such file"},
		"agent, --token too":        {nil, append([]string{"agent"}, agentArgs("--token-file", file, "--token", testutil.Token)...), "use one"},
		"agent, PINBOARD_TOKEN too": {[]string{"PINBOARD_TOKEN=" + testutil.Token}, append([]string{"agent"}, agentArgs("--token-file", file)...), "use one"},
		"agent, an empty file":      {nil, append([]string{"agent"}, agentArgs("--token-file", empty)...), "is empty"},
	} {
		if r := runCLI(t, c.env, c.args...); r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: %s\nwant an error with %q", name, r, c.want)
		}
	}
}
