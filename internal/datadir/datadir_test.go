package datadir

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestAcquireExcludesASecondHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d1")
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir) // flock is per open file: a second open in one process conflicts too
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Acquire: %v, want ErrInUse naming pid %d", err, os.Getpid())
	}
	if strings.Count(err.Error(), "in use") != 1 {
		t.Fatalf("the message says it once: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	l2.Release()
}

// A dev agent killed with -9 leaves its temporary data dir; the next one
// sweeps it, and leaves alone a live agent's dir and a just-made one.
func TestSweepStale(t *testing.T) {
	parent := t.TempDir()
	mk := func(name string) string {
		d := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(d, "raft"), 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	dead := mk(DevPrefix + "dead")
	if l, err := Acquire(dead); err != nil {
		t.Fatal(err)
	} else {
		l.Release() // its process is gone: nobody holds the lock
	}
	live := mk(DevPrefix + "live")
	// Held by another process, as a running agent holds its own.
	holder := exec.Command("flock", filepath.Join(live, lockName), "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := Acquire(live)
		if errors.Is(err, ErrInUse) {
			break
		}
		if err == nil {
			l.Release() // flock has not taken it yet
		}
		if time.Now().After(deadline) {
			t.Fatal("flock never took the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fresh := mk(DevPrefix + "fresh") // no lock yet, made now
	oldUnlocked := mk(DevPrefix + "old")
	old := time.Now().Add(-2 * minAge)
	if err := os.Chtimes(oldUnlocked, old, old); err != nil {
		t.Fatal(err)
	}
	other := mk("not-pinnedd")
	if l, err := Acquire(other); err == nil {
		l.Release()
	}

	removed, err := SweepStale(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Fatalf("removed %v, want the dead and the old unlocked dirs", removed)
	}
	for d, want := range map[string]bool{dead: false, oldUnlocked: false, live: true, fresh: true, other: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", filepath.Base(d), err == nil, want)
		}
	}
}
