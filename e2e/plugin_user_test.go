package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// runAs runs a command as u, with its groups, and returns its output.
// testUser returns the account name, creating it when missing.
func testUser(t *testing.T, name string) *supervisor.User {
	t.Helper()
	testutil.EnsureUser(t, name)
	u, err := supervisor.LookupUser(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func runAs(u *supervisor.User, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// procUID is the real uid on a process's Uid line in /proc/<pid>/status.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return ""
}

// envOf reads one variable of a process's environment.
func envOf(t *testing.T, pid int, key string) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// A root pinnedd runs its plugins as other users: the counter as one
// (--plugin-user /counters=...), the built-in hosts as another (the
// default). Each process has its user's uid; the counter works end to end,
// its state store included; neither user can read pinnedd's data dir, nor
// enter the other plugin's socket directory.
func TestPluginUser(t *testing.T) {
	t.Parallel()
	a, b := testUser(t, "pinnedd-test-a"), testUser(t, "pinnedd-test-b")
	// Under a directory others may enter: only pinnedd's own modes may
	// keep the plugin accounts out (t.TempDir's parent would, whatever).
	dataDir := filepath.Join(testutil.SharedDir(t), "data")
	agent := testutil.StartAgentBin(t, testutil.Bin(t, "pinnedd"), nil,
		"--dev", "--data-dir", dataDir, "--plugin", "/counters="+testutil.Bin(t, "counter"),
		"--plugin-user", a.Name, "--plugin-user", "/counters="+b.Name)

	expect(t, agent, "POST", "/counters/alice/increment", 200, `{"value":1}`)
	expect(t, agent, "POST", "/counters/alice/increment", 200, `{"value":2}`)

	st := getStatus(t, agent)
	dirs := map[string]string{} // plugin name → its socket directory
	for _, p := range st.Plugins {
		want := a
		if p.Name == "counter" {
			want = b
		}
		if got := procUID(t, p.PID); got != fmt.Sprint(want.UID) || p.User != want.Name {
			t.Errorf("plugin %s (pid %d) runs as uid %s, status says user %q; want %s's %d", p.Name, p.PID, got, p.User, want.Name, want.UID)
		}
		dirs[p.Name] = filepath.Dir(envOf(t, p.PID, plugins.EnvDataSocket))
	}
	if len(dirs) != 2 || dirs["counter"] == dirs["builtin"] {
		t.Fatalf("socket directories %v: want the counter's and the built-in hosts', apart", dirs)
	}

	// pinnedd's data dir, and each part of it, is closed to both users.
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatalf("nothing in the data dir %s", dataDir)
	}
	for _, u := range []*supervisor.User{a, b} {
		if out, err := runAs(u, "ls", dataDir); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s lists the data dir: %v %s", u.Name, err, out)
		}
		for _, e := range entries {
			path := filepath.Join(dataDir, e.Name())
			cmd := "cat"
			if e.IsDir() {
				cmd = "ls"
			}
			if out, err := runAs(u, cmd, path); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("%s reads %s: %v %s", u.Name, path, err, out)
			}
		}
	}
	// Each user enters its own socket directory, not the other's.
	for _, c := range []struct {
		u          *supervisor.User
		own, other string
	}{{a, "builtin", "counter"}, {b, "counter", "builtin"}} {
		if out, err := runAs(c.u, "ls", dirs[c.own]); err != nil {
			t.Errorf("%s cannot list its own socket directory %s: %v %s", c.u.Name, dirs[c.own], err, out)
		}
		if out, err := runAs(c.u, "ls", dirs[c.other]); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s lists %s's socket directory %s: %v %s", c.u.Name, c.other, dirs[c.other], err, out)
		}
	}
}

// runAgent runs `pinnedd agent` with args to its end (each case here fails
// at start) and returns its exit code and output.
func runAgent(t *testing.T, bin string, cred *syscall.Credential, args ...string) (int, string) {
	t.Helper()
	return runAgentEnv(t, bin, cred, nil, args...)
}

