// Package datadir owns a node's data directory as a whole: the lock that
// proves one pinnedd process uses it, and the sweep of data dirs that
// dead --dev agents left in the temporary directory. It never reads or
// writes what the other packages keep inside.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrInUse means another live process holds the data dir's lock.
var ErrInUse = errors.New("data dir in use by another pinnedd process")

// lockName is the lock file at the top of a data dir.
const lockName = "LOCK"

// Lock is a held data dir lock; Release gives it up (the kernel does too
// when the process dies, which is what lets a successor in after kill -9).
type Lock struct{ f *os.File }

// Acquire takes dir's lock without waiting, creating dir (0700) if needed,
// and records this process's pid in it. While it is held, everything in
// dir belongs to this process: whatever a predecessor left there is stale.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := holderOf(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by %s; stop it first, or give this one its own --data-dir", ErrInUse, dir, holder)
		}
		return nil, fmt.Errorf("data dir lock %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// holderOf names the process recorded in a held lock file.
func holderOf(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n]))); err == nil && pid > 0 {
		return "pid " + strconv.Itoa(pid)
	}
	return "another process"
}

// Release gives the lock up.
func (l *Lock) Release() error { return l.f.Close() }

// DevPrefix starts the name of a --dev agent's temporary data dir.
const DevPrefix = "pinnedd-dev-"

// minAge protects a data dir that a starting agent has just made and not
// yet locked.
const minAge = time.Minute

// SweepStale removes the --dev data dirs under parent whose agent is gone
// (kill -9 skips the agent's own cleanup): those whose lock nobody holds,
// and unlocked ones older than a minute. It returns what it removed.
func SweepStale(parent string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(parent, DevPrefix+"*"))
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, dir := range matches {
		if !stale(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return removed, fmt.Errorf("sweep %s: %w", dir, err)
		}
		removed = append(removed, dir)
	}
	return removed, nil
}

func stale(dir string) bool {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		return false
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
	if err != nil {
		return errors.Is(err, os.ErrNotExist) && time.Since(st.ModTime()) > minAge
	}
	defer f.Close()
	// Taking the lock proves its holder is gone; closing f gives it back.
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}
