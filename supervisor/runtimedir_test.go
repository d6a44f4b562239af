package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// startIn runs the testhost under a supervisor with the given RuntimeDir;
// the cleanup stops it and checks its processes are gone.
func startIn(t *testing.T, runtimeDir string) (*Supervisor, *logBuffer) {
	t.Helper()
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs:      []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}},
		Logger:     logger,
		RuntimeDir: runtimeDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		pids := []int{}
		for _, p := range s.Plugins() {
			pids = append(pids, p.PID)
		}
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	}
	t.Cleanup(stop)
	return s, logs
}

// sockets lists the unix sockets in dir.
func sockets(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			out = append(out, e.Name())
		}
	}
	return out
}

// A runtime dir is made private, cleared of a dead predecessor's files at
// start, and holds every socket of the plugins.
func TestRuntimeDirSweptAndPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	// What a kill -9 leaves: sockets, go-plugin's files, and a short
	// socket directory elsewhere with its link.
	if err := os.MkdirAll(filepath.Join(dir, "plugin-dir1"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"old-7.sock", "plugin123", "plugin-dir1/x"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stale, err := os.MkdirTemp("", fallbackPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stale) })
	if err := os.Symlink(stale, filepath.Join(dir, fallbackLink)); err != nil {
		t.Fatal(err)
	}

	_, logs := startIn(t, dir)
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("runtime dir mode %v, want 0700", st.Mode().Perm())
	}
	for _, f := range []string{"old-7.sock", "plugin123", "plugin-dir1", fallbackLink} {
		if _, err := os.Lstat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("stale %s still there (%v)", f, err)
		}
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the predecessor's socket directory %s still there (%v)", stale, err)
	}
	if len(logs.lines("removed a dead predecessor's runtime files", `"entries":4`)) != 1 {
		t.Errorf("no log line for the sweep:\n%s", logs)
	}
	// The data socket and go-plugin's own are in the runtime dir.
	socks := sockets(t, dir)
	var data, gp bool
	for _, name := range socks {
		data = data || strings.HasPrefix(name, "p-") && strings.HasSuffix(name, ".sock")
		gp = gp || strings.HasPrefix(name, "plugin")
	}
	if !data || !gp {
		t.Fatalf("sockets in the runtime dir: %v, want the data socket and go-plugin's", socks)
	}
}

// A runtime dir too deep for unix socket paths: the sockets go to a short
// private directory, linked from the runtime dir, removed at Stop.
func TestRuntimeDirTooLongFallsBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	s, logs := startIn(t, dir)
	short := s.runtimeDir
	if !isFallbackDir(short) {
		t.Fatalf("sockets in %s, want a short directory in %s", short, os.TempDir())
	}
	if target, err := os.Readlink(filepath.Join(dir, fallbackLink)); err != nil || target != short {
		t.Fatalf("link to the socket dir: %q %v", target, err)
	}
	if len(sockets(t, short)) < 2 {
		t.Fatalf("sockets in %s: %v", short, sockets(t, short))
	}
	if len(logs.lines(`"level":"DEBUG"`, "runtime dir too long for unix socket paths")) != 1 {
		t.Fatalf("no debug line for the fallback:\n%s", logs)
	}
	s.Stop(context.Background())
	if _, err := os.Stat(short); !os.IsNotExist(err) {
		t.Errorf("%s still there after Stop (%v)", short, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, fallbackLink)); !os.IsNotExist(err) {
		t.Errorf("link still there after Stop (%v)", err)
	}
}

// With no runtime dir configured the sockets go to a temporary directory
// that Stop removes.
func TestNoRuntimeDirUsesATemporaryOne(t *testing.T) {
	s, _ := startIn(t, "")
	dir := s.runtimeDir
	if len(sockets(t, dir)) < 2 {
		t.Fatalf("sockets in %s: %v", dir, sockets(t, dir))
	}
	s.Stop(context.Background())
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Stop (%v)", dir, err)
	}
}

// With plugin users, a runtime dir they could not reach (here under the
// test's private temporary directory, as under a 0700 data dir) is
// replaced by a short directory they can pass through, each plugin's
// socket directory in it; Stop removes it.
func TestRuntimeDirUnreachableByPluginUsersFallsBack(t *testing.T) {
	u := ensureUser(t, "pinnedd-test-a")
	dir := filepath.Join(t.TempDir(), "run")
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs:      []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}, User: u}},
		Logger:     logger,
		RuntimeDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pids := []int{current(t, s, "p").pid}
	t.Cleanup(func() {
		s.Stop(context.Background())
		testutil.CheckGone(t, pids)
		checkNoPlugins(t)
	})
	short := s.runtimeDir
	if !isFallbackDir(short) {
		t.Fatalf("sockets in %s, want a short directory in %s", short, os.TempDir())
	}
	if target, err := os.Readlink(filepath.Join(dir, fallbackLink)); err != nil || target != short {
		t.Fatalf("link to the socket dir: %q %v", target, err)
	}
	if st, err := os.Stat(short); err != nil || st.Mode().Perm() != 0o711 {
		t.Fatalf("%s: %v %v, want mode 0711", short, st.Mode(), err)
	}
	if got := sockets(t, filepath.Join(short, "p")); len(got) < 2 {
		t.Errorf("sockets in p's directory: %v, want the data socket and go-plugin's", got)
	}
	if len(logs.lines(`"level":"DEBUG"`, "runtime dir not reachable by plugin users")) != 1 {
		t.Errorf("no debug line for the fallback:\n%s", logs)
	}
	s.Stop(context.Background())
	if _, err := os.Stat(short); !os.IsNotExist(err) {
		t.Errorf("%s still there after Stop (%v)", short, err)
	}
}
