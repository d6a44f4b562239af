package pinboard

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/prometheus/client_golang/prometheus"
)

// API is the control plane's HTTP API, mounted on the front door's mux:
// the probes (/healthz, /readyz), node status, the registry's routes for
// workers (register, heartbeat, deregister, release) and the operator's
// (workers, health, stats, overview, drain, wind-down, plugin reload),
// and the owner-side operator routes other nodes call attested (stats,
// wind-down).
type API struct {
	cfg APIConfig // with a Logger and a Stopping (NewAPI's defaults)
}

// worker is this node's worker, nil on a node without hosts.
func (a *API) worker() *Worker { return a.cfg.Self.Worker() }

// Instances is what the API asks of this node's instances (the
// supervisor's answers).
type Instances interface {
	// StoreHealth is the local state store's health (nil: fine).
	StoreHealth() error
	// Serves: a plugin of this node serves ns.
	Serves(ns string) bool
	// DegradedNamespaces are those whose plugin crash-loops here.
	DegradedNamespaces() []string
}

// Peers reaches other nodes' owner-side routes, over the transport the
// front door's forwarder uses.
type Peers interface {
	// Base is the URL (no trailing slash) under which w's node serves
	// the owner-side routes.
	Base(w directory.Worker) string
	// Client carries requests there.
	Client() *http.Client
	// Secure: they run over the cluster's mutual TLS.
	Secure() bool
}

// APIConfig wires an API: the control plane's parts and the agent's hooks
// into the node's other parts.
type APIConfig struct {
	Dir      *Directory
	Self     *Self
	Registry *Registry // serves worker registrations; nil: none
	Tokens   *Tokens
	Gate     *OwnerGate
	// Local is this node's instances; nil on a node without hosts.
	Local Instances
	Peers Peers
	// Stopping reports the node shutting down: /readyz says 503.
	Stopping func() bool
	Logger   *slog.Logger
	// Registerer receives the control plane's node collectors (tokens,
	// attestation failures, lease and drain gauges); nil: none.
	Registerer prometheus.Registerer
	// Quarantine is the cold-start quarantine the registry reports.
	Quarantine time.Duration
	// Metrics serves /metrics; MetricsPublic serves it without a token.
	Metrics       http.Handler
	MetricsPublic bool
	// Health adds the consensus view to GET /registry/health.
	Health func() map[string]any
	// Ready reports whether local parts (plugins, Raft) are up.
	Ready func() bool
	// Status returns extra status for /_pinned/status.
	Status func() map[string]any
	// WorkerStats reports this worker's instances and process for
	// /_pinned/stats (the API adds the lease counters).
	WorkerStats func(ctx context.Context) map[string]any
	// Drain drains this node (source local) until a deadline, or cordons
	// it; zero and false revoke. Nil on a node without hosts.
	Drain func(deadline time.Time, cordon bool)
	// WindDown sets (zero: revokes) an operator's eviction deadline for
	// one live instance, or every one of a namespace in an env (ID ""),
	// here.
	WindDown func(k directory.Key, deadline time.Time) int
	// Reload hot-swaps the plugin serving ns ("" all).
	Reload func(ctx context.Context, ns string) error
	// AddPlugin starts a plugin at run time (--plugin's /NS=PATH) and
	// returns the namespaces it serves; RemovePlugin ends the one serving
	// ns and returns the namespaces it served. nil: the node cannot.
	AddPlugin    func(ctx context.Context, plugin string) ([]string, error)
	RemovePlugin func(ctx context.Context, ns string) ([]string, error)
	// HTTPS: the front door serves TLS (reported by /readyz and status).
	HTTPS bool
}