// runAgentEnv is runAgent with env on top of the deployment token.
func runAgentEnv(t *testing.T, bin string, cred *syscall.Credential, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"agent"}, args...)...)
	cmd.Env = append(append(os.Environ(), "PINBOARD_TOKEN="+testutil.Token), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

// --plugin-user is refused at start, saying why: a pinnedd that is not
// root, root as the plugins' user, a user that does not exist.
func TestPluginUserRefused(t *testing.T) {
	t.Parallel()
	a, b := testUser(t, "pinnedd-test-a"), testUser(t, "pinnedd-test-b")
	bin := testutil.Bin(t, "pinnedd")
	for _, c := range []struct {
		name string
		cred *syscall.Credential
		user string
		want string
	}{
		{"not root", &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}, b.Name, "--plugin-user needs pinnedd to run as root"},
		{"root user", nil, "root", `invalid plugin user "root": it is root (uid 0)`},
		{"unknown user", nil, "pinnedd-no-such-user", `invalid plugin user "pinnedd-no-such-user": user: unknown user`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := runAgent(t, bin, c.cred, "--dev", "--data-dir", t.TempDir(), "--plugin-user", c.user)
			if code == 0 || !strings.Contains(out, c.want) {
				t.Errorf("exit %d, output:\n%s\nwant a failure saying %q", code, out, c.want)
			}
			if strings.Contains(out, "front door listening") {
				t.Errorf("the agent started:\n%s", out)
			}
		})
	}
}

// pinnedd makes itself non-dumpable. Run as a plain user (as the systemd
// unit runs it), a process of that same user — what a plugin is — cannot
// open pinnedd's /proc/<pid>/environ or mem (the kernel hands both to
// root), while it opens those of its own and of pinnedd's plugin, a
// dumpable process of the same user.
func TestAgentNonDumpable(t *testing.T) {
	t.Parallel()
	a := testUser(t, "pinnedd-test-a")
	bin := testutil.Bin(t, "pinnedd")
	parent, err := os.MkdirTemp("", "pinnedd-nondumpable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(parent, "data")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dataDir, int(a.UID), int(a.GID)); err != nil {
		t.Fatal(err)
	}
	addr := testutil.FreeAddr(t)
	cmd := exec.Command(bin, "agent", "--dev", "--data-dir", dataDir, "--http-addr", addr, "--drain-deadline", "2s")
	cmd.Env = append(os.Environ(), "PINBOARD_TOKEN="+testutil.Token, "PINNEDD_TEST_MARK=environ-of-pinnedd")
	logs := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("pinnedd %d ignored SIGTERM for 20s; killing", pid)
			_ = cmd.Process.Kill()
			<-done
		}
		if err := testutil.Eventually(5*time.Second, func() bool { return len(testutil.ChildrenOf(pid)) == 0 }); err != nil {
			left := testutil.ChildrenOf(pid)
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			t.Errorf("plugin processes of pinnedd %d outlived it: %v", pid, left)
		}
		if t.Failed() {
			t.Logf("pinnedd's output:\n%s", logs.String())
		}
	})
	testutil.WaitFor(t, 30*time.Second, "pinnedd ready", func() bool {
		r, err := testutil.Do(context.Background(), http.MethodGet, "http://"+addr+"/readyz", "", nil)
		return err == nil && r.Code == http.StatusOK
	})
	if got := procUID(t, pid); got != fmt.Sprint(a.UID) {
		t.Fatalf("pinnedd runs as uid %s, want %d", got, a.UID)
	}
	// Its own reads of /proc/self still work: the process metrics.
	r, err := testutil.Do(context.Background(), http.MethodGet, "http://"+addr+"/metrics", "", nil)
	if err != nil || r.Code != http.StatusOK || !strings.Contains(r.Body, "\nprocess_open_fds ") {
		t.Errorf("GET /metrics of a non-dumpable pinnedd: %v %d, want 200 with process_open_fds", err, r.Code)
	}
	kids := testutil.ChildrenOf(pid)
	if len(kids) == 0 {
		t.Fatal("pinnedd runs no plugin")
	}
	// Not root, pinnedd switches no user: its plugins share its own.
	for _, kid := range kids {
		if got := procUID(t, kid); got != fmt.Sprint(a.UID) {
			t.Errorf("plugin %d of a pinnedd run as %s runs as uid %s", kid, a.Name, got)
		}
	}

	// The kernel gives a non-dumpable process's environ to root.
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/environ", pid), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Errorf("pinnedd's /proc environ belongs to uid %d, want root's (non-dumpable)", st.Uid)
	}
	for _, f := range []string{"environ", "mem"} {
		path := fmt.Sprintf("/proc/%d/%s", pid, f)
		if out, err := runAs(a, "head", "-c", "1", path); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s (pinnedd's own user) opens %s: %v %q", a.Name, path, err, out)
		}
	}
	// Opening environ is not closed to the user as such: its own opens.
	// Its plugin's does not either: the SDK makes a plugin non-dumpable,
	// for the secrets pinnedd passes it.
	if out, err := runAs(a, "cat", "/proc/self/environ"); err != nil {
		t.Errorf("%s cannot read its own environ: %v %s", a.Name, err, out)
	}
	path := fmt.Sprintf("/proc/%d/environ", kids[0])
	if out, err := runAs(a, "cat", path); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("%s reads its plugin's %s: %v %q", a.Name, path, err, out)
	}
	// The same processes' environ read as pinnedd's own user would carry
	// this mark; its process keeps it from them.
	if out, _ := runAs(a, "cat", fmt.Sprintf("/proc/%d/environ", pid)); strings.Contains(out, "environ-of-pinnedd") {
		t.Errorf("%s read pinnedd's environment", a.Name)
	}
}

