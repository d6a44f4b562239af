package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	dataDir := t.TempDir()
	agent := testutil.StartAgentBin(t, testutil.SharedBin(t, "pinnedd"), nil,
		"--dev", "--data-dir", dataDir, "--plugin", "/counters="+testutil.SharedBin(t, "counter"),
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"agent"}, args...)...)
	cmd.Env = append(os.Environ(), "PINBOARD_TOKEN="+testutil.Token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

// --plugin-user is refused at start, saying why: a pinnedd that is not
// root, root as the plugins' user, a user that does not exist.
func TestPluginUserRefused(t *testing.T) {
	t.Parallel()
	a, b := testUser(t, "pinnedd-test-a"), testUser(t, "pinnedd-test-b")
	bin := testutil.SharedBin(t, "pinnedd")
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
	bin := testutil.SharedBin(t, "pinnedd")
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

// A fleet node whose plugins run as its own user says so at start, loudly,
// and names them; with --plugin-user it does not.
func TestFleetNodeSaysPluginsShareItsUser(t *testing.T) {
	t.Parallel()
	n := newNode(t, "n1", "--bootstrap").start(t, true)
	if _, err := n.a.WaitLog(10*time.Second, `"level":"WARN"`, "PLUGINS RUN AS PINNEDD'S OWN USER", `"plugins":["counter"]`); err != nil {
		t.Fatalf("no warning that the plugins share pinnedd's user: %v", err)
	}
	a := testUser(t, "pinnedd-test-a")
	m := newNode(t, "n1", "--bootstrap", "--plugin-user", a.Name)
	for i, arg := range m.args {
		if strings.HasPrefix(arg, "/counters=") {
			m.args[i] = "/counters=" + testutil.SharedBin(t, "counter") // a binary the plugin user can run
		}
	}
	m.start(t, true)
	if strings.Contains(m.a.Logs(), "PLUGINS RUN AS PINNEDD'S OWN USER") {
		t.Fatal("warned with every plugin under a user of its own")
	}
}
