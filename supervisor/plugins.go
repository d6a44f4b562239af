package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/pinnedd/pinnedd/plugins/proto"
)

// pluginSet is the node's plugins and who serves each route. It is never
// modified once published: AddPlugin and RemovePlugin publish a new one,
// so the per-request look-ups take no lock.
type pluginSet struct {
	procs   []*pluginProc
	byRoute map[Route]*pluginProc
	served  map[string]int // namespace -> how many routes serve it
}

func newPluginSet(procs []*pluginProc) *pluginSet {
	return &pluginSet{procs: procs, byRoute: map[Route]*pluginProc{}, served: map[string]int{}}
}

// without is set less p.
func (set *pluginSet) without(p *pluginProc) *pluginSet {
	next := newPluginSet(nil)
	for _, q := range set.procs {
		if q != p {
			next.procs = append(next.procs, q)
		}
	}
	for r, q := range set.byRoute {
		if q != p {
			next.byRoute[r] = q
			next.served[r.Namespace]++
		}
	}
	return next
}

// find is the plugin that serves the route named sel ("HOST/NS", "/NS").
func (set *pluginSet) find(sel string) (*pluginProc, bool) {
	r, err := ParseRoute(sel)
	if err != nil {
		return nil, false
	}
	p, ok := set.byRoute[r]
	return p, ok
}

// plugins is the current set.
func (s *Supervisor) plugins() *pluginSet { return s.set.Load() }

// serve records p's routes in set, refusing one another plugin serves.
func (set *pluginSet) serve(p *pluginProc) error {
	rs := p.routes()
	for _, r := range rs {
		if other, dup := set.byRoute[r]; dup && other != p {
			what := "namespace " + r.Namespace
			if r.Hostname != "" {
				what = r.Namespace + " under hostname " + r.Hostname
			}
			return fmt.Errorf("%w: %s is served by both %s and %s", ErrPluginConflict, what, other.spec.Name, p.spec.Name)
		}
	}
	for _, r := range rs {
		if set.byRoute[r] == nil {
			set.served[r.Namespace]++
		}
		set.byRoute[r] = p
	}
	return nil
}

// Errors of adding and removing plugins.
var (
	// ErrPluginConflict: the plugin's name or a namespace it serves is
	// another plugin's on this node.
	ErrPluginConflict = errors.New("plugin conflicts with one this node runs")
	// ErrUnknownPlugin: no plugin of this node serves the route.
	ErrUnknownPlugin = errors.New("no plugin of this node serves it")
	// ErrPluginStart: an added plugin did not start (its handshake failed,
	// or it does not serve the namespace it was added for).
	ErrPluginStart = errors.New("plugin did not start")
)

// newProc checks sp against set (its name, its user) and makes its
// process record, stopped.
func (s *Supervisor) newProc(set *pluginSet, sp Spec) (*pluginProc, error) {
	if slices.ContainsFunc(set.procs, func(p *pluginProc) bool { return p.spec.Name == sp.Name }) {
		return nil, fmt.Errorf("%w: two plugins named %q", ErrPluginConflict, sp.Name)
	}
	if sp.User != nil {
		if err := CheckCanSwitchUser(); err != nil {
			return nil, fmt.Errorf("supervisor: plugin %s as user %s: %w", sp.Name, sp.User.Name, err)
		}
		if err := sp.CheckExecutable(); err != nil {
			return nil, fmt.Errorf("supervisor: %w", err)
		}
	}
	s.metrics.plugin(sp.Name)
	return &pluginProc{sup: s, spec: sp, state: StateStopped, logger: s.cfg.Logger.With("plugin", sp.Name), swapped: make(chan struct{})}, nil
}

// launch runs p until the supervisor stops or p is removed; the channel
// answers its first handshake.
func (s *Supervisor) launch(p *pluginProc) chan error {
	first := make(chan error, 1)
	ctx, cancel := context.WithCancel(s.runCtx)
	p.mu.Lock()
	p.cancelRun = cancel
	p.mu.Unlock()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); defer cancel(); p.run(ctx, first) }()
	return first
}

