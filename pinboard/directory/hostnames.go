package directory

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// Hostname-aware mode (seed 004, "Hostname-aware mode"): a worker serves
// routes, each a (hostname, namespace) whose ids live in an env. The
// first registration of a route binds (hostname, namespace) to its env,
// and the env to a takeover policy, each at the route's epoch. A
// registration that disagrees with a binding at the same or a lower epoch
// is refused whole (CodeBindingConflict); a higher epoch rewrites the
// binding, supersedes the routes of other workers that disagree with it,
// and refuses new placements through the rewritten binding for one lease.
//
// A binding or env policy lives while some live worker serves an agreeing,
// unsuperseded route: one whose last worker lapsed is treated as absent
// at once (a new env may bind it at any epoch), and GC removes it.
//
// A claim through a hostname (ClaimRoute) places the key (env of the
// binding, namespace, id). When a live worker holds the key under another
// hostname of the same env, the env's takeover decides: deny answers
// CodeHeld (ReasonOtherHostname); wind_down fences the placement once, one
// lease out (the proposer tells the owner to wind the id down by then) and
// answers CodeTakeover until the owner gives the id back. The directory
// never grants a key a live worker holds: the fence tells the owner when to
// let go, it does not take the key from it.

// TakeoverPolicy is what a request through one hostname does to an id a
// live worker holds under another hostname of the same env.
type TakeoverPolicy byte

const (
	// TakeoverWindDown fences the holder once and re-places the id under
	// the new hostname when the holder gave it back.
	TakeoverWindDown TakeoverPolicy = 0
	// TakeoverDeny refuses while the holder lives.
	TakeoverDeny TakeoverPolicy = 1
)

func (p TakeoverPolicy) String() string {
	switch p {
	case TakeoverWindDown:
		return "wind_down"
	case TakeoverDeny:
		return "deny"
	}
	return fmt.Sprintf("takeover(%d)", byte(p))
}

// ParseTakeover reads a policy as the seeds spell it; "" is wind_down.
func ParseTakeover(s string) (TakeoverPolicy, error) {
	switch s {
	case "", "wind_down":
		return TakeoverWindDown, nil
	case "deny":
		return TakeoverDeny, nil
	}
	return 0, fmt.Errorf("takeover %q: want wind_down or deny", s)
}

// Route is one (hostname, namespace) a worker serves in hostname-aware
// mode, the env its ids live in, and the binding it registered with.
// Superseded is set by the directory when a higher epoch rebound the
// route's hostname or env to something else: the route takes no
// placements, and the worker is told on its next heartbeat.
type Route struct {
	Hostname   string
	Namespace  string
	Env        string
	Takeover   TakeoverPolicy
	Epoch      uint64
	Superseded bool
}

// Binding is (hostname, namespace) -> env at an epoch. DisplacedUntil is
// set when a higher epoch rebound it: new placements through it are refused
// before then (unix ms).
type Binding struct {
	Hostname       string
	Namespace      string
	Env            string
	Epoch          uint64
	DisplacedUntil int64
}

// EnvPolicy is env -> takeover policy at an epoch.
type EnvPolicy struct {
	Env      string
	Takeover TakeoverPolicy
	Epoch    uint64
}

type hostNS struct{ hostname, namespace string }

// RegisterRoutes is Register in hostname-aware mode: the worker serves
// Routes, and Register.Namespaces must be empty (a worker is placed either
// by namespace or by route, never both).
type RegisterRoutes struct {
	Register
	Routes []Route
}

// ClaimRoute is Claim through a hostname: Key.Env must be the env the
// binding of (Hostname, Key.Namespace) names (the proposer read it; a
// binding that changed since answers CodeConflict). TTLMs is one lease:
// the takeover fence's length.
type ClaimRoute struct {
	Claim
	Hostname string
	TTLMs    int64
}

