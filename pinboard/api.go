package pinboard

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// api is the front door's own HTTP API, mounted on the router's mux: the
// probes (/healthz, /readyz), node status, the registry's routes for
// workers (register, heartbeat, deregister, release) and the operator's
// (workers, health, stats, overview, drain, wind-down, plugin reload),
// and the owner-side operator routes other nodes call attested.
type api struct {
	dir        *Directory
	worker     *Worker   // nil on a node without hosts
	registry   *Registry // nil: this node serves no registrations
	tokens     *Tokens
	res        *resolver     // selfID, storeHealth, knownNamespace
	owner      *ownerSide    // attested (the owner-side operator routes)
	peer       peerTransport // attested calls to other nodes (stats, wind-down)
	logger     *slog.Logger
	quarantine time.Duration
	stopping   func() bool // the node is shutting down: not ready

	metrics       http.Handler
	metricsPublic bool
	health        func() map[string]any
	ready         func() bool
	status        func() map[string]any
	workerStats   func(ctx context.Context) map[string]any
	drainHook     func(deadline time.Time, cordon bool)
	windDown      func(ns, id string, deadline time.Time) int
	reload        func(ctx context.Context, ns string) error
	https         bool // the front door serves TLS
}

// mount registers the API's routes on mux.
func (a *api) mount(mux *routeMux) {
	// operator routes read or act on the whole fleet; operatorNS ones name
	// the namespaces they touch and check the key's claims themselves.
	operator := func(h http.HandlerFunc) http.HandlerFunc { return a.tokens.RequireFleet(h, ScopeOperator) }
	operatorNS := func(h http.HandlerFunc) http.HandlerFunc { return a.tokens.Require(h, ScopeOperator) }
	worker := func(h http.HandlerFunc) http.HandlerFunc { return a.tokens.Require(h, ScopeWorker) }
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	if a.metrics != nil && a.metricsPublic {
		mux.Handle("GET /metrics", a.metrics)
	} else if a.metrics != nil {
		// Metrics name namespaces, nodes and load, an operator's business
		// (--metrics-public opts out).
		mux.HandleFunc("GET /metrics", operator(a.metrics.ServeHTTP))
	}
	mux.HandleFunc("GET /_pinned/status", operator(a.nodeStatus))
	if a.worker != nil {
		mux.HandleFunc("GET /_pinned/challenge", a.worker.ServeChallenge)
	}
	mux.HandleFunc("GET /registry/health", a.registryHealth)
	mux.HandleFunc("GET /registry/stats", operator(a.registryStats))
	mux.HandleFunc("GET "+statsPath, a.ownerStats)
	mux.HandleFunc("POST /registry/drain", operatorNS(a.registryDrain))
	mux.HandleFunc("POST /registry/undrain", operatorNS(a.registryUndrain))
	mux.HandleFunc("POST /registry/wind_down", operatorNS(a.registryWindDown))
	mux.HandleFunc("GET /registry/overview", operator(a.registryOverview))
	mux.HandleFunc("POST "+windDownPath, a.ownerWindDown)
	mux.HandleFunc("POST /_pinned/drain", operator(a.localDrain))
	mux.HandleFunc("POST /_pinned/undrain", operator(a.localUndrain))
	mux.HandleFunc("POST /_pinned/plugins/reload", operatorNS(a.pluginsReload))
	mux.HandleFunc("GET /registry/workers", operator(a.registryWorkers))
	if a.registry != nil {
		mux.HandleFunc("POST /registry/register", worker(a.registryRegister))
		mux.HandleFunc("POST /registry/heartbeat", worker(a.registryHeartbeat))
		mux.HandleFunc("POST /registry/deregister", worker(a.registryDeregister))
		mux.HandleFunc("POST /registry/release", worker(a.registryRelease))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	})
}

func (a *api) healthz(w http.ResponseWriter, _ *http.Request) {
	httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is 503 while waiting for the first registration (and until this
// node's replica has applied it: before that the node cannot route, see
// resolver.caughtUp) or past the lease's expiry, and 200 while registered,
// also when the lease is merely unhealthy or the node is draining (it
// still serves what it holds). A
// state store that has failed for its grace (StoreHealth) is 503 too, with
// the reason, and so is a node shutting down. Namespaces whose plugin
// crash-loops here are listed ("degraded"); the node stays ready, as its
// front door still routes them to other nodes.
//
// A node without hosts (--no-hosts) has no lease: it is ready when Ready
// says so (it follows a leader).
func (a *api) readyz(w http.ResponseWriter, _ *http.Request) {
	body := a.readiness()
	code := http.StatusOK
	if body["ready"] != true || a.stopping() {
		code = http.StatusServiceUnavailable
	}
	httpx.WriteJSON(w, code, body)
}

// scheme is how the front door serves clients: "https", or "http" (keys
// and bodies in clear), for /readyz and status.
func (a *api) scheme() string {
	if a.https {
		return "https"
	}
	return "http"
}

// readiness is /readyz's body: "ready", and why not (lease, stateStore,
// reason); "cluster": "insecure" on a node whose node-to-node traffic runs
// without mutual TLS (--insecure-cluster), and "frontDoor" (http or
// https), for whoever watches readiness.
func (a *api) readiness() map[string]any {
	ready := a.ready == nil || a.ready()
	body := map[string]any{}
	if a.worker != nil {
		lease := a.worker.Lease(time.Now())
		body["lease"] = lease.String()
		ready = ready && lease != LeaseUnregistered && lease != LeaseExpired
		if !a.res.caughtUp() {
			ready = false
			body["directory"] = "catching up"
		}
	}
	if a.owner != nil && a.owner.local != nil {
		// Still ready: the front door routes every id, and the node
		// serves its other namespaces; these it gives up to other nodes.
		if nss := a.owner.local.DegradedNamespaces(); len(nss) > 0 {
			body["degraded"] = nss
		}
	}
	if err := a.res.storeHealth(); err != nil {
		ready = false
		body["stateStore"] = "unavailable"
		body["reason"] = err.Error()
	}
	if !a.peer.secure() {
		body["cluster"] = "insecure"
	}
	body["frontDoor"] = a.scheme()
	body["ready"] = ready
	return body
}

// nodeStatus serves GET /_pinned/status: the worker's state and what the
// Status hook adds (plugins, instances).
func (a *api) nodeStatus(w http.ResponseWriter, _ *http.Request) {
	body := map[string]any{"frontDoor": a.scheme()}
	if a.worker != nil {
		body["worker"] = a.worker.Status()
	}
	if a.status != nil {
		for k, v := range a.status() {
			body[k] = v
		}
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}
