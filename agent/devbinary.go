package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pinnedd/pinnedd/internal/datadir"
)

// devBinary is a copy of pinnedd's own binary that --dev's built-in hosts
// run from when their account cannot execute the original.
//
// The built-in hosts are pinnedd re-executing itself, and `go run` (the
// README's quick start) builds pinnedd in a directory only its user may
// enter. As root, pinnedd runs its plugins as another account
// (supervisor.WithDefaultPluginUser), which could not start them there. So
// under --dev, and for pinnedd's own binary only, they run from a copy in a
// directory that account may enter: root's, read-only to it, removed at
// Stop. A dev data dir's lock guards the directory (datadir.Acquire), so
// the next dev agent's sweep removes it after a kill -9, and never while
// its agent lives. A binary of the operator's (--plugin) is never copied:
// one its account cannot run is refused at start, saying what to do.
type devBinary struct {
	dir  string
	lock *datadir.Lock
}

// provisionDevBinary points the specs that run pinnedd's own binary as an
// account that cannot execute it at a copy of it (see devBinary).
func (a *Agent) provisionDevBinary() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	for i := range a.cfg.Specs {
		sp := &a.cfg.Specs[i]
		if sp.User == nil || sp.Path != self || sp.CheckExecutable() == nil {
			continue
		}
		if a.devBin == nil {
			bin, err := copyDevBinary(self)
			if err != nil {
				return fmt.Errorf("copy pinnedd's binary for the built-in hosts: %w", err)
			}
			a.devBin = bin
		}
		sp.Path = filepath.Join(a.devBin.dir, filepath.Base(self))
		a.log.Info("the built-in hosts run from a copy of pinnedd's binary: their account cannot execute the original (a directory above it is closed to others, as `go run`'s are); rebuilding pinnedd does not hot-swap them",
			"plugin", sp.Name, "user", sp.User.Name, "binary", self, "copy", sp.Path)
	}
	return nil
}

// copyDevBinary copies the binary at self into a new directory that every
// account may enter, and holds that directory's lock.
func copyDevBinary(self string) (_ *devBinary, err error) {
	dir, err := os.MkdirTemp("", datadir.DevPrefix+"bin-*")
	if err != nil {
		return nil, err
	}
	lock, err := datadir.Acquire(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	d := &devBinary{dir: dir, lock: lock}
	defer func() {
		if err != nil {
			_ = d.remove()
		}
	}()
	// Enterable, not writable, by others: the plugins' account runs the
	// copy and cannot change it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	src, err := os.Open(self)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, filepath.Base(self)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	// The umask may have taken bits away.
	if err := os.Chmod(dst.Name(), 0o755); err != nil {
		return nil, err
	}
	return d, nil
}

// remove gives the lock up and removes the copy.
func (d *devBinary) remove() error {
	return errors.Join(d.lock.Release(), os.RemoveAll(d.dir))
}
