// Package testutil starts real pinnedd processes for tests: it builds the
// binaries once per test process, runs agents on ports chosen by the
// kernel, reads their JSON logs, and proves afterwards that no process they
// started is left behind.
package testutil

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu   sync.Mutex
	buildDir  string
	buildErr  error
	buildDone = map[string]error{}
)

// binPkgs are the binaries Bin builds, by name.
var binPkgs = map[string]string{
	"pinnedd":  "./pinnedd",
	"testhost": "./internal/testhost",
	"counter":  "./examples/counter/cmd/counter",
}

// Bin returns the path of a binary built from the module: "pinnedd",
// "testhost" or "counter". Each is built once per test process, when first
// asked for: a test of plugins alone does not need pinnedd to build.
func Bin(t testing.TB, name string) string {
	t.Helper()
	pkg, ok := binPkgs[name]
	if !ok {
		t.Fatalf("testutil.Bin: no binary %q", name)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" && buildErr == nil {
		buildDir, buildErr = os.MkdirTemp("", "pinnedd-bin-")
		if buildErr == nil {
			// MkdirTemp makes it 0700. The tests run as root, and a root
			// pinnedd runs its plugins as another account
			// (pinnedd-plugin or nobody), which must be able to execute
			// them: every account may enter, only root may write.
			buildErr = os.Chmod(buildDir, 0o755)
		}
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	out := filepath.Join(buildDir, name)
	err, built := buildDone[name]
	if !built {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = moduleRoot()
		if b, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build %s: %w\n%s", pkg, berr, b)
		}
		buildDone[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Agent is a running `pinnedd agent` process.
type Agent struct {
	t   testing.TB
	Cmd *exec.Cmd
	URL string // https:// for a front door with --http-tls-cert
	// Client, if set, is what Do sends with (an HTTPS front door's test
	// sets one trusting its CA); nil: http.DefaultClient.
	Client *http.Client
	logs   *logBuffer
	done   chan struct{}
	err    error // from Wait, valid after done
}

// Token is the deployment token every agent a test starts gets (an env
// entry of the test's own overrides it), and what Do and CLI send: strong
// enough for a fleet node, which refuses a weak one.
const Token = "pinnedd-test-token-0123456789abcdef"

// StartAgent is LaunchAgent followed by WaitReady: the node serves.
func StartAgent(t testing.TB, env []string, args ...string) *Agent {
	t.Helper()
	return StartAgentBin(t, Bin(t, "pinnedd"), env, args...)
}

// StartAgentBin is StartAgent with another pinnedd binary (a benchmark
// comparing two builds).
func StartAgentBin(t testing.TB, bin string, env []string, args ...string) *Agent {
	t.Helper()
	a := LaunchAgentBin(t, bin, env, args...)
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("pinnedd not ready: %v\n%s", err, a.Logs())
	}
	return a
}

// WaitReady polls /readyz until it answers 200.
func (a *Agent) WaitReady(timeout time.Duration) error {
	return Eventually(timeout, func() bool {
		r, err := a.Do(http.MethodGet, "/readyz", "")
		return err == nil && r.Code == http.StatusOK
	})
}

// LaunchAgent runs `pinnedd agent` with args plus --http-addr 127.0.0.1:0
// (unless args set it) and JSON logs, and waits until the front door
// listens. The test's cleanup stops it (SIGTERM, then SIGKILL) and checks
// that none of its plugin processes survive.
func LaunchAgent(t testing.TB, env []string, args ...string) *Agent {
	t.Helper()
	return LaunchAgentBin(t, Bin(t, "pinnedd"), env, args...)
}

// LaunchAgentBin is LaunchAgent with another pinnedd binary.
func LaunchAgentBin(t testing.TB, bin string, env []string, args ...string) *Agent {
	t.Helper()
	return launch(t, agentCommand(t, bin, args), env, "pinnedd")
}

// StartAgentAs is StartAgent with the agent run as cred's user: a pinnedd
// that is not root, as the non-root systemd unit runs it.
func StartAgentAs(t testing.TB, cred *syscall.Credential, env []string, args ...string) *Agent {
	t.Helper()
	cmd := agentCommand(t, Bin(t, "pinnedd"), args)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	a := launch(t, cmd, env, "pinnedd")
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("pinnedd not ready: %v\n%s", err, a.Logs())
	}
	return a
}

// StartAgentAt is StartAgent with dir as the agent's working directory (a
// relative --data-dir, as an operator types it).
func StartAgentAt(t testing.TB, dir string, env []string, args ...string) *Agent {
	t.Helper()
	a := LaunchAgentAt(t, dir, env, args...)
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("pinnedd not ready: %v\n%s", err, a.Logs())
	}
	return a
}

