package pinboard

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// Hostname-aware mode on the registry's wire (seed 004). A registration
// names its routes either the seeds' way (hostname, env, envs per
// namespace, takeover, epoch, with namespaces) or as a list of routes
// (one node's plugins may serve several hostnames); both become the
// directory's routes. Single mode refuses every one of those fields.

// RouteSpec is one route on the wire.
type RouteSpec struct {
	Hostname  string `json:"hostname"`
	Namespace string `json:"namespace"`
	Env       string `json:"env,omitempty"`      // default: the hostname
	Takeover  string `json:"takeover,omitempty"` // wind_down (default) or deny
	Epoch     uint64 `json:"epoch,omitempty"`
}

// Hostname-aware refusals.
var (
	// ErrBindingConflict: a route disagrees with a binding at the same or
	// a higher epoch (409, with the seeds' message).
	ErrBindingConflict = errors.New("binding conflict")
	// ErrSuperseded: a higher epoch rebound some of the worker's routes
	// (409 {"superseded": true}); the worker stops serving them.
	ErrSuperseded = errors.New("superseded by a higher epoch")
)

// RouteError carries the routes an ErrBindingConflict or ErrSuperseded is
// about.
type RouteError struct {
	Err    error // ErrBindingConflict or ErrSuperseded
	Reason string
	Routes []RouteSpec
}

func (e *RouteError) Error() string {
	if e.Reason != "" {
		return e.Reason
	}
	return fmt.Sprintf("%v: %s", e.Err, routeNames(e.Routes))
}

func (e *RouteError) Unwrap() error { return e.Err }

func routeNames(rs []RouteSpec) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Hostname + r.Namespace + " (env " + r.Env + ")"
	}
	return strings.Join(names, ", ")
}

// routeFields are the registration's hostname-aware fields, seed shape.
type routeFields struct {
	Hostname string            `json:"hostname,omitempty"`
	Env      string            `json:"env,omitempty"`
	Envs     map[string]string `json:"envs,omitempty"` // namespace -> env, overriding Env
	Takeover string            `json:"takeover,omitempty"`
	Epoch    uint64            `json:"epoch,omitempty"`
	Routes   []RouteSpec       `json:"routes,omitempty"`
}

// routes checks the hostname-aware fields against the mode and returns the
// directory's routes (nil in single mode).
func (req RegisterRequest) routes(hostnameAware bool) ([]directory.Route, error) {
	f := req.routeFields
	if !hostnameAware {
		for _, set := range []struct {
			name string
			on   bool
		}{{"hostname", f.Hostname != ""}, {"env", f.Env != ""}, {"envs", len(f.Envs) != 0},
			{"takeover", f.Takeover != ""}, {"epoch", f.Epoch != 0}, {"routes", len(f.Routes) != 0}} {
			if set.on {
				return nil, fmt.Errorf("%w: %s requires hostname-aware mode", ErrBadRequest, set.name)
			}
		}
		return nil, nil
	}
	specs := slices.Clone(f.Routes)
	switch {
	case f.Hostname != "":
		for _, ns := range req.Namespaces {
			env := f.Env
			if e, ok := f.Envs[ns]; ok {
				env = e
			}
			specs = append(specs, RouteSpec{Hostname: f.Hostname, Namespace: ns, Env: env, Takeover: f.Takeover, Epoch: f.Epoch})
		}
		for ns := range f.Envs {
			if !slices.Contains(req.Namespaces, ns) {
				return nil, fmt.Errorf("%w: envs names %s, which namespaces does not list", ErrBadRequest, ns)
			}
		}
	case len(req.Namespaces) != 0 || f.Env != "" || len(f.Envs) != 0 || f.Takeover != "" || f.Epoch != 0:
		return nil, fmt.Errorf("%w: hostname is required in hostname-aware mode", ErrBadRequest)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: hostname is required in hostname-aware mode", ErrBadRequest)
	}
	rs := make([]directory.Route, len(specs))
	for i, s := range specs {
		r, err := s.route()
		if err != nil {
			return nil, err
		}
		rs[i] = r
	}
	return rs, nil
}

// route checks one spec and fills in its defaults.
func (s RouteSpec) route() (directory.Route, error) {
	host := plugins.NormalizeHost(s.Hostname)
	if !plugins.ValidHostname(host) {
		return directory.Route{}, fmt.Errorf("%w: hostname %q is not a host name", ErrBadRequest, s.Hostname)
	}
	if err := plugins.ValidateNamespace(s.Namespace); err != nil {
		return directory.Route{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	env := s.Env
	if env == "" {
		env = host
	}
	if !plugins.ValidEnv(env) {
		return directory.Route{}, fmt.Errorf("%w: env %q must be 1-128 characters from a-z A-Z 0-9 . - _", ErrBadRequest, env)
	}
	t, err := directory.ParseTakeover(s.Takeover)
	if err != nil {
		return directory.Route{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return directory.Route{Hostname: host, Namespace: s.Namespace, Env: env, Takeover: t, Epoch: s.Epoch}, nil
}

// specOf is a directory route on the wire.
func specOf(r directory.Route) RouteSpec {
	return RouteSpec{Hostname: r.Hostname, Namespace: r.Namespace, Env: r.Env, Takeover: r.Takeover.String(), Epoch: r.Epoch}
}

func specsOf(rs []directory.Route) []RouteSpec {
	out := make([]RouteSpec, len(rs))
	for i, r := range rs {
		out[i] = specOf(r)
	}
	return out
}

// sameRoute: a and b name the same (hostname, namespace, env).
func sameRoute(a, b RouteSpec) bool {
	return plugins.NormalizeHost(a.Hostname) == plugins.NormalizeHost(b.Hostname) && a.Namespace == b.Namespace && envOf(a) == envOf(b)
}

func envOf(s RouteSpec) string {
	if s.Env == "" {
		return plugins.NormalizeHost(s.Hostname)
	}
	return s.Env
}
