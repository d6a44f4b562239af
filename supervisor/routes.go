package supervisor

import (
	"cmp"
	"context"
	"slices"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// Route is what one plugin serves a namespace under: in hostname-aware
// mode a hostname (requests reach it by their Host), "" in single mode.
// A plugin serves one hostname (Spec.Bind.Hostname) and its ids live in
// one env (Spec.Bind.Env), so a node may run several builds of one
// namespace side by side, one per hostname.
type Route struct{ Hostname, Namespace string }

// String is "HOST/NS" ("/NS" in single mode): how the CLI names a route.
func (r Route) String() string { return r.Hostname + r.Namespace }

// ParseRoute reads "HOST/NS" or "/NS" (plugins.ParseRoute).
func ParseRoute(s string) (Route, error) {
	host, ns, err := plugins.ParseRoute(s)
	return Route{host, ns}, err
}

// PluginRoute is one route a running plugin serves, with what the
// directory binds it to: the registration's part.
type PluginRoute struct {
	Route
	Bind Binding
}

// Binding is, in hostname-aware mode, the hostname a plugin serves its
// namespaces under, the env their ids (and their durable state) live in,
// the env's takeover policy and the epoch the plugin registers them at;
// zero in single mode.
type Binding struct {
	Hostname string
	Env      string
	Takeover string // "" is wind_down
	Epoch    uint64
}

// routes are the routes p serves once started (none before).
func (p *pluginProc) routes() []Route {
	p.mu.Lock()
	defer p.mu.Unlock()
	return routesOf(p.spec.Bind.Hostname, p.namespaces)
}

func routesOf(host string, nss []string) []Route {
	rs := make([]Route, len(nss))
	for i, ns := range nss {
		rs[i] = Route{host, ns}
	}
	return rs
}

// Routes are the routes this node's plugins serve, with their bindings,
// sorted.
func (s *Supervisor) Routes() []PluginRoute {
	var out []PluginRoute
	for _, p := range s.plugins().procs {
		for _, r := range p.routes() {
			out = append(out, PluginRoute{Route: r, Bind: p.spec.Bind})
		}
	}
	slices.SortFunc(out, func(a, b PluginRoute) int { return cmp.Compare(a.String(), b.String()) })
	return out
}

// PluginRoutes are all the routes of the plugin that serves route ("/NS",
// or "HOST/NS"), as RemovePlugin would take them; ok false if none does.
func (s *Supervisor) PluginRoutes(route string) ([]Route, bool) {
	p, ok := s.plugins().find(route)
	if !ok {
		return nil, false
	}
	return p.routes(), true
}

// ServesRoute reports whether a plugin of this node serves r.
func (s *Supervisor) ServesRoute(r Route) bool { _, ok := s.plugins().byRoute[r]; return ok }

// serves reports whether ns is one of p's namespaces.
func (p *pluginProc) serves(ns string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.namespaces, ns)
}

// AbortRoutes evicts at once every instance the plugins serving routes
// run, and returns how many: the directory superseded those routes (a
// higher epoch rebound their hostname or env), so what they hold may be
// placed under the new binding any moment. The plugins stay (an operator
// removes them); the front door places nothing more through them.
func (s *Supervisor) AbortRoutes(ctx context.Context, routes []Route) int {
	return s.evictWhere(ctx, proto.Reason_REASON_OPERATOR, 0, func(in *instance) bool {
		return slices.Contains(routes, Route{in.inc.proc.spec.Bind.Hostname, in.key.Namespace})
	})
}