// AddPlugin starts sp on a running node and, once its first handshake
// passed and none of its routes is another plugin's here, serves them; it
// returns them. A plugin that fails is stopped and nothing
// changes. The caller tells the directory (the worker registers again).
func (s *Supervisor) AddPlugin(ctx context.Context, sp Spec) ([]Route, error) {
	s.changeMu.Lock()
	defer s.changeMu.Unlock()
	s.mu.Lock()
	running := s.started && !s.stopping
	s.mu.Unlock()
	if !running {
		return nil, ErrStopping
	}
	set := s.plugins()
	if (sp.User != nil) != s.pluginUsers() {
		// The socket layout was chosen at start: per user, or shared.
		return nil, fmt.Errorf("%w: this node's plugins run %s; add one the same way (--plugin-user)", ErrPluginConflict,
			map[bool]string{true: "as users of their own", false: "as pinnedd's own user"}[s.pluginUsers()])
	}
	p, err := s.newProc(set, sp)
	if err != nil {
		return nil, err
	}
	if s.pluginUsers() {
		if n := len(s.runtimeDir) + 1 + len(sp.Name) + 1 + len(sp.Name) + len("-.sock") + 20; n > maxSocketPath {
			return nil, fmt.Errorf("%w: plugin name %q makes its socket paths too long for this node's runtime dir", ErrPluginConflict, sp.Name)
		}
		if err := s.openSocketDir(p); err != nil {
			return nil, err
		}
	}
	select {
	case err = <-s.launch(p):
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrPluginStart, err)
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		next := set.without(nil) // a copy
		next.procs = append(next.procs, p)
		if err = next.serve(p); err == nil {
			s.set.Store(next)
			s.cfg.Logger.Info("plugin added", "plugin", sp.Name, "path", sp.Path, "routes", p.routes())
			return p.routes(), nil
		}
	}
	p.end(s.cfg.StopGrace)
	_ = os.Remove(s.socketDir(p)) // its own (with plugin users); the shared one stays
	return nil, err
}

// RemovePlugin stops serving the routes of the plugin that serves route
// ("HOST/NS", or "/NS" in single mode) on this node: it takes them out of
// the set (requests for them are no longer this node's), evicts the
// plugin's instances (each gets StopGrace; their placements are
// released), and ends the process. It returns the routes it served. The
// caller tells the directory.
func (s *Supervisor) RemovePlugin(ctx context.Context, route string) ([]Route, error) {
	s.changeMu.Lock()
	defer s.changeMu.Unlock()
	set := s.plugins()
	p, ok := set.find(route)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %s", ErrUnknownPlugin, route)
	case len(set.procs) == 1:
		return nil, fmt.Errorf("%w: %s is served by this node's last plugin (a node that hosts nothing runs with --no-hosts)", ErrPluginConflict, route)
	}
	s.set.Store(set.without(p))

	n := s.evictWhere(ctx, proto.Reason_REASON_DRAIN, s.cfg.StopGrace, func(in *instance) bool { return in.inc.proc == p })
	p.end(s.cfg.StopGrace)
	if s.pluginUsers() {
		// A plugin added later may take its name, and with it this path.
		if err := os.RemoveAll(s.socketDir(p)); err != nil {
			s.cfg.Logger.Warn("removing a removed plugin's socket directory failed", "plugin", p.spec.Name, "err", err)
		}
	}
	s.cfg.Logger.Info("plugin removed", "plugin", p.spec.Name, "routes", p.routes(), "instances", n)
	return p.routes(), nil
}

// evictWhere evicts every instance that match accepts, all at once, and
// returns when they are out (or ctx ended), with how many there were.
func (s *Supervisor) evictWhere(ctx context.Context, why proto.Reason, grace time.Duration, match func(*instance) bool) int {
	s.mu.Lock()
	var gone []*instance
	for _, in := range s.instances {
		if in.inc != nil && match(in) {
			gone = append(gone, in)
		}
	}
	s.mu.Unlock()
	done := make(chan struct{}, len(gone))
	for _, in := range gone {
		go func() { s.evict(ctx, in, why, grace); done <- struct{}{} }()
	}
	for range gone {
		<-done
	}
	return len(gone)
}

// end stops p for good: no restart, its process gone.
func (p *pluginProc) end(grace time.Duration) {
	p.mu.Lock()
	cancel := p.cancelRun
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	p.stop(grace)
}
