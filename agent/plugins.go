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
	"time"

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

// addPlugin starts the plugin arg names (--plugin's [HOST]/NS=PATH,...)
// on this running node and registers its routes.
func (a *Agent) addPlugin(ctx context.Context, arg string) ([]string, error) {
	route, rest, ok := strings.Cut(arg, "=")
	path, _, _ := strings.Cut(rest, ",") // options follow the path
	if !ok || route == "" || path == "" {
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
	rs, err := a.sup.AddPlugin(ctx, sp)
	switch {
	case errors.Is(err, supervisor.ErrPluginConflict):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrConflict, err)
	case errors.Is(err, supervisor.ErrPluginStart):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrBadRequest, err)
	case err != nil:
		return nil, err
	}
	// Answer once the directory places the new routes here: a request
	// right after is served.
	if err := a.announce(ctx); err != nil {
		return routeNames(rs), fmt.Errorf("plugin started, but its namespaces are not registered yet (the next heartbeat retries): %w", err)
	}
	return routeNames(rs), nil
}

// removePlugin ends the plugin serving route on this node and lets its
// routes go in the directory.
func (a *Agent) removePlugin(ctx context.Context, route string) ([]string, error) {
	// First the directory stops placing the plugin's routes here (the ids
	// it runs stay its own until evicted), so an id released by the
	// eviction is placed on another node, not here again.
	gone, _ := a.sup.PluginRoutes(route)
	if len(gone) > 0 && len(gone) < len(a.sup.Routes()) {
		a.setLeaving(gone)
		if err := a.announce(ctx); err != nil {
			a.setLeaving(nil)
			a.worker.Reregister()
			return nil, err
		}
	}
	rs, err := a.sup.RemovePlugin(ctx, route)
	a.setLeaving(nil)
	switch {
	case errors.Is(err, supervisor.ErrUnknownPlugin):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrUnknownNamespace, err)
	case errors.Is(err, supervisor.ErrPluginConflict):
		return nil, fmt.Errorf("%w: %w", pinboard.ErrConflict, err)
	case err != nil:
		return nil, err
	}
	if err := a.announce(ctx); err != nil {
		return routeNames(rs), fmt.Errorf("plugin removed, but the directory has not heard yet (the next heartbeat retries): %w", err)
	}
	return routeNames(rs), nil
}

// announce registers what this node serves now and returns once the
// directory applied it.
func (a *Agent) announce(ctx context.Context) error {
	return a.worker.SetNamespacesAndWait(ctx, a.registeredNamespaces())
}

// registeredNamespaces are what this node's worker registers in single
// mode: its plugins' namespaces, but for those of a plugin being removed.
// None in hostname-aware mode (registeredRoutes).
func (a *Agent) registeredNamespaces() []string {
	if a.cfg.HostnameAware {
		return nil
	}
	a.leavingMu.Lock()
	defer a.leavingMu.Unlock()
	return slices.DeleteFunc(a.sup.Namespaces(), func(ns string) bool {
		return slices.Contains(a.leaving, supervisor.Route{Namespace: ns})
	})
}

// registeredRoutes are, in hostname-aware mode, what this node's worker
// registers: its plugins' routes with their bindings, but for those of a
// plugin being removed. The worker leaves out the routes the directory
// superseded.
func (a *Agent) registeredRoutes() []pinboard.RouteSpec {
	a.leavingMu.Lock()
	defer a.leavingMu.Unlock()
	var out []pinboard.RouteSpec
	for _, r := range a.sup.Routes() {
		if !slices.Contains(a.leaving, r.Route) {
			out = append(out, pinboard.RouteSpec{Hostname: r.Hostname, Namespace: r.Namespace, Env: r.Bind.Env, Takeover: r.Bind.Takeover, Epoch: r.Bind.Epoch})
		}
	}
	return out
}

// setLeaving names the routes of a plugin on its way out (nil: none).
func (a *Agent) setLeaving(rs []supervisor.Route) {
	a.leavingMu.Lock()
	a.leaving = rs
	a.leavingMu.Unlock()
}

// superseded is the worker's OnSuperseded hook: the directory rebound
// these routes' hostname or env at a higher epoch (or refused them), so
// their instances are aborted; the worker registers without them, and
// /readyz and status report them until an operator removes the plugin.
//
// The worker calls it from its register or heartbeat loop: the evictions
// run beside it, so they never hold up the lease of the routes that stay.
// (The worker logs the superseded routes; this logs what was aborted.)
func (a *Agent) superseded(specs []pinboard.RouteSpec, _ string) {
	rs := make([]supervisor.Route, len(specs))
	for i, sp := range specs {
		rs[i] = supervisor.Route{Hostname: sp.Hostname, Namespace: sp.Namespace}
	}
	a.bg.Add(1) // the worker's own loop is one of a.bg's: never zero here
	go func() {
		defer a.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n := a.sup.AbortRoutes(ctx, rs)
		a.log.Info("superseded routes' instances aborted", "routes", routeNames(rs), "instances", n)
	}()
}

func routeNames(rs []supervisor.Route) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}

func (a *Agent) pluginNames() []string {
	var names []string
	for _, p := range a.sup.Plugins() {
		names = append(names, p.Name)
	}
	return names
}
