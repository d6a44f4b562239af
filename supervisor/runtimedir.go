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
// Config.RuntimeDir), clears what a dead predecessor left in it, and, when
// a plugin runs as a user of its own, makes each plugin's socket directory.
//
// With plugin users the runtime dir is 0711 (users may pass through, not
// list) and every plugin gets a 0700 subdirectory owned by its user (or by
// pinnedd's, for a plugin without one): no plugin reaches another's
// sockets. A runtime dir that those users could not reach (a directory
// above it closed to others, as the data dir is) is replaced by a short
// private directory in os.TempDir(), linked from it as for a long path.
func (s *Supervisor) openRuntimeDir() error {
	mode := os.FileMode(0o700)
	if s.pluginUsers() {
		mode = 0o711
	}
	if s.cfg.RuntimeDir == "" {
		tmp, err := os.MkdirTemp("", "pinnedd-")
		if err != nil {
			return err
		}
		s.runtimeDir, s.ownDir = tmp, true
		return s.openPluginDirs(mode)
	}
	// A socket's path is dialed long after, by code that must not depend
	// on the working directory.
	dir, err := filepath.Abs(s.cfg.RuntimeDir)
	if err != nil {
		return err
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
	tooLong := len(dir)+1+s.longestSocketName() > maxSocketPath
	if !tooLong && (!s.pluginUsers() || othersCanReach(filepath.Dir(dir))) {
		s.runtimeDir = dir
		return s.openPluginDirs(mode)
	}
	tmp, err := os.MkdirTemp("", fallbackPrefix)
	if err != nil {
		return err
	}
	if err := os.Symlink(tmp, filepath.Join(dir, fallbackLink)); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	why := "runtime dir too long for unix socket paths"
	if !tooLong {
		why = "runtime dir not reachable by plugin users"
	}
	s.cfg.Logger.Debug(why+"; plugin sockets go to a short private directory",
		"runtime_dir", dir, "socket_dir", tmp, "limit", maxSocketPath)
	s.runtimeDir, s.ownDir, s.fallback = tmp, true, filepath.Join(dir, fallbackLink)
	return s.openPluginDirs(mode)
}

// pluginUsers reports whether any plugin runs as a user of its own.
func (s *Supervisor) pluginUsers() bool {
	for _, p := range s.plugins().procs {
		if p.spec.User != nil {
			return true
		}
	}
	return false
}

// openPluginDirs gives the runtime dir its mode and, with plugin users,
// makes each plugin's own socket directory (socketDir).
func (s *Supervisor) openPluginDirs(mode os.FileMode) error {
	if err := os.Chmod(s.runtimeDir, mode); err != nil {
		return err
	}
	if !s.pluginUsers() {
		return nil
	}
	// go-plugin makes pinnedd's ends of the broker (the Store service a
	// plugin dials) in pinnedd's temporary directory.
	for _, d := range []string{s.runtimeDir, os.TempDir()} {
		if !othersCanReach(d) {
			return fmt.Errorf("%s: plugin users cannot reach it: a directory on its path is closed to other users (no o+x)", d)
		}
	}
	for _, p := range s.plugins().procs {
		if err := s.openSocketDir(p); err != nil {
			return err
		}
	}
	return nil
}

// openSocketDir makes plugin p's own socket directory, its user's.
func (s *Supervisor) openSocketDir(p *pluginProc) error {
	dir := s.socketDir(p)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if u := p.spec.User; u != nil {
		if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("hand %s to plugin user %s: %w", dir, u.Name, err)
		}
	}
	return nil
}

// socketDir is where plugin p's sockets (and, with a user, its TMPDIR)
// go: with plugin users, its own subdirectory of the runtime dir; else the
// runtime dir.
func (s *Supervisor) socketDir(p *pluginProc) string {
	if !s.pluginUsers() {
		return s.runtimeDir
	}
	return filepath.Join(s.runtimeDir, p.spec.Name)
}

// othersCanReach reports whether every directory from / down to dir lets
// other users through (o+x).
func othersCanReach(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
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
// go-plugin makes (plugin<random uint32>), under the plugin's own
// directory with plugin users.
func (s *Supervisor) longestSocketName() int {
	n := len("plugin") + 10
	for _, p := range s.plugins().procs {
		sub := 0
		if s.pluginUsers() {
			sub = len(p.spec.Name) + 1
		}
		n = max(n, sub+len("plugin")+10, sub+len(p.spec.Name)+len("-")+20+len(".sock"))
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