// LaunchAgentAt is LaunchAgent with dir as the agent's working directory.
func LaunchAgentAt(t testing.TB, dir string, env []string, args ...string) *Agent {
	t.Helper()
	cmd := agentCommand(t, Bin(t, "pinnedd"), args)
	cmd.Dir = dir
	return launch(t, cmd, env, "pinnedd")
}

// agentCommand is `bin agent` with args, the test's added ones, and
// --http-addr 127.0.0.1:0 unless args set it.
func agentCommand(t testing.TB, bin string, args []string) *exec.Cmd {
	full := agentArgs(append(args, addedArgs(t)...))
	if !hasFlag(args, "--http-addr") {
		full = append(full, "--http-addr", "127.0.0.1:0")
	}
	return exec.Command(bin, full...)
}

// added holds AddAgentArgs' arguments, by test name.
var added sync.Map

// AddAgentArgs makes every agent t and its subtests launch run with args
// added (a suite run again in another mode: --fast-path=false). Safe with
// parallel tests: it keys on t's name.
func AddAgentArgs(t testing.TB, args ...string) {
	added.Store(t.Name(), args)
	t.Cleanup(func() { added.Delete(t.Name()) })
}

// addedArgs are the AddAgentArgs arguments for t: its own and its parents'.
func addedArgs(t testing.TB) []string {
	var out []string
	name := t.Name()
	added.Range(func(k, v any) bool {
		if p := k.(string); name == p || strings.HasPrefix(name, p+"/") {
			out = append(out, v.([]string)...)
		}
		return true
	})
	return out
}

// AddedAgentArg reports whether AddAgentArgs gave t's agents arg.
func AddedAgentArg(t testing.TB, arg string) bool { return slices.Contains(addedArgs(t), arg) }

// agentArgs is `agent` with JSON debug logs, then args, then a short drain
// deadline unless args set one.
func agentArgs(args []string) []string {
	full := append([]string{"agent", "--log-format", "json", "--log-level", "debug"}, args...)
	if !hasFlag(args, "--drain-deadline") {
		// Tests stop agents a lot; 30 s drains would dominate the suite.
		full = append(full, "--drain-deadline", "2s")
	}
	return full
}

