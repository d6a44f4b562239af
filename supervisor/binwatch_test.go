package supervisor

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// logBuffer collects a supervisor's JSON log lines for a test to read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the log lines holding every one of subs.
func (l *logBuffer) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLogBuffer() (*logBuffer, *slog.Logger) {
	lb := &logBuffer{}
	return lb, slog.New(slog.NewJSONHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func writeExec(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// The watcher's decisions, poll by poll, on real files and a clock the
// test moves.
func TestBinWatchPoll(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugin")
	writeExec(t, path, []byte("version one"))
	logs, logger := newLogBuffer()
	w := &binWatch{path: path, settle: time.Second, logger: logger}
	running := statBinary(path)
	now := time.Unix(1000, 0)
	step := func(d time.Duration, want binAction, what string) binStat {
		t.Helper()
		now = now.Add(d)
		st, got := w.poll(now, running)
		if got != want {
			t.Fatalf("%s: action %d, want %d", what, got, want)
		}
		return st
	}
	step(0, binNone, "unchanged")

	// Same bytes under a new inode and mtime: no reload.
	writeExec(t, path+".new", []byte("version one"))
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	step(0, binNone, "same content, first seen")
	running = step(time.Second, binSameContent, "same content, settled")
	step(time.Hour, binNone, "same content, adopted")

	// A different binary renamed over: taken once it has settled.
	writeExec(t, path+".new", []byte("version two"))
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	step(0, binNone, "renamed over, first seen")
	step(999*time.Millisecond, binNone, "renamed over, settling")
	step(time.Millisecond, binReload, "renamed over, settled")
	// Not again while the reload has not changed the running binary (a
	// failed reload is not retried for the same file).
	step(time.Hour, binNone, "renamed over, reload asked already")
	step(time.Hour, binNone, "renamed over, reload asked already, settled")

	// Rewritten in place (same inode, same size), still being written at
	// the next poll: the settle period starts again.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("version"); err != nil {
		t.Fatal(err)
	}
	step(0, binNone, "in place, half written")
	if _, err := f.WriteString(" six"); err != nil { // the same size as before
		t.Fatal(err)
	}
	f.Close()
	// File times move with the test's clock: the kernel's are too coarse
	// to tell this write from the rename's a moment ago.
	if err := os.Chtimes(path, now.Add(time.Hour), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	step(time.Second, binNone, "in place, written after the first look")
	step(time.Second, binReload, "in place, settled")

	// Deleted, then (a while later) written back, not yet executable.
	running = statBinary(path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		step(time.Second, binNone, "missing")
	}
	if n := len(logs.lines("plugin binary missing")); n != 1 {
		t.Fatalf("%d missing-binary log lines, want 1:\n%s", n, logs)
	}
	if err := os.WriteFile(path, []byte("version seven"), 0o644); err != nil {
		t.Fatal(err)
	}
	step(time.Second, binNone, "back, first seen")
	step(time.Second, binNone, "back, not executable")
	if err := os.Chmod(path, 0o755); err != nil {
		t.Fatal(err)
	}
	step(time.Second, binNone, "executable, first seen")
	step(time.Second, binReload, "executable, settled")
}

// buildTesthost builds internal/testhost with its version set to v.
func buildTesthost(t *testing.T, dir, v string) string {
	t.Helper()
	out := filepath.Join(dir, "testhost-"+v)
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+v, "-o", out, "./internal/testhost")
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build testhost %s: %v\n%s", v, err, b)
	}
	return out
}

func copyExec(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeExec(t, to, b)
}

// watched is a supervisor whose one plugin binary is watched.
type watched struct {
	t    *testing.T
	s    *Supervisor
	url  string
	logs *logBuffer
	mu   sync.Mutex
	pids map[int]bool // every plugin process seen serving
}

func startWatched(t *testing.T, path string) *watched {
	t.Helper()
	logs, logger := newLogBuffer()
	s, err := New(Config{
		Specs:        []Spec{{Name: "watched", Path: path, Namespaces: []string{"/misc"}, Watch: true}},
		Logger:       logger,
		BinaryPoll:   20 * time.Millisecond,
		BinarySettle: 200 * time.Millisecond,
		SwapDeadline: 2 * time.Second,
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
	wt := &watched{t: t, s: s, url: srv.URL, logs: logs, pids: map[int]bool{}}
	t.Cleanup(func() {
		srv.Close()
		for _, p := range s.Plugins() {
			wt.pids[p.PID] = true
		}
		s.Stop(context.Background())
		for pid := range wt.pids {
			testutil.CheckGone(t, []int{pid})
		}
		checkNoPlugins(t)
		if t.Failed() {
			t.Logf("supervisor log:\n%s", logs)
		}
	})
	return wt
}

// get answers GET /misc/<id>/<what>, remembering which process answered.
func (w *watched) get(id, what string) string {
	w.t.Helper()
	r, err := testutil.Do(context.Background(), "GET", w.url+"/misc/"+id+"/"+what, "", nil)
	if err != nil || r.Code != 200 {
		w.t.Fatalf("GET %s/%s: %v %+v", id, what, err, r)
	}
	if what == "pid" {
		pid, err := strconv.Atoi(r.Body)
		if err != nil {
			w.t.Fatal(err)
		}
		w.mu.Lock()
		w.pids[pid] = true
		w.mu.Unlock()
	}
	return r.Body
}

// swappedTo waits until new activations and the instance that lived
// through the swap are served by the new binary, and the old process is
// gone.
func (w *watched) swappedTo(version, oldPID string) {
	w.t.Helper()
	testutil.WaitFor(w.t, 20*time.Second, "a new activation served by "+version, func() bool {
		return w.get("fresh", "version") == version
	})
	testutil.WaitFor(w.t, 20*time.Second, "the swapped instance served by "+version, func() bool {
		return w.get("a", "version") == version
	})
	if pid := w.get("a", "pid"); pid == oldPID {
		w.t.Fatalf("version %s served by the old process %s", version, pid)
	}
	old, _ := strconv.Atoi(oldPID)
	testutil.WaitFor(w.t, 20*time.Second, "the old plugin process gone", func() bool { return !testutil.Alive(old) })
	if n := len(w.logs.lines("plugin binary changed; reloading", `"plugin":"watched"`)); n != 1 {
		w.t.Fatalf("%d reload log lines, want 1:\n%s", n, w.logs)
	}
}

// A watched plugin binary replaced on disk is hot-swapped, however it was
// replaced; replaced by the same bytes it is not.
func TestWatchedBinaryHotSwap(t *testing.T) {
	bins := t.TempDir()
	v1 := buildTesthost(t, bins, "v1")
	v2 := buildTesthost(t, bins, "v2")

	t.Run("renamed over", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "plugin")
		copyExec(t, v1, path)
		w := startWatched(t, path)
		if got := w.get("a", "version"); got != "v1" {
			t.Fatalf("version %q before the swap", got)
		}
		oldPID := w.get("a", "pid")
		copyExec(t, v2, path+".tmp")
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		w.swappedTo("v2", oldPID)
	})

	t.Run("deleted then written", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "plugin")
		copyExec(t, v1, path)
		w := startWatched(t, path)
		oldPID := w.get("a", "pid")
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the missing binary noticed", func() bool {
			return len(w.logs.lines("plugin binary missing", `"plugin":"watched"`)) == 1
		})
		if pid := w.get("a", "pid"); pid != oldPID {
			t.Fatalf("served by %s while the binary is missing, want the old process %s", pid, oldPID)
		}
		copyExec(t, v2, path) // a new file, written in place
		w.swappedTo("v2", oldPID)
	})

	t.Run("wrapper rewritten in place", func(t *testing.T) {
		// The watched path is a script that execs the real binary: it can
		// be rewritten in place while the plugin runs. Both versions'
		// scripts have the same size, so only the mtime tells them apart.
		path := filepath.Join(t.TempDir(), "plugin")
		script := func(bin string) []byte { return []byte("#!/bin/sh\nexec " + bin + " \"$@\"\n") }
		writeExec(t, path, script(v1))
		w := startWatched(t, path)
		if got := w.get("a", "version"); got != "v1" {
			t.Fatalf("version %q before the swap", got)
		}
		oldPID := w.get("a", "pid")
		ino := statBinary(path).ino
		writeExec(t, path, script(v2))
		if statBinary(path).ino != ino {
			t.Fatal("the script was not rewritten in place")
		}
		w.swappedTo("v2", oldPID)
	})

	t.Run("same content", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "plugin")
		copyExec(t, v1, path)
		w := startWatched(t, path)
		oldPID := w.get("a", "pid")
		// The running version is known before the file is replaced (the
		// watcher hashes it at its first poll, status when asked).
		testutil.WaitFor(t, 10*time.Second, "the running binary hashed", func() bool {
			return w.s.Plugins()[0].Version != ""
		})
		copyExec(t, v1, path+".tmp")
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the replacement recognised as the same binary", func() bool {
			return len(w.logs.lines("replaced by the same content")) == 1
		})
		if pid := w.get("a", "pid"); pid != oldPID {
			t.Fatalf("served by %s after a same-content replacement, want %s", pid, oldPID)
		}
		if n := len(w.logs.lines("plugin binary changed; reloading")); n != 0 {
			t.Fatalf("reloaded for the same content:\n%s", w.logs)
		}
	})
}
