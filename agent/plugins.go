package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Plugins added and removed at run time (pinnedd plugins add|remove): an
// operator's call starts a binary as a plugin, so only binaries under the
// operator's --plugin-dir qualify, and only ones that nobody but their
// owner (root or pinnedd's own user) can have changed.

// errPluginDir: the binary is not one --plugin-dir allows.
var errPluginDir = errors.New("not a plugin this node may add")

// checkPluginPath resolves path and refuses it unless it is a regular
// executable file under dir, it and every directory from dir down to it
// owned by root or by this process's user and writable by no one else.
func checkPluginPath(dir, path string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: plugins are added at run time only from a directory the node names (pinnedd agent --plugin-dir)", errPluginDir)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("%w: --plugin-dir: %w", errPluginDir, err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errPluginDir, err)
	}
	rel, err := filepath.Rel(root, real)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%w: %s is not under --plugin-dir %s", errPluginDir, path, dir)
	}
	for d := real; ; d = filepath.Dir(d) {
		if err := ownedSafely(d); err != nil {
			return "", fmt.Errorf("%w: %w", errPluginDir, err)
		}
		if d == root {
			break
		}
	}
	st, err := os.Stat(real)
	if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s is not an executable file", errPluginDir, path)
	}
	return real, nil
}

// ownedSafely: path is owned by root or this process's user, and neither
// its group nor others may write it.
func ownedSafely(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: cannot read its owner", path)
	}
	if sys.Uid != 0 && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d: only root or pinnedd's own user may own a plugin and its directories", path, sys.Uid)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by its group or others (mode %v)", path, st.Mode().Perm())
	}
	return nil
}

// addPlugin starts the plugin arg names (--plugin's /NS=PATH) on this
// running node and registers its namespace.
func (a *Agent) addPlugin(ctx context.Context, arg string) ([]string, error) {
	ns, path, ok := strings.Cut(arg, "=")
	if !ok || ns == "" || path == "" {
		return nil, fmt.Errorf("%w: want /namespace=/path/to/binary", pinboard.ErrBadRequest)
	}
	if _, err := checkPluginPath(a.cfg.PluginDir, path); err != nil {
		return nil, fmt.Errorf("%w: %w", pinboard.ErrForbidden, err)
	}
	if a.cfg.NewPlugin == nil {
		return nil, fmt.Errorf("%w: this node cannot add plugins", pinboard.ErrConflict)
	}
	sp, err := a.cfg.NewPlugin(arg, a.pluginNames())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", pinboard.ErrBadRequest, err)
	}
	nss, err := a.sup.AddPlugin(ctx, sp)
	switch {
	case errors.Is(err, supervisor.ErrPluginConflict):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrConflict, err)
	case errors.Is(err, supervisor.ErrPluginStart):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrBadRequest, err)
	case err != nil:
		return nil, err
	}
	// Answer once the directory places the new namespaces here: a request
	// right after is served.
	if err := a.worker.SetNamespacesAndWait(ctx, a.sup.Namespaces()); err != nil {
		return nss, fmt.Errorf("plugin started, but its namespaces are not registered yet (the next heartbeat retries): %w", err)
	}
	return nss, nil
}

// removePlugin ends the plugin serving ns on this node and lets its
// namespaces go in the directory.
func (a *Agent) removePlugin(ctx context.Context, ns string) ([]string, error) {
	// First the directory stops placing the plugin's namespaces here (the
	// ids it runs stay its own until evicted), so an id released by the
	// eviction is placed on another node, not here again.
	var gone []string
	for _, p := range a.sup.Plugins() {
		if slices.Contains(p.Namespaces, ns) {
			gone = p.Namespaces
		}
	}
	keep := slices.DeleteFunc(a.sup.Namespaces(), func(n string) bool { return slices.Contains(gone, n) })
	if len(gone) > 0 && len(keep) > 0 {
		if err := a.worker.SetNamespacesAndWait(ctx, keep); err != nil {
			a.worker.SetNamespaces(a.sup.Namespaces())
			return nil, err
		}
	}
	nss, err := a.sup.RemovePlugin(ctx, ns)
	switch {
	case errors.Is(err, supervisor.ErrUnknownPlugin):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrUnknownNamespace, err)
	case errors.Is(err, supervisor.ErrPluginConflict):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrConflict, err)
	case err != nil:
		return nil, err
	}
	// Answer once the directory places the new namespaces here: a request
	// right after is served.
	if err := a.worker.SetNamespacesAndWait(ctx, a.sup.Namespaces()); err != nil {
		return nss, fmt.Errorf("plugin started, but its namespaces are not registered yet (the next heartbeat retries): %w", err)
	}
	return nss, nil
}

func (a *Agent) pluginNames() []string {
	var names []string
	for _, p := range a.sup.Plugins() {
		names = append(names, p.Name)
	}
	return names
}