// A fleet node whose plugins share its user says so at start, loudly, and
// names them: one not run as root. As root its plugins run as an account of
// their own, the default one or --plugin-user's, and it does not.
func TestFleetNodeSaysPluginsShareItsUser(t *testing.T) {
	t.Parallel()
	const shared = "PLUGINS RUN AS PINNEDD'S OWN USER"
	a := testUser(t, "pinnedd-test-a")
	n := newNode(t, "n1", "--bootstrap")
	agent := testutil.StartAgentAs(t, &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}, fleetEnv,
		replaceArg(n.args, "--data-dir", userDataDir(t, a))...)
	if _, err := agent.WaitLog(10*time.Second, `"level":"WARN"`, shared, `"plugins":["counter"]`, fmt.Sprintf(`"uid":%d`, a.UID)); err != nil {
		t.Fatalf("no warning that the plugins share pinnedd's user: %v", err)
	}
	if got := procUID(t, pluginPID(t, agent, "counter")); got != fmt.Sprint(a.UID) {
		t.Errorf("the plugin of a pinnedd run as %s runs as uid %s, want %s's", a.Name, got, a.Name)
	}

	for _, args := range [][]string{nil, {"--plugin-user", a.Name}} {
		m := newNode(t, "n1", append([]string{"--bootstrap"}, args...)...).start(t, true)
		if strings.Contains(m.a.Logs(), shared) {
			t.Errorf("root, %q: warned with every plugin under a user of its own", args)
		}
	}
}

// userDataDir is a data dir that u owns, for a pinnedd run as u, in a
// directory u may enter.
func userDataDir(t *testing.T, u *supervisor.User) string {
	t.Helper()
	dir := filepath.Join(testutil.SharedDir(t), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// replaceArg is args with the value after flag set to value.
func replaceArg(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = value
		}
	}
	return out
}

// defaultPluginUser is the account a root pinnedd runs its plugins as
// without --plugin-user on this machine: pinnedd-plugin if it exists, else
// nobody. No test creates pinnedd-plugin, so a run sees the same one
// throughout.
func defaultPluginUser(t *testing.T) *supervisor.User {
	t.Helper()
	sets, err := supervisor.WithDefaultPluginUser(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return sets[0].User
}

// A root pinnedd without --plugin-user runs its plugins as its default
// account, not as root: both processes (the counter and the built-in
// hosts) have its uid, each its own socket directory; the counter works end
// to end; the account can neither list pinnedd's data dir nor read what is
// in it. On a machine without pinnedd-plugin the account is nobody, and
// pinnedd says so at start.
func TestPluginUserDefault(t *testing.T) {
	t.Parallel()
	def := defaultPluginUser(t)
	// Under a directory others may enter: only pinnedd's own modes may
	// keep the plugin accounts out (t.TempDir's parent would, whatever).
	dataDir := filepath.Join(testutil.SharedDir(t), "data")
	agent := testutil.StartAgent(t, nil, "--dev", "--data-dir", dataDir, "--plugin", "/counters="+testutil.Bin(t, "counter"))

	expect(t, agent, "POST", "/counters/alice/increment", 200, `{"value":1}`)
	expect(t, agent, "POST", "/counters/alice/increment", 200, `{"value":2}`)
	expect(t, agent, "GET", "/counters/alice/value", 200, `{"value":2}`)

	st := getStatus(t, agent)
	if len(st.Plugins) != 2 {
		t.Fatalf("plugins %+v: want the counter and the built-in hosts", st.Plugins)
	}
	dirs := map[string]bool{}
	for _, p := range st.Plugins {
		if got := procUID(t, p.PID); got != fmt.Sprint(def.UID) || p.User != def.Name {
			t.Errorf("plugin %s (pid %d) runs as uid %s, status says user %q; want %s's %d", p.Name, p.PID, got, p.User, def.Name, def.UID)
		}
		dirs[filepath.Dir(envOf(t, p.PID, plugins.EnvDataSocket))] = true
	}
	if len(dirs) != 2 {
		t.Errorf("socket directories %v: want one for each plugin", dirs)
	}

	entries, err := os.ReadDir(dataDir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("data dir %s: %v, %d entries", dataDir, err, len(entries))
	}
	if out, err := runAs(def, "ls", dataDir); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("%s lists the data dir: %v %s", def.Name, err, out)
	}
	for _, e := range entries {
		path := filepath.Join(dataDir, e.Name())
		if out, err := runAs(def, "cat", path); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s reads %s: %v %s", def.Name, path, err, out)
		}
	}

	const warn = "PLUGINS RUN AS THE SHARED ACCOUNT nobody"
	if def.Name == supervisor.SharedPluginUserName {
		if _, err := agent.WaitLog(5*time.Second, `"level":"WARN"`, warn, "create pinnedd-plugin", "--plugin-user"); err != nil {
			t.Errorf("plugins run as nobody, and no warning saying so: %v", err)
		}
	} else if strings.Contains(agent.Logs(), warn) {
		t.Errorf("plugins run as %s, and pinnedd warns they run as nobody", def.Name)
	}
}

