package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// maxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes with its terminating NUL).
const maxSocketPath = 107

// fallbackLink, inside Config.RuntimeDir, points at the short directory
// used instead when socket paths there would be too long, so that the next
// start can remove it after a kill -9.
const fallbackLink = "sockets"

// fallbackPrefix names the short directories (in os.TempDir) that hold
// sockets for a RuntimeDir too deep for them.
const fallbackPrefix = "pinnedd-run-"

// openRuntimeDir picks the directory the plugins' sockets go to (see
// Config.RuntimeDir) and clears what a dead predecessor left in it.
func (s *Supervisor) openRuntimeDir() error {
	dir := s.cfg.RuntimeDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "pinnedd-")
		if err != nil {
			return err
		}
		s.runtimeDir, s.ownDir = tmp, true
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// MkdirAll leaves an existing directory's mode be; the sockets in it
	// accept whoever can reach them.
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if err := s.sweepRuntimeDir(dir); err != nil {
		return err
	}
	if n := s.longestSocketName(); len(dir)+1+n <= maxSocketPath {
		s.runtimeDir = dir
		return nil
	}
	tmp, err := os.MkdirTemp("", fallbackPrefix)
	if err != nil {
		return err
	}
	if err := os.Symlink(tmp, filepath.Join(dir, fallbackLink)); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	s.cfg.Logger.Debug("runtime dir too long for unix socket paths; plugin sockets go to a short private directory",
		"runtime_dir", dir, "socket_dir", tmp, "limit", maxSocketPath)
	s.runtimeDir, s.ownDir, s.fallback = tmp, true, filepath.Join(dir, fallbackLink)
	return nil
}

// sweepRuntimeDir removes everything in dir. Only a dead predecessor can
// have left anything there: the caller holds the lock that keeps any other
// pinnedd off this directory.
func (s *Supervisor) sweepRuntimeDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if e.Name() == fallbackLink {
			// The predecessor's short socket directory, if it is one of
			// ours (never follow the link anywhere else).
			if target, err := os.Readlink(path); err == nil && isFallbackDir(target) {
				errs = append(errs, os.RemoveAll(target))
			}
		}
		errs = append(errs, os.RemoveAll(path))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove a dead predecessor's files from %s: %w", dir, err)
	}
	if len(entries) > 0 {
		s.cfg.Logger.Info("removed a dead predecessor's runtime files", "runtime_dir", dir, "entries", len(entries))
	}
	return nil
}

func isFallbackDir(path string) bool {
	return filepath.IsAbs(path) && filepath.Dir(path) == filepath.Clean(os.TempDir()) &&
		strings.HasPrefix(filepath.Base(path), fallbackPrefix)
}

// longestSocketName is the longest name a socket in the runtime dir can
// have: a plugin's data socket (<name>-<incarnation>.sock) or one that
// go-plugin makes (plugin<random uint32>).
func (s *Supervisor) longestSocketName() int {
	n := len("plugin") + 10
	for _, p := range s.procs {
		n = max(n, len(p.spec.Name)+len("-")+20+len(".sock"))
	}
	return n
}

// closeRuntimeDir removes the directory Start made for itself.
func (s *Supervisor) closeRuntimeDir() {
	if s.ownDir {
		_ = os.RemoveAll(s.runtimeDir)
	}
	if s.fallback != "" {
		_ = os.Remove(s.fallback)
	}
}