// Reasons hostname-aware claims give, with the seeds' words.
const (
	ReasonNoHostname    = "no live workers for hostname"
	ReasonDisplaced     = "hostname binding displaced, retry"
	ReasonOtherHostname = "placement held by another hostname"
	// With CodeTakeover: this claim set the fence (the proposer tells the
	// owner to wind down), or the fence passed and the owner still holds
	// the id (the proposer tells it again).
	ReasonFenced      = "takeover fenced"
	ReasonFencePassed = "takeover fence passed"
)

// validRoutes checks a registration's routes among themselves.
func validRoutes(rs []Route) string {
	if len(rs) == 0 {
		return "no routes"
	}
	seen := make(map[hostNS]bool, len(rs))
	takeover := make(map[string]TakeoverPolicy, len(rs))
	for _, r := range rs {
		switch {
		case r.Hostname == "" || r.Namespace == "" || r.Env == "":
			return "a route needs a hostname, a namespace and an env"
		case r.Takeover > TakeoverDeny:
			return "unknown takeover policy"
		case r.Superseded:
			return "a registered route cannot be superseded"
		case seen[hostNS{r.Hostname, r.Namespace}]:
			return "hostname " + r.Hostname + r.Namespace + " listed twice"
		}
		seen[hostNS{r.Hostname, r.Namespace}] = true
		if t, ok := takeover[r.Env]; ok && t != r.Takeover {
			return "env " + r.Env + " listed with two takeover policies"
		}
		takeover[r.Env] = r.Takeover
	}
	return ""
}

// agrees reports whether some live worker other than except serves an
// unsuperseded route that match accepts: the test of whether a binding or
// an env policy is still in force.
func (m *Machine) agrees(except string, now int64, match func(Route) bool) bool {
	for id, w := range m.st.workers.all() {
		if id == except || !w.Live(now) {
			continue
		}
		for _, r := range w.Routes {
			if !r.Superseded && match(r) {
				return true
			}
		}
	}
	return false
}

// binding returns the binding of k if it is in force at now (some live
// worker agrees with it); a registration by except does not count itself.
func (m *Machine) binding(k hostNS, except string, now int64) (Binding, bool) {
	b, ok := m.st.bindings[k]
	if !ok || !m.agrees(except, now, func(r Route) bool {
		return r.Hostname == k.hostname && r.Namespace == k.namespace && r.Env == b.Env
	}) {
		return Binding{}, false
	}
	return b, true
}

func (m *Machine) envPolicy(env, except string, now int64) (EnvPolicy, bool) {
	e, ok := m.st.envs[env]
	if !ok || !m.agrees(except, now, func(r Route) bool { return r.Env == env && r.Takeover == e.Takeover }) {
		return EnvPolicy{}, false
	}
	return e, true
}

// routeConflict answers CodeBindingConflict for the first of rs that
// disagrees with a binding or env policy in force at the same or a higher
// epoch, as the seeds word it, with the route (in Superseded) so that a
// worker knows which one to drop.
func (m *Machine) routeConflict(rs []Route, client string, now int64) (Result, bool) {
	for _, r := range rs {
		why := ""
		if b, ok := m.binding(hostNS{r.Hostname, r.Namespace}, client, now); ok && b.Env != r.Env && r.Epoch <= b.Epoch {
			why = fmt.Sprintf("hostname %s%s is bound to env %s at epoch %d, not %s — register with a higher epoch to displace",
				r.Hostname, r.Namespace, b.Env, b.Epoch, r.Env)
		} else if e, ok := m.envPolicy(r.Env, client, now); ok && e.Takeover != r.Takeover && r.Epoch <= e.Epoch {
			why = fmt.Sprintf("env %s agreed takeover %s at epoch %d, not %s — register with a higher epoch to displace",
				r.Env, e.Takeover, e.Epoch, r.Takeover)
		}
		if why != "" {
			return Result{Code: CodeBindingConflict, Reason: why, Superseded: []Route{r}}, true
		}
	}
	return Result{}, false
}