// launch starts cmd, a pinnedd agent (what names it in failures), with env
// added, and waits until its front door listens. The test's cleanup stops
// it and checks its plugin processes are gone.
func launch(t testing.TB, cmd *exec.Cmd, env []string, what string) *Agent {
	t.Helper()
	cmd.Env = append(append(os.Environ(), "PINBOARD_TOKEN="+Token), env...)
	logs := &logBuffer{name: t.Name(), notify: make(chan struct{}, 1)}
	cmd.Stderr = logs
	cmd.Stdout = logs
	// A test binary killed before its cleanup (a timeout, ^C) must not
	// leave a fleet running: the agent dies with it, its plugins with the
	// agent.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	a := &Agent{t: t, Cmd: cmd, logs: logs, done: make(chan struct{})}
	go func() { a.err = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() { a.stopForCleanup() })

	line, err := a.WaitLog(30*time.Second, `"msg":"front door listening"`)
	if err != nil {
		t.Fatalf("%s did not start: %v\n%s", what, err, logs.String())
	}
	var rec struct {
		Addr      string `json:"addr"`
		Advertise string `json:"advertise_url"`
	}
	if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Addr == "" {
		t.Fatalf("parse listen line %q: %v", line, err)
	}
	scheme := "http"
	if strings.HasPrefix(rec.Advertise, "https:") {
		scheme = "https"
	}
	a.URL = scheme + "://" + rec.Addr
	return a
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// PID of the agent process.
func (a *Agent) PID() int { return a.Cmd.Process.Pid }

// Logs returns everything the agent logged so far.
func (a *Agent) Logs() string { return a.logs.String() }

// WaitLog waits for a log line containing every one of subs and returns it.
func (a *Agent) WaitLog(timeout time.Duration, subs ...string) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if line, ok := a.logs.find(subs); ok {
			return line, nil
		}
		select {
		case <-a.done:
			if line, ok := a.logs.find(subs); ok {
				return line, nil
			}
			return "", fmt.Errorf("agent exited (%v) before logging %q", a.err, subs)
		case <-a.logs.notify:
		case <-time.After(time.Until(deadline)):
			return "", fmt.Errorf("no log line with %q within %s", subs, timeout)
		}
	}
}

// Signal sends sig to the agent.
func (a *Agent) Signal(sig syscall.Signal) { _ = a.Cmd.Process.Signal(sig) }

// Wait waits for the agent to exit and returns its exit code.
func (a *Agent) Wait(timeout time.Duration) (int, error) {
	select {
	case <-a.done:
		if a.Cmd.ProcessState == nil {
			return -1, a.err
		}
		return a.Cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("agent still running after %s", timeout)
	}
}

func (a *Agent) stopForCleanup() {
	pid := a.PID()
	select {
	case <-a.done:
	default:
		a.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			a.t.Errorf("agent %d ignored SIGTERM for 20s; killing\n%s", pid, a.Logs())
			_ = a.Cmd.Process.Kill()
			<-a.done
		}
	}
	// Plugins die with their agent (Pdeathsig); give the kernel a moment.
	if err := Eventually(5*time.Second, func() bool { return len(ChildrenOf(pid)) == 0 }); err != nil {
		left := ChildrenOf(pid)
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		a.t.Errorf("plugin processes of agent %d outlived it: %v", pid, left)
	}
	if a.t.Failed() {
		a.t.Log(a.saveLogs(pid))
	}
}

// saveLogs writes a failed test's agent logs to a file and says where,
// with their last lines. Not the whole log inline: several agents' logs
// bury the failure message above them, and CI shows only the output's tail.
func (a *Agent) saveLogs(pid int) string {
	logs := a.Logs()
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	tail := lines[max(0, len(lines)-5):]
	dir := filepath.Join(os.TempDir(), "pinnedd-test-logs", strings.ReplaceAll(a.t.Name(), "/", "_"))
	path := filepath.Join(dir, fmt.Sprintf("agent-%d.log", pid))
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(path, []byte(logs), 0o644)
	}
	if err != nil {
		return fmt.Sprintf("agent %d logs (not saved: %v):\n%s", pid, err, logs)
	}
	return fmt.Sprintf("agent %d: %d log lines in %s; the last:\n%s", pid, len(lines), path, strings.Join(tail, "\n"))
}

// ChildrenOf lists live processes started by the pinnedd with this pid: it
// stamps PINNEDD_PARENT_PID into every plugin's environment, which still
// identifies them after they were re-parented.
func ChildrenOf(pid int) []int {
	want := []byte("PINNEDD_PARENT_PID=" + strconv.Itoa(pid) + "\x00")
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && isZombie(stat) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// Goroutines returns the stack of every goroutine in the process, one
// string each, for tests that look for a goroutine by what it runs.
func Goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// GoroutineWith reports whether some goroutine's stack contains every one
// of subs (function names, a wait reason such as "[IO wait").
func GoroutineWith(subs ...string) bool {
	for _, g := range Goroutines() {
		all := true
		for _, sub := range subs {
			all = all && strings.Contains(g, sub)
		}
		if all {
			return true
		}
	}
	return false
}

// CheckGone fails t for each of pids still running: processes whose
// owner was just stopped (a supervisor's plugins).
func CheckGone(t testing.TB, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if Alive(pid) {
			t.Errorf("process %d alive after its owner stopped", pid)
		}
	}
}

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !isZombie(stat)
}