// NewAPI builds the API from cfg and registers its collectors.
func NewAPI(cfg APIConfig) *API {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Stopping == nil {
		cfg.Stopping = func() bool { return false }
	}
	a := &API{cfg: cfg}
	if a.worker() != nil && a.cfg.Local != nil {
		a.worker().setUnfit(a.cfg.Local.StoreHealth)
	}
	if a.worker() != nil {
		self, logger := a.worker().ClientID(), a.cfg.Logger
		a.cfg.Dir.Machine().OnTakeover(func(t directory.Takeover) {
			if t.Owner == self {
				logger.Info("took over instance", "instance", t.Key.String(), "generation", t.Generation,
					"previous_owner", t.Previous, "previous_node", t.PreviousNode)
			}
		})
	}
	if cfg.Registerer != nil {
		a.register(cfg.Registerer)
	}
	return a
}

// register registers the API's collectors with reg: the tokens', the
// gate's and the worker's gauges.
func (a *API) register(reg prometheus.Registerer) {
	reg.MustRegister(a.cfg.Tokens.Collector())
	reg.MustRegister(a.cfg.Gate.Collectors()...)
	worker := a.worker()
	if worker == nil {
		return
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pinned_lease_healthy", Help: "1 while this worker's lease is healthy.",
	}, func() float64 {
		if worker.Lease(time.Now()) == LeaseHealthy {
			return 1
		}
		return 0
	}))
	for _, src := range []string{DrainSourceLocal, DrainSourceOperator} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinned_draining", Help: "1 while a drain from source (local: this node's own, operator: POST /registry/drain) is in force here.",
			ConstLabels: prometheus.Labels{"source": src},
		}, func() float64 {
			if worker.DrainingBy(src) {
				return 1
			}
			return 0
		}))
	}
}

// Mux is where the API mounts its routes (the front door's).
type Mux interface {
	Handle(pattern string, h http.Handler)
	HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request))
}

// Mount registers the API's routes on mux.
func (a *API) Mount(mux Mux) {
	// operator routes read or act on the whole fleet; operatorNS ones name
	// the namespaces they touch and check the key's claims themselves.
	operator := func(h http.HandlerFunc) http.HandlerFunc { return a.cfg.Tokens.RequireFleet(h, ScopeOperator) }
	operatorNS := func(h http.HandlerFunc) http.HandlerFunc { return a.cfg.Tokens.Require(h, ScopeOperator) }
	worker := func(h http.HandlerFunc) http.HandlerFunc { return a.cfg.Tokens.Require(h, ScopeWorker) }
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	if a.cfg.Metrics != nil && a.cfg.MetricsPublic {
		mux.Handle("GET /metrics", a.cfg.Metrics)
	} else if a.cfg.Metrics != nil {
		// Metrics name namespaces, nodes and load, an operator's business
		// (--metrics-public opts out).
		mux.HandleFunc("GET /metrics", operator(a.cfg.Metrics.ServeHTTP))
	}
	mux.HandleFunc("GET /_pinned/status", operator(a.nodeStatus))
	if a.worker() != nil {
		mux.HandleFunc("GET /_pinned/challenge", a.worker().ServeChallenge)
	}
	mux.HandleFunc("GET /registry/health", a.registryHealth)
	mux.HandleFunc("GET /registry/stats", operator(a.registryStats))
	mux.HandleFunc("GET "+StatsPath, a.ownerStats)
	mux.HandleFunc("POST /registry/drain", operatorNS(a.registryDrain))
	mux.HandleFunc("POST /registry/undrain", operatorNS(a.registryUndrain))
	mux.HandleFunc("POST /registry/wind_down", operatorNS(a.registryWindDown))
	mux.HandleFunc("GET /registry/overview", operator(a.registryOverview))
	mux.HandleFunc("POST "+WindDownPath, a.ownerWindDown)
	mux.HandleFunc("POST /_pinned/drain", operator(a.localDrain))
	mux.HandleFunc("POST /_pinned/undrain", operator(a.localUndrain))
	mux.HandleFunc("POST /_pinned/plugins/reload", operatorNS(a.pluginsReload))
	mux.HandleFunc("POST /_pinned/plugins/add", operatorNS(a.pluginsAdd))
	mux.HandleFunc("POST /_pinned/plugins/remove", operatorNS(a.pluginsRemove))
	mux.HandleFunc("GET /registry/workers", operator(a.registryWorkers))
	if a.cfg.Registry != nil {
		mux.HandleFunc("POST /registry/register", worker(a.registryRegister))
		mux.HandleFunc("POST /registry/heartbeat", worker(a.registryHeartbeat))
		mux.HandleFunc("POST /registry/deregister", worker(a.registryDeregister))
		mux.HandleFunc("POST /registry/release", worker(a.registryRelease))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	})
}