func (m *Machine) applyRegisterRoutes(c RegisterRoutes) Result {
	if why := validRoutes(c.Routes); why != "" {
		return Result{Code: CodeInvalid, Reason: why}
	}
	if len(c.Namespaces) != 0 {
		return Result{Code: CodeInvalid, Reason: "a worker with routes lists no namespaces"}
	}
	if r, bad := m.routeConflict(c.Routes, c.ClientID, c.Now); bad {
		return r
	}
	r := m.applyRegister(c.Register)
	if r.Code != CodeOK {
		return r
	}
	m.st.workers.edit(c.ClientID).Routes = slices.Clone(c.Routes)
	for _, rt := range c.Routes {
		m.bind(rt, c.ClientID, c.Now, c.TTLMs)
	}
	return r
}

// bind records rt's binding and env policy, rewriting (and superseding
// the routes that disagree) where rt's epoch is higher.
func (m *Machine) bind(rt Route, client string, now, ttl int64) {
	k := hostNS{rt.Hostname, rt.Namespace}
	b, recorded := m.st.bindings[k]
	_, inForce := m.binding(k, client, now)
	switch {
	case recorded && b.Env == rt.Env:
		b.Epoch = max(b.Epoch, rt.Epoch)
	default: // new, or rebound by a higher epoch (routeConflict let it through)
		b = Binding{Hostname: rt.Hostname, Namespace: rt.Namespace, Env: rt.Env, Epoch: rt.Epoch}
		if inForce {
			b.DisplacedUntil = now + ttl // live holders are displaced
		}
		m.supersede(client, func(r Route) bool {
			return r.Hostname == rt.Hostname && r.Namespace == rt.Namespace && r.Env != rt.Env
		})
	}
	m.setBinding(k, b)

	e, recorded := m.st.envs[rt.Env]
	switch {
	case recorded && e.Takeover == rt.Takeover:
		e.Epoch = max(e.Epoch, rt.Epoch)
	default:
		e = EnvPolicy{Env: rt.Env, Takeover: rt.Takeover, Epoch: rt.Epoch}
		m.supersede(client, func(r Route) bool { return r.Env == rt.Env && r.Takeover != rt.Takeover })
	}
	m.st.envs[rt.Env] = e
}

func (m *Machine) setBinding(k hostNS, b Binding) {
	if old, ok := m.st.bindings[k]; ok && old == b {
		return
	}
	m.st.bindings[k] = b
	m.st.bindingsChanged = true
}

// supersede marks the routes of every other worker that match.
func (m *Machine) supersede(except string, match func(Route) bool) {
	for id, w := range m.st.workers.all() {
		if id == except || !slices.ContainsFunc(w.Routes, func(r Route) bool { return !r.Superseded && match(r) }) {
			continue
		}
		ew := m.st.workers.edit(id)
		rs := slices.Clone(ew.Routes) // published copies share the slice
		for i := range rs {
			if !rs[i].Superseded && match(rs[i]) {
				rs[i].Superseded = true
			}
		}
		ew.Routes = rs
	}
}

// superseded lists w's superseded routes, for its heartbeat's answer.
func superseded(w *Worker) []Route {
	var out []Route
	for _, r := range w.Routes {
		if r.Superseded {
			out = append(out, r)
		}
	}
	return out
}

// ServesRoute reports whether w may be placed through (hostname, ns) in env.
func (w Worker) ServesRoute(hostname, ns, env string) bool {
	return slices.ContainsFunc(w.Routes, func(r Route) bool {
		return !r.Superseded && r.Hostname == hostname && r.Namespace == ns && r.Env == env
	})
}

func (m *Machine) applyClaimRoute(c ClaimRoute) Result {
	if c.Hostname == "" || c.TTLMs <= 0 {
		return Result{Code: CodeInvalid, Reason: "a route claim needs a hostname and a lease TTL"}
	}
	return m.claim(c.Claim, &c)
}