// Eventually polls cond every 20ms until it holds or timeout passes.
func Eventually(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met within %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitFor is Eventually that fails the test, saying what did not happen.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Eventually(timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// WaitForErr is WaitFor for a condition that says why it does not hold
// yet: it polls until cond returns nil, and the failure names cond's last
// error.
func WaitForErr(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	var last error
	if err := Eventually(timeout, func() bool { last = cond(); return last == nil }); err != nil {
		t.Fatalf("%s: %v: %v", what, err, last)
	}
}

// Response is a finished HTTP exchange.
type Response struct {
	Code   int
	Header http.Header
	Body   string
	Proto  string // HTTP/1.1, HTTP/2.0
}

// JSON decodes the body into v.
func (r Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.Body), v); err != nil {
		t.Fatalf("decode %q: %v", r.Body, err)
	}
}

// JSONErr decodes the body into v, returning the error.
func (r Response) JSONErr(v any) error { return json.Unmarshal([]byte(r.Body), v) }

// Do sends a request to the agent (path relative to its URL) with the dev
// token, and reads the whole answer.
func (a *Agent) Do(method, path, body string) (Response, error) {
	c := a.Client
	if c == nil {
		c = http.DefaultClient
	}
	return DoWith(context.Background(), c, method, a.URL+path, body, map[string]string{"Authorization": "Bearer " + Token})
}

// Do sends one request and reads the whole answer, within 30 s unless ctx
// says otherwise: a test must fail, not hang, when a node stops answering.
func Do(ctx context.Context, method, url, body string, headers map[string]string) (Response, error) {
	return DoWith(ctx, http.DefaultClient, method, url, body, headers)
}