// hostnameAware: the registry runs in hostname-aware mode (seed 004).
func (a *API) hostnameAware() bool { return a.cfg.Registry != nil && a.cfg.Registry.IsHostnameAware() }

func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
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
func (a *API) readyz(w http.ResponseWriter, _ *http.Request) {
	body := a.readiness()
	code := http.StatusOK
	if body["ready"] != true || a.cfg.Stopping() {
		code = http.StatusServiceUnavailable
	}
	httpx.WriteJSON(w, code, body)
}

// scheme is how the front door serves clients: "https", or "http" (keys
// and bodies in clear), for /readyz and status.
func (a *API) scheme() string {
	if a.cfg.HTTPS {
		return "https"
	}
	return "http"
}

// readiness is /readyz's body: "ready", and why not (lease, stateStore,
// reason); "cluster": "insecure" on a node whose node-to-node traffic runs
// without mutual TLS (--insecure-cluster), and "frontDoor" (http or
// https), for whoever watches readiness.
func (a *API) readiness() map[string]any {
	ready := a.cfg.Ready == nil || a.cfg.Ready()
	body := map[string]any{}
	if a.worker() != nil {
		lease := a.worker().Lease(time.Now())
		body["lease"] = lease.String()
		ready = ready && lease != LeaseUnregistered && lease != LeaseExpired
		if !a.cfg.Self.CaughtUp() {
			ready = false
			body["directory"] = "catching up"
		}
		if dropped := a.worker().Dropped(); len(dropped) > 0 {
			// The seeds' superseded worker is not ready until retired: here,
			// until its plugin is removed (pinnedd plugins remove).
			ready = false
			body["superseded"] = dropped
		}
	}
	if a.cfg.Local != nil {
		// Still ready: the front door routes every id, and the node
		// serves its other namespaces; these it gives up to other nodes.
		if nss := a.cfg.Local.DegradedNamespaces(); len(nss) > 0 {
			body["degraded"] = nss
		}
	}
	if err := a.storeHealth(); err != nil {
		ready = false
		body["stateStore"] = "unavailable"
		body["reason"] = err.Error()
	}
	if !a.cfg.Peers.Secure() {
		body["cluster"] = "insecure"
	}
	body["frontDoor"] = a.scheme()
	body["ready"] = ready
	return body
}

// nodeStatus serves GET /_pinned/status: the worker's state and what the
// Status hook adds (plugins, instances).
func (a *API) nodeStatus(w http.ResponseWriter, _ *http.Request) {
	body := map[string]any{"frontDoor": a.scheme()}
	if a.worker() != nil {
		body["worker"] = a.worker().Status()
	}
	if a.cfg.Status != nil {
		for k, v := range a.cfg.Status() {
			body[k] = v
		}
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}

// storeHealth is the local state store's health (nil: fine, or none).
func (a *API) storeHealth() error {
	if a.cfg.Local == nil {
		return nil
	}
	return a.cfg.Local.StoreHealth()
}

// knownNamespace: served here, or by any worker the directory knows.
func (a *API) knownNamespace(ns string) bool {
	if a.cfg.Local != nil && a.cfg.Local.Serves(ns) {
		return true
	}
	return a.cfg.Dir.Machine().NamespaceServed(ns)
}