// routeClaimHeld decides a route claim for a key a live worker holds: the
// same hostname (or a single-mode placement) answers as Claim does;
// another hostname of the env meets the env's takeover.
func (m *Machine) routeClaimHeld(c *ClaimRoute, p Placement) (Result, bool) {
	if p.Hostname == c.Hostname || p.Hostname == "" {
		return Result{}, false
	}
	if m.st.envs[c.Key.Env].Takeover == TakeoverDeny {
		return Result{Code: CodeHeld, Reason: ReasonOtherHostname, Placement: p}, true
	}
	switch {
	case p.FenceUntil == 0:
		p.FenceUntil = c.Now + c.TTLMs
		m.st.placements.set(p)
		return Result{Code: CodeTakeover, Reason: ReasonFenced, Placement: p, RemainingMs: c.TTLMs}, true
	case c.Now >= p.FenceUntil:
		return Result{Code: CodeTakeover, Reason: ReasonFencePassed, Placement: p}, true
	}
	return Result{Code: CodeTakeover, Placement: p, RemainingMs: p.FenceUntil - c.Now}, true
}

// routeBound checks that the binding a route claim goes through exists and
// names the key's env.
func (m *Machine) routeBound(c *ClaimRoute) (Result, bool) {
	b, ok := m.st.bindings[hostNS{c.Hostname, c.Key.Namespace}]
	switch {
	case !ok:
		return Result{Code: CodeIneligible, Reason: ReasonNoHostname}, false
	case b.Env != c.Key.Env:
		return Result{Code: CodeConflict, Reason: "the binding names env " + b.Env}, false
	}
	return Result{}, true
}

// routeDisplaced answers a claim through a binding rebound less than a
// lease ago: no new placements through it yet.
func (m *Machine) routeDisplaced(c *ClaimRoute) (Result, bool) {
	b := m.st.bindings[hostNS{c.Hostname, c.Key.Namespace}]
	if c.Now < b.DisplacedUntil {
		return Result{Code: CodeIneligible, Reason: ReasonDisplaced, RemainingMs: b.DisplacedUntil - c.Now}, true
	}
	return Result{}, false
}

// collectBindings drops the bindings and env policies no live worker
// agrees with at now (GC).
func (m *Machine) collectBindings(now int64) {
	for k := range m.st.bindings {
		if _, ok := m.binding(k, "", now); !ok {
			delete(m.st.bindings, k)
			m.st.bindingsChanged = true
		}
	}
	for env := range m.st.envs {
		if _, ok := m.envPolicy(env, "", now); !ok {
			delete(m.st.envs, env)
		}
	}
}

// Binding returns the binding of (hostname, ns) as recorded (the front
// door's per-request read: no lock). A binding no live worker agrees
// with any more is still returned until GC removes it; RouteCandidates
// then finds no one.
func (m *Machine) Binding(hostname, ns string) (Binding, bool) {
	b, ok := m.view.Load().bindings[hostNS{hostname, ns}]
	return b, ok
}

// RouteCandidates returns the workers a new placement through (hostname,
// ns) may go to at now, sorted by client id, with the env of the binding.
func (m *Machine) RouteCandidates(hostname, ns string, now int64) (env string, ws []Worker) {
	m.mu.RLock()
	b, ok := m.st.bindings[hostNS{hostname, ns}]
	if ok {
		for _, w := range m.st.workers.all() {
			if m.eligible(w, w.ServesRoute(hostname, ns, b.Env), now) == "" {
				ws = append(ws, *w)
			}
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(ws, func(a, b Worker) int { return cmp.Compare(a.ClientID, b.ClientID) })
	return b.Env, ws
}

// Bindings returns every recorded binding sorted by hostname and
// namespace, and every env policy sorted by env.
func (m *Machine) Bindings() ([]Binding, []EnvPolicy) {
	m.mu.RLock()
	bs := slices.Collect(maps.Values(m.st.bindings))
	es := slices.Collect(maps.Values(m.st.envs))
	m.mu.RUnlock()
	slices.SortFunc(bs, compareBindings)
	slices.SortFunc(es, func(a, b EnvPolicy) int { return cmp.Compare(a.Env, b.Env) })
	return bs, es
}

func compareBindings(a, b Binding) int {
	return cmp.Or(cmp.Compare(a.Hostname, b.Hostname), cmp.Compare(a.Namespace, b.Namespace))
}
