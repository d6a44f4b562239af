package pinboard

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// Sentinel errors of the control plane.
var (
	// ErrRefused: the directory answered, and the answer was no.
	ErrRefused = errors.New("refused by the directory")
)

// claimTimeout bounds how long a request waits for its placement.
const claimTimeout = 5 * time.Second

// RefusalHeader marks a 503 refused by the owner's worker in-band (lease
// unhealthy, draining): the front door may release the placement and retry
// elsewhere.
const RefusalHeader = "X-Pinned-Refusal"

// Instances is this node's instance runtime (package supervisor).
type Instances interface {
	Serves(namespace string) bool
	Live(namespace, id string) bool
	// ServeExisting serves the request if the instance is live here and
	// reports whether it did; it never activates.
	ServeExisting(w http.ResponseWriter, r *http.Request, namespace, id string, rest string) bool
	ServeInstance(w http.ResponseWriter, r *http.Request, namespace, id string, generation uint64, rest string)
}

// Scope is a permission a bearer token carries.
type Scope string

// Scopes, as the seed's passports name them.
const (
	ScopeWorker   Scope = "pinboard:worker"
	ScopeOperator Scope = "pinboard:operator"
)

// Tokens authorizes bearer tokens. Full passport auth is a later piece:
// every check goes through Allowed so it lands in one place.
type Tokens struct {
	keys map[string][]Scope
}

// NewTokens grants every scope to each of the given deployment tokens
// (the seed's single deployment key carries worker and operator).
func NewTokens(tokens ...string) *Tokens {
	t := &Tokens{keys: map[string][]Scope{}}
	for _, tok := range tokens {
		if tok != "" {
			t.keys[tok] = []Scope{ScopeWorker, ScopeOperator}
		}
	}
	return t
}

// Allowed reports whether r carries a bearer token with scope.
func (t *Tokens) Allowed(r *http.Request, scope Scope) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return false
	}
	for k, scopes := range t.keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(tok)) == 1 {
			for _, s := range scopes {
				if s == scope {
					return true
				}
			}
		}
	}
	return false
}

// FrontDoorConfig wires a FrontDoor.
type FrontDoorConfig struct {
	Dir     *Directory
	Worker  *Worker
	Local   Instances
	Tokens  *Tokens
	Metrics http.Handler // serves /metrics
	Logger  *slog.Logger
	// Registerer receives the pinboard_* collectors.
	Registerer prometheus.Registerer
	// Registry serves worker registrations (/registry/register, heartbeat).
	Registry *Registry
	// Health adds the consensus view to GET /registry/health (leader,
	// raft state, ...).
	Health func() map[string]any
	// Quarantine is the cold-start quarantine: a fresh directory refuses
	// placements this long from its first placement attempt. One lease
	// TTL in a fleet; 0 for a single dev node, where no other worker can
	// still be holding an id.
	Quarantine time.Duration
	// Ready reports whether local parts (plugins) are up.
	Ready func() bool
	// Status returns extra status for /_pinned/status (plugins, instances).
	Status func() map[string]any
}

// FrontDoor is the node's HTTP entry point.
type FrontDoor struct {
	cfg      FrontDoorConfig
	mux      *http.ServeMux
	stopping atomic.Bool

	resolutions *prometheus.CounterVec
}

// NewFrontDoor builds the handler.
func NewFrontDoor(cfg FrontDoorConfig) *FrontDoor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tokens == nil {
		cfg.Tokens = NewTokens()
	}
	f := &FrontDoor{cfg: cfg, mux: http.NewServeMux()}
	f.resolutions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pinboard_placement_resolutions_total",
		Help: "Placement resolutions at this front door, by outcome.",
	}, []string{"outcome"})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.resolutions)
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinned_lease_healthy", Help: "1 while this worker's lease is healthy.",
		}, func() float64 {
			if cfg.Worker.Lease(time.Now()) == LeaseHealthy {
				return 1
			}
			return 0
		}))
	}
	f.mux.HandleFunc("GET /healthz", f.healthz)
	f.mux.HandleFunc("GET /readyz", f.readyz)
	if cfg.Metrics != nil {
		f.mux.Handle("GET /metrics", cfg.Metrics)
	}
	f.mux.HandleFunc("GET /_pinned/status", f.requireScope(ScopeOperator, f.status))
	f.mux.HandleFunc("GET /_pinned/challenge", cfg.Worker.ServeChallenge)
	f.mux.HandleFunc("GET /registry/health", f.registryHealth)
	f.mux.HandleFunc("GET /registry/workers", f.requireScope(ScopeOperator, f.registryWorkers))
	if cfg.Registry != nil {
		f.mux.HandleFunc("POST /registry/register", f.requireScope(ScopeWorker, f.registryRegister))
		f.mux.HandleFunc("POST /registry/heartbeat", f.requireScope(ScopeWorker, f.registryHeartbeat))
		f.mux.HandleFunc("POST /registry/deregister", f.requireScope(ScopeWorker, f.registryDeregister))
	}
	f.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	})
	return f
}

