package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/pinnedd/pinnedd/plugins/proto"
)

// pluginSet is the node's plugins and who serves each namespace. It is
// never modified once published: AddPlugin and RemovePlugin publish a new
// one, so the per-request look-ups take no lock.
type pluginSet struct {
	procs []*pluginProc
	byNS  map[string]*pluginProc
}

// plugins is the current set.
func (s *Supervisor) plugins() *pluginSet { return s.set.Load() }

// serve records p's namespaces in set, refusing one another plugin serves.
func (set *pluginSet) serve(p *pluginProc) error {
	for _, ns := range p.namespaces {
		if other, dup := set.byNS[ns]; dup && other != p {
			return fmt.Errorf("%w: namespace %s is served by both %s and %s", ErrPluginConflict, ns, other.spec.Name, p.spec.Name)
		}
	}
	for _, ns := range p.namespaces {
		set.byNS[ns] = p
	}
	return nil
}

// Errors of adding and removing plugins.
var (
	// ErrPluginConflict: the plugin's name or a namespace it serves is
	// another plugin's on this node.
	ErrPluginConflict = errors.New("plugin conflicts with one this node runs")
	// ErrUnknownPlugin: no plugin of this node serves the namespace.
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
// passed and none of its namespaces is another plugin's here, serves
// them; it returns them. A plugin that fails is stopped and nothing
// changes. The caller tells the directory (the worker registers again).
func (s *Supervisor) AddPlugin(ctx context.Context, sp Spec) ([]string, error) {
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
		next := &pluginSet{procs: append(slices.Clone(set.procs), p), byNS: maps.Clone(set.byNS)}
		if err = next.serve(p); err == nil {
			s.set.Store(next)
			s.cfg.Logger.Info("plugin added", "plugin", sp.Name, "path", sp.Path, "namespaces", p.namespaces)
			return slices.Clone(p.namespaces), nil
		}
	}
	p.end(s.cfg.StopGrace)
	_ = os.Remove(s.socketDir(p)) // its own (with plugin users); the shared one stays
	return nil, err
}

// RemovePlugin stops serving the namespaces of the plugin that serves ns
// on this node: it takes them out of the set (requests for them are no
// longer this node's), evicts the plugin's instances (each gets
// StopGrace; their placements are released), and ends the process. It
// returns the namespaces it served. The caller tells the directory.
func (s *Supervisor) RemovePlugin(ctx context.Context, ns string) ([]string, error) {
	s.changeMu.Lock()
	defer s.changeMu.Unlock()
	set := s.plugins()
	p, ok := set.byNS[ns]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %s", ErrUnknownPlugin, ns)
	case len(set.procs) == 1:
		return nil, fmt.Errorf("%w: %s is served by this node's last plugin (a node that hosts nothing runs with --no-hosts)", ErrPluginConflict, ns)
	}
	next := &pluginSet{byNS: map[string]*pluginProc{}}
	for _, q := range set.procs {
		if q != p {
			next.procs = append(next.procs, q)
		}
	}
	for n, q := range set.byNS {
		if q != p {
			next.byNS[n] = q
		}
	}
	s.set.Store(next)

	s.mu.Lock()
	var gone []*instance
	for _, in := range s.instances {
		if in.inc != nil && in.inc.proc == p {
			gone = append(gone, in)
		}
	}
	s.mu.Unlock()
	done := make(chan struct{}, len(gone))
	for _, in := range gone {
		go func() { s.evict(ctx, in, proto.Reason_REASON_DRAIN, s.cfg.StopGrace); done <- struct{}{} }()
	}
	for range gone {
		<-done
	}
	p.end(s.cfg.StopGrace)
	s.cfg.Logger.Info("plugin removed", "plugin", p.spec.Name, "namespaces", p.namespaces, "instances", len(gone))
	return slices.Clone(p.namespaces), nil
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