// DoWith is Do through client. A "Host" in headers is the request's Host.
func DoWith(ctx context.Context, client *http.Client, method, url, body string, headers map[string]string) (Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Response{}, err
	}
	for k, v := range headers {
		if strings.EqualFold(k, "Host") {
			req.Host = v // net/http sends req.Host, not a Host header
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Response{Code: resp.StatusCode, Header: resp.Header, Body: string(b), Proto: resp.Proto}, err
}

// MustDo is Do that fails the test on a transport error.
func (a *Agent) MustDo(method, path, body string) Response {
	a.t.Helper()
	r, err := a.Do(method, path, body)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// Metric returns the value of the sample whose line starts with prefix
// (name plus labels, e.g. `pinned_activations_total{namespace="/slow"}`),
// or 0 if absent.
func (a *Agent) Metric(prefix string) float64 {
	a.t.Helper()
	r := a.MustDo(http.MethodGet, "/metrics", "")
	sc := bufio.NewScanner(strings.NewReader(r.Body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

// logBuffer keeps an agent's output and wakes waiters on each write.
type logBuffer struct {
	name   string
	mu     sync.Mutex
	buf    bytes.Buffer
	notify chan struct{}
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) find(subs []string) (string, bool) {
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				all = false
				break
			}
		}
		if all && line != "" {
			return line, true
		}
	}
	return "", false
}

// FreeAddr returns a loopback address nothing listens on, for a node that
// must come back on the same address after a restart (a Raft member's
// address is part of the cluster's configuration); everything else listens
// on :0 directly. The port comes from below the kernel's ephemeral range:
// a port the kernel hands out for :0 and is then released can be taken by
// any outgoing connection before the node binds it (seen in CI as "address
// already in use"), while ports below the range are only ever taken by an
// explicit bind. A port is handed out once across every test process on
// the machine (go test runs packages in parallel): FreeAddr holds a lock
// on a file named after it (under portLockDir) until the process ends.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func freeAddr() (string, error) {
	lo, hi := freePorts()
	freeMu.Lock()
	defer freeMu.Unlock()
	for range 1000 {
		port := lo + rand.IntN(hi-lo)
		if freeHeld[port] != nil {
			continue
		}
		lock, ok := lockPort(port)
		if !ok {
			continue // another test process has it
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			lock.Close()
			continue // someone else's
		}
		ln.Close()
		freeHeld[port] = lock
		return addr, nil
	}
	return "", fmt.Errorf("testutil: no free port in [%d, %d) after 1000 tries", lo, hi)
}

// lockPort takes the machine-wide claim on port: an exclusive flock on
// its file, which the kernel drops when this process ends however it ends.
// The files stay (removing one would let two processes lock two files of
// one name).
func lockPort(port int) (*os.File, bool) {
	dir := portLockDir
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// portLockDir holds FreeAddr's lock files: one directory for the machine,
// whatever TMPDIR a test process runs with (scripts/mutants.sh gives
// gremlins' test runs one of their own), since ports are the machine's.
const portLockDir = "/tmp/pinnedd-test-ports"

// freeFloor is the lowest port FreeAddr hands out (above the well-known
// and most registered service ports).
const freeFloor = 20000

var (
	freeMu   sync.Mutex
	freeHeld = map[int]*os.File{} // port -> its lock, held until exit
	// freePorts is the range FreeAddr picks from, [lo, hi).
	freePorts = func() (int, int) { return freeFloor, ephemeralLow() }
)

// ephemeralLow is the bottom of the kernel's range for ports it picks
// itself (outgoing connections, listens on :0); Linux's default if
// unreadable or too low to leave room below it.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < freeFloor+1000 {
		return 32768
	}
	return lo
}

// CLI runs `pinnedd args...` and returns its combined output.
func CLI(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(Bin(t, "pinnedd"), args...)
	cmd.Env = append(os.Environ(), "PINBOARD_TOKEN="+Token)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// SyncBuffer is a bytes.Buffer a test may read while another goroutine or
// a process writes it (a log sink, a command's output).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// EnsureUser makes sure the system account name exists, creating it (no
// home) when missing; the tests that need one run as root, as CI does.
func EnsureUser(t testing.TB, name string) {
	t.Helper()
	WaitForErr(t, 30*time.Second, "user "+name, func() error {
		if _, err := user.Lookup(name); err == nil {
			return nil
		}
		// useradd refuses while another holds /etc/passwd's lock: try
		// again until the deadline.
		out, err := exec.Command("useradd", "--system", "--no-create-home", name).CombinedOutput()
		return fmt.Errorf("useradd %s: %v: %s", name, err, out)
	})
}

// SharedDir is a temporary directory, removed when t ends, that every
// account may enter and read (0755, where t.TempDir's are 0700): for
// plugin binaries a test copies, which a root pinnedd's plugin account
// must be able to execute.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pinnedd-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// SharedFile is an empty file in a SharedDir that every account may write:
// for what a plugin records (TESTHOST_EVENTS), whatever account a root
// pinnedd runs it as.
func SharedFile(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(SharedDir(t), name)
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	// The umask may have taken bits away.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	return path
}

// ReadCountedEvents reads n server-sent events from body and fails t
// unless they are "data: 0", "data: 1", ... in order (the test plugin's
// /sse stream), each read as it arrives.
func ReadCountedEvents(t testing.TB, body io.Reader, n int) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for i := 0; i < n; {
		if !sc.Scan() {
			t.Fatalf("stream ended after %d events: %v", i, sc.Err())
		}
		if line := sc.Text(); line != "" {
			if line != fmt.Sprintf("data: %d", i) {
				t.Fatalf("event %d = %q", i, line)
			}
			i++
		}
	}
}