// A plugin binary its account cannot execute (in a directory closed to it)
// is refused at start, as a configuration the unit does not restart on
// (78), naming the binary, the account and what to do: the default
// account's and an operator's --plugin-user alike.
func TestPluginUserCannotExecute(t *testing.T) {
	t.Parallel()
	a := testUser(t, "pinnedd-test-a")
	def := defaultPluginUser(t)
	closed := filepath.Join(t.TempDir(), "counter") // t.TempDir is root's, 0700
	copyFile(t, testutil.Bin(t, "counter"), closed)
	for _, c := range []struct {
		name string
		args []string
		user string
	}{
		{"default", nil, def.Name},
		{"--plugin-user", []string{"--plugin-user", a.Name}, a.Name},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--dev", "--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0", "--plugin", "/counters=" + closed}, c.args...)
			code, out := runAgent(t, testutil.Bin(t, "pinnedd"), nil, args...)
			if code != 78 {
				t.Errorf("exit %d, want 78 (a configuration refused)", code)
			}
			for _, want := range []string{"plugin counter runs as " + c.user, "cannot execute " + closed, "permission denied",
				"make the binary and every directory above it executable by that account", "--plugin-user"} {
				if !strings.Contains(out, want) {
					t.Errorf("output does not say %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "front door listening") {
				t.Errorf("the agent started:\n%s", out)
			}
		})
	}
}

// `pinnedd agent --dev` as root, from a binary in a directory only root
// may enter (where `go run` builds it): the built-in hosts run as the
// default account from a copy of pinnedd's binary that it can execute, and
// serve; the copy is gone once the agent has stopped.
func TestDevAsRootFromPrivateBinary(t *testing.T) {
	t.Parallel()
	def := defaultPluginUser(t)
	bin := filepath.Join(t.TempDir(), "pinnedd")
	copyFile(t, testutil.Bin(t, "pinnedd"), bin)
	agent := testutil.StartAgentBin(t, bin, nil, "--dev")
	expect(t, agent, "POST", "/counters/alice/increment", 200, `{"value":1}`)

	st := getStatus(t, agent)
	if len(st.Plugins) != 1 || st.Plugins[0].Name != "builtin" {
		t.Fatalf("plugins %+v: want the built-in hosts", st.Plugins)
	}
	p := st.Plugins[0]
	if got := procUID(t, p.PID); got != fmt.Sprint(def.UID) || p.User != def.Name {
		t.Errorf("the built-in hosts run as uid %s, user %q; want %s's %d", got, p.User, def.Name, def.UID)
	}
	if p.Path == bin || filepath.Base(p.Path) != "pinnedd" {
		t.Fatalf("the built-in hosts run %s, want a copy of %s", p.Path, bin)
	}
	if _, err := agent.WaitLog(5*time.Second, "the built-in hosts run from a copy of pinnedd's binary", p.Path); err != nil {
		t.Errorf("no word of the copy: %v", err)
	}
	copyDir := filepath.Dir(p.Path)
	if fi, err := os.Stat(copyDir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the copy's directory: %v %v, want 0755", fi, err)
	}

	agent.Signal(syscall.SIGTERM)
	if code, err := agent.Wait(20 * time.Second); err != nil || code != 0 {
		t.Fatalf("agent exit %d, %v", code, err)
	}
	if _, err := os.Stat(copyDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy's directory %s after the agent stopped: %v, want it gone", copyDir, err)
	}
}