// Handle mounts h on the front door's mux (registry, raft, ...).
func (f *FrontDoor) Handle(pattern string, h http.Handler) { f.mux.Handle(pattern, h) }

// SetStopping makes new instance requests answer 503 + Retry-After.
func (f *FrontDoor) SetStopping() { f.stopping.Store(true) }

func (f *FrontDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		// A panic in the control plane must not reach the client as a
		// dropped connection; net/http would only log it.
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			f.cfg.Logger.Error("front door panicked", "panic", p, "path", r.URL.Path)
			httpx.WriteError(w, http.StatusInternalServerError, "internal error", 0)
		}
	}()
	if isInstancePath(r.URL.Path) {
		// Instance paths bypass the mux: it would clean "/ns//x" or
		// "/ns/../x" and redirect to a different id; those are bad ids.
		f.instance(w, r)
		return
	}
	f.mux.ServeHTTP(w, r)
}

// isInstancePath: anything whose first segment is not one of the front
// door's own (reserved names, or starting with "_").
func isInstancePath(p string) bool {
	seg, _, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	return seg != "" && seg[0] != '_' && !plugins.Reserved[seg]
}

func (f *FrontDoor) requireScope(scope Scope, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !f.cfg.Tokens.Allowed(r, scope) {
			if r.Header.Get("Authorization") == "" {
				httpx.WriteError(w, http.StatusUnauthorized, "unauthorized", 0)
			} else {
				httpx.WriteError(w, http.StatusForbidden, "forbidden", 0)
			}
			return
		}
		h(w, r)
	}
}

func (f *FrontDoor) healthz(w http.ResponseWriter, _ *http.Request) {
	httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz follows the seed's readiness table: 503 while waiting for the
// first registration or past the lease's expiry; 200 while registered,
// also when the lease is merely unhealthy or the node is draining.
func (f *FrontDoor) readyz(w http.ResponseWriter, _ *http.Request) {
	lease := f.cfg.Worker.Lease(time.Now())
	ready := f.cfg.Ready == nil || f.cfg.Ready()
	body := map[string]any{"lease": lease.String(), "plugins": ready}
	code := http.StatusOK
	if !ready || lease == LeaseUnregistered || lease == LeaseExpired || f.stopping.Load() {
		code = http.StatusServiceUnavailable
	}
	httpx.WriteJSON(w, code, body)
}

func (f *FrontDoor) status(w http.ResponseWriter, _ *http.Request) {
	body := map[string]any{"worker": f.cfg.Worker.Status()}
	if f.cfg.Status != nil {
		for k, v := range f.cfg.Status() {
			body[k] = v
		}
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}

// splitInstancePath parses /<ns>/<id>[/<rest>] from the escaped path.
func splitInstancePath(escaped string) (ns, id, rest string, ok bool) {
	p, found := strings.CutPrefix(escaped, "/")
	if !found {
		return "", "", "", false
	}
	seg, after, _ := strings.Cut(p, "/")
	ns = "/" + seg
	id, rest, hasRest := strings.Cut(after, "/")
	if hasRest {
		rest = "/" + rest
	} else {
		rest = "/"
	}
	return ns, id, rest, true
}

func (f *FrontDoor) instance(w http.ResponseWriter, r *http.Request) {
	ns, id, rest, ok := splitInstancePath(r.URL.EscapedPath())
	if !ok || plugins.ValidateNamespace(ns) != nil || !f.knownNamespace(ns) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
		return
	}
	if err := plugins.ValidateID(id); err != nil {
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
		return
	}
	if f.stopping.Load() {
		httpx.WriteError(w, http.StatusServiceUnavailable, "node is shutting down", time.Second)
		return
	}
	f.resolve(w, r, directory.Key{Namespace: ns, ID: id}, rest)
}

// knownNamespace: served here, or by any worker the directory knows.
func (f *FrontDoor) knownNamespace(ns string) bool {
	if f.cfg.Local != nil && f.cfg.Local.Serves(ns) {
		return true
	}
	for _, wk := range f.cfg.Dir.Machine().Workers() {
		if wk.Serves(ns) {
			return true
		}
	}
	return false
}

// resolve finds (or makes) the placement of key and serves the request
// there.
func (f *FrontDoor) resolve(w http.ResponseWriter, r *http.Request, key directory.Key, rest string) {
	self := f.cfg.Worker.ClientID()
	now := time.Now()
	// A live local instance is this node's own record of a placement it
	// was granted; the local replica may not have applied the grant yet
	// (or ever, if the leader died right after committing it). Serving it
	// is as safe as the lease allows.
	if f.cfg.Local != nil && f.cfg.Local.Live(key.Namespace, key.ID) {
		switch lease := f.cfg.Worker.Lease(now); lease {
		case LeaseHealthy, LeaseUnhealthy:
			if f.cfg.Local.ServeExisting(w, r, key.Namespace, key.ID, rest) {
				f.resolutions.WithLabelValues("local").Inc()
				return
			}
		default:
			f.refuse(w, lease)
			return
		}
	}
	m := f.cfg.Dir.Machine()
	if p, owner, ok := m.Owner(key); ok {
		if p.Owner == self {
			f.resolutions.WithLabelValues("local").Inc()
			f.serveLocal(w, r, p, rest)
			return
		}
		if owner.Live(now.UnixMilli()) {
			// Serving another node's ids is the fleet data plane's job.
			f.resolutions.WithLabelValues("remote").Inc()
			httpx.WriteError(w, http.StatusServiceUnavailable, "placed on another node", time.Second)
			return
		}
	}
	if f.cfg.Local == nil || !f.cfg.Local.Serves(key.Namespace) {
		f.resolutions.WithLabelValues("no-backends").Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "no live workers for namespace", time.Second)
		return
	}
	if lease := f.cfg.Worker.Lease(now); lease != LeaseHealthy {
		f.refuse(w, lease)
		return
	}
	// A claim waits for the leader at most claimTimeout: a client is
	// better served by a prompt 503 + Retry-After than a hung request.
	ctx, cancel := context.WithTimeout(r.Context(), claimTimeout)
	defer cancel()
	var res directory.Result
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		res, err = f.cfg.Dir.Do(ctx, directory.Claim{
			Key: key, ClientID: self, Now: time.Now().UnixMilli(), QuarantineMs: f.cfg.Quarantine.Milliseconds(),
		})
		if err != nil || res.Code != directory.CodeConflict {
			break
		}
	}
	if err != nil {
		if r.Context().Err() == nil {
			f.cfg.Logger.Warn("claim failed", "key", key.String(), "err", err)
			httpx.WriteError(w, http.StatusServiceUnavailable, "directory unavailable", time.Second)
		}
		return
	}
	switch res.Code {
	case directory.CodeGranted, directory.CodeExisting:
		f.resolutions.WithLabelValues("placed").Inc()
		f.serveLocal(w, r, res.Placement, rest)
	case directory.CodeQuarantine:
		f.resolutions.WithLabelValues("quarantine").Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "cold start quarantine", time.Duration(res.RemainingMs)*time.Millisecond)
	case directory.CodeHeld:
		f.resolutions.WithLabelValues("remote").Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "placed on another node", time.Second)
	default:
		f.resolutions.WithLabelValues("refused").Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "placement refused: "+res.Reason, time.Second)
	}
}

// serveLocal serves an id placed on this node, as the worker's lease allows.
func (f *FrontDoor) serveLocal(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	switch lease := f.cfg.Worker.Lease(time.Now()); lease {
	case LeaseHealthy:
	case LeaseUnhealthy:
		if !f.cfg.Local.Live(p.Key.Namespace, p.Key.ID) {
			f.refuse(w, lease)
			return
		}
	default:
		f.refuse(w, lease)
		return
	}
	f.cfg.Local.ServeInstance(w, r, p.Key.Namespace, p.Key.ID, p.Generation, rest)
}

// refuse answers for a worker whose lease does not allow the request.
func (f *FrontDoor) refuse(w http.ResponseWriter, lease LeaseState) {
	switch lease {
	case LeaseUnhealthy:
		w.Header().Set(RefusalHeader, "lease-unhealthy")
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease unhealthy", time.Second)
	case LeaseUnregistered:
		httpx.WriteError(w, http.StatusServiceUnavailable, "worker not registered yet", time.Second)
	default:
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease expired", time.Second)
	}
}

// Released is the supervisor's OnEvicted hook: give the placement back.
func (f *FrontDoor) Released(ns, id string, generation uint64, release bool) {
	if !release {
		return
	}
	if f.cfg.Worker.Lease(time.Now()) == LeaseExpired {
		// Our session is lapsing anyway, and with it the placement; a
		// directory we cannot renew with would not take the release either.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	key := directory.Key{Namespace: ns, ID: id}
	if _, err := f.cfg.Dir.Do(ctx, directory.Release{Key: key, ClientID: f.cfg.Worker.ClientID(), Generation: generation}); err != nil {
		f.cfg.Logger.Warn("release placement failed", "key", key.String(), "err", err)
	}
}
