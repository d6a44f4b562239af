package pinboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
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
const RefusalHeader = plugins.HeaderRefusal

// storeHealth is the local state store's health (nil: fine, or none).
// While it is not nil the node is not ready and takes no new placements.
func (f *FrontDoor) storeHealth() error {
	if f.cfg.Local == nil {
		return nil
	}
	return f.cfg.Local.StoreHealth()
}

// ownerHeaderTimeout bounds the wait for a forwarded request's response
// headers (activation included: the supervisor bounds that at 30 s, but an
// activation restoring state normally takes milliseconds).
const ownerHeaderTimeout = 10 * time.Second

// FrontDoorConfig wires a FrontDoor.
type FrontDoorConfig struct {
	Dir    *Directory
	Worker *Worker
	// Local runs this node's instances; nil on a node without hosts.
	Local   *supervisor.Supervisor
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
	// Transport carries node-to-node requests; nil is a plain
	// http.Transport. Mutual TLS between nodes plugs in here.
	Transport http.RoundTripper
	// Policy chooses the worker for a new placement.
	Policy PlacementPolicy
	// TrustedProxies are the peers whose forwarding headers name the
	// client IP (PINBOARD_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
	// AffinityKey, if set, is the programmatic affinity for a request:
	// nil keeps client-IP affinity, "" asks for power of two choices, a
	// string is a rendezvous preference. It must not consume the body.
	AffinityKey func(*http.Request) *string
	// WorkerStats reports this worker's instances and process for
	// /_pinned/stats (the front door adds the lease counters).
	WorkerStats func(ctx context.Context) map[string]any
	// Drain drains this node (source local) until a deadline, or cordons
	// it; zero and false revoke. Nil on a node without hosts.
	Drain func(deadline time.Time, cordon bool)
	// WindDown sets (zero: revokes) an operator's eviction deadline for
	// one live instance, or every one of a namespace (id ""), here.
	WindDown func(ns, id string, deadline time.Time) int
	// Reload hot-swaps the plugin serving ns ("" all).
	Reload func(ctx context.Context, ns string) error
	// ClusterCalls names the namespaces a cluster-call credential (from
	// plugins.HeaderClusterCall) speaks for, ok false for one no live
	// plugin process of this node holds (supervisor.VerifyClusterCall).
	// nil: no cluster calls.
	ClusterCalls func(token string) (namespaces []string, ok bool)
	// AttestationWindow bounds an attestation's age and the replay cache
	// (default DefaultAttestationWindow).
	AttestationWindow time.Duration
	// AccessLog logs one line per front-door request (method, path,
	// status, bytes, duration, served here or forwarded to which node).
	// It keeps every connection in net/http: the kept-alive loop is off.
	AccessLog bool
	// MetricsPublic serves /metrics without a token (a scraper on a
	// trusted network); otherwise it needs operator scope.
	MetricsPublic bool
	// BodyReadTimeout cuts a request whose body goes this long without
	// a byte (each read of it must return within it); 0: no bound.
	BodyReadTimeout time.Duration
	// MaxConnsPerIP and MaxConns cap the client connections Listener
	// keeps open, from one IP and in all (0: no cap). The fleet's own
	// nodes (PeerAddrs, workers' advertise URLs) and TrustedProxies are
	// exempt from the per-IP cap.
	MaxConnsPerIP, MaxConns int
	// PeerAddrs lists the front-door addresses (URL or host:port) of the
	// other Raft members, for the per-IP cap's exemption. It may block
	// briefly; it is called at most once a second, off the accept path.
	PeerAddrs func() []string
	// FastPath lets connections that carried a plain request move to the
	// kept-alive loop, which serves their next plain requests without
	// net/http (package relay; Linux only). Off, every request takes
	// net/http's path: the same answers, more CPU per request.
	FastPath bool
	// IdleTimeout closes a kept-alive client connection that sent nothing
	// for this long (net/http's IdleTimeout; 0: net/http's default, the
	// header timeout).
	IdleTimeout time.Duration
}

// FrontDoor is the node's HTTP entry point.
type FrontDoor struct {
	cfg      FrontDoorConfig
	mux      *http.ServeMux
	srv      *http.Server // Serve's
	stopping atomic.Bool
	proxy    *httputil.ReverseProxy
	sync     *httpx.SyncTransport // the default node-to-node transport; nil with a custom one
	client   *http.Client         // node-to-node calls of the front door's own (stats)
	bufs     httpx.BufferPool
	relay    *relay.Loop     // held forwarded streams, out of net/http
	conns    *relay.Conns    // kept-alive forwarded connections, out of net/http
	handBack *relay.HandBack // where conns gives connections back
	// keepAliveOn: connections the loop gives back are served, so the
	// loop may take them (serveHandBacks).
	keepAliveOn atomic.Bool
	loopBases   sync.Map // advertise URL -> loopBase (Route)
	verifier    Verifier
	limiter     *ConnLimiter
	peers       peerSet

	resolutions     *prometheus.CounterVec
	forwardFailures *prometheus.CounterVec
	attestFailures  *prometheus.CounterVec
	relayEnds       *prometheus.CounterVec
	forwardSeconds  prometheus.Histogram
	// resolvedForwarded and resolvedLocal are resolutions{outcome=...},
	// looked up once.
	resolvedForwarded, resolvedLocal prometheus.Counter
}

// NewFrontDoor builds the handler.
func NewFrontDoor(cfg FrontDoorConfig) *FrontDoor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tokens == nil {
		cfg.Tokens = NewTokens()
	}
	f := &FrontDoor{cfg: cfg, mux: http.NewServeMux(), verifier: Verifier{Window: cfg.AttestationWindow}, relay: relay.New(cfg.Logger)}
	var tr http.RoundTripper = cfg.Transport
	if tr == nil {
		std := &http.Transport{
			Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second,
			DialContext: (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			// An owner that accepts the connection but never answers (a
			// frozen process) must not hold the client forever: after
			// this the client gets 503 + Retry-After and retries, by which
			// time the owner's lease may have lapsed and the id moved.
			ResponseHeaderTimeout: ownerHeaderTimeout,
		}
		f.client = &http.Client{Transport: std}
		f.sync = &httpx.SyncTransport{Fallback: std, ResponseHeaderTimeout: ownerHeaderTimeout}
		f.proxy = f.newProxy(f.sync)
	} else {
		f.client = &http.Client{Transport: tr}
		f.proxy = f.newProxy(tr)
	}
	f.resolutions = newCounterVec("pinboard_placement_resolutions_total",
		"Placement resolutions at this front door, by outcome.", "outcome", resolutionOutcomes)
	f.forwardFailures = newCounterVec("pinboard_forward_failures_total",
		"Requests this front door could not complete at the owner, by outcome.", "outcome", forwardOutcomes)
	f.attestFailures = newCounterVec("pinned_attestation_failures_total",
		"Owner-side requests refused for their attestation, by reason.", "reason", attestReasons)
	f.relayEnds = newCounterVec("pinboard_relayed_streams_ended_total",
		"Held forwarded streams the relay loop carried, by how they ended.", "reason", relayEndReasons)
	f.forwardSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "pinboard_forward_duration_seconds",
		Help: "Requests this front door forwarded to their owner's node (the node-to-node hop and the owner's work), " +
			"from the forward's start until the response ended here or, for a held stream, went to the relay loop.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60},
	})
	f.resolvedForwarded = f.resolutions.WithLabelValues(outcomeForwarded)
	f.resolvedLocal = f.resolutions.WithLabelValues(outcomeLocal)
	f.limiter = NewConnLimiter(ConnLimits{PerIP: cfg.MaxConnsPerIP, Total: cfg.MaxConns, Exempt: f.exemptFromIPCap},
		cfg.Logger, cfg.Registerer)
	f.handBack = relay.NewHandBack()
	f.conns = relay.NewConns(cfg.Logger, f, f.handBack.Give, ownerHeaderTimeout)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.resolutions, f.forwardFailures, f.attestFailures, f.relayEnds, f.forwardSeconds)
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinboard_kept_alive_connections", Help: "Client connections the kept-alive loop serves now, out of net/http.",
		}, func() float64 { return float64(f.conns.Len()) }))
		cfg.Registerer.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pinboard_kept_alive_requests_total",
			Help: "Requests the kept-alive loop carried itself: forwarded to their owner's node, or (on the owner) relayed to the plugin.",
		}, func() float64 { return float64(f.conns.Served()) }))
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinboard_relayed_streams", Help: "Held forwarded streams the relay loop carries now.",
		}, func() float64 { return float64(f.relay.Len()) }))
		if cfg.Worker != nil {
			cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "pinned_lease_healthy", Help: "1 while this worker's lease is healthy.",
			}, func() float64 {
				if cfg.Worker.Lease(time.Now()) == LeaseHealthy {
					return 1
				}
				return 0
			}))
			for _, src := range []string{DrainSourceLocal, DrainSourceOperator} {
				cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "pinned_draining", Help: "1 while a drain from source (local: this node's own, operator: POST /registry/drain) is in force here.",
					ConstLabels: prometheus.Labels{"source": src},
				}, func() float64 {
					if cfg.Worker.DrainingBy(src) {
						return 1
					}
					return 0
				}))
			}
		}
	}
	if cfg.Local != nil && cfg.Worker != nil {
		cfg.Worker.setUnfit(cfg.Local.StoreHealth)
	}
	if cfg.Worker != nil {
		self := cfg.Worker.ClientID()
		cfg.Dir.Machine().OnTakeover(func(t directory.Takeover) {
			if t.Owner == self {
				cfg.Logger.Info("took over instance", "ns", t.Key.Namespace, "id", t.Key.ID, "generation", t.Generation,
					"previous_owner", t.Previous, "previous_node", t.PreviousNode)
			}
		})
	}
	// No ReadTimeout: it bounds a whole request from its first byte (a
	// slow but steady upload, a body read after a long activation);
	// bodies get a deadline on progress instead (BodyReadTimeout).
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: MaxHeaderBytes, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	f.mux.HandleFunc("GET /healthz", f.healthz)
	f.mux.HandleFunc("GET /readyz", f.readyz)
	if cfg.Metrics != nil && cfg.MetricsPublic {
		f.mux.Handle("GET /metrics", cfg.Metrics)
	} else if cfg.Metrics != nil {
		// As the seed's: metrics name namespaces, nodes and load, an
		// operator's business (--metrics-public opts out).
		f.mux.HandleFunc("GET /metrics", f.RequireScope(ScopeOperator, cfg.Metrics.ServeHTTP))
	}
	f.mux.HandleFunc("GET /_pinned/status", f.RequireScope(ScopeOperator, f.status))
	if cfg.Worker != nil {
		f.mux.HandleFunc("GET /_pinned/challenge", cfg.Worker.ServeChallenge)
	}
	f.mux.HandleFunc("GET /registry/health", f.registryHealth)
	f.mux.HandleFunc("GET /registry/stats", f.RequireScope(ScopeOperator, f.registryStats))
	f.mux.HandleFunc("GET "+statsPath, f.workerStats)
	f.mountOperator()
	f.mux.HandleFunc("GET /registry/workers", f.RequireScope(ScopeOperator, f.registryWorkers))
	if cfg.Registry != nil {
		f.mux.HandleFunc("POST /registry/register", f.RequireScope(ScopeWorker, f.registryRegister))
		f.mux.HandleFunc("POST /registry/heartbeat", f.RequireScope(ScopeWorker, f.registryHeartbeat))
		f.mux.HandleFunc("POST /registry/deregister", f.RequireScope(ScopeWorker, f.registryDeregister))
		f.mux.HandleFunc("POST /registry/release", f.RequireScope(ScopeWorker, f.registryRelease))
	}
	f.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	})
	return f
}

// Serve serves the front door on ln until Shutdown, with its connection
// caps (MaxConnsPerIP, MaxConns) and net/http's bounds; with FastPath, the
// kept-alive loop takes the connections it can serve.
func (f *FrontDoor) Serve(ln net.Listener) error {
	if f.cfg.FastPath {
		f.serveHandBacks(f.srv)
	}
	return f.srv.Serve(f.Listener(ln))
}

// serveHandBacks lets the kept-alive loop take connections from srv: the
// ones it gives back (requests it does not serve itself) are served by srv
// again, until srv shuts down.
func (f *FrontDoor) serveHandBacks(srv *http.Server) {
	f.keepAliveOn.Store(true)
	go func() { _ = srv.Serve(f.handBack) }()
}

// Handle mounts h on the front door's mux (registry, raft, ...).
func (f *FrontDoor) Handle(pattern string, h http.Handler) { f.mux.Handle(pattern, h) }

// Close ends the held streams this front door relays and stops the relay
// loop (http.Server's Shutdown does not see them: they left net/http),
// then closes its pooled connections to owners. Call it after the server
// stopped serving.
func (f *FrontDoor) Close() error {
	f.peers.close()
	_ = f.conns.Close()
	_ = f.handBack.Close()
	err := f.relay.Close()
	if f.sync != nil { // the pools are the front door's own, not a supplied Transport's
		f.sync.Close()
		f.client.CloseIdleConnections()
	}
	return err
}

// Shutdown stops Serve as http.Server's Shutdown does, for net/http's
// connections and the kept-alive loop's alike: no new requests, and every
// request under way gets its response unless ctx ends first (then they
// are cut). Held streams end.
func (f *FrontDoor) Shutdown(ctx context.Context) error {
	err := f.srv.Shutdown(ctx)
	if err != nil {
		_ = f.srv.Close()
	}
	return errors.Join(err, f.shutdownLoops(ctx))
}

// shutdownLoops is Close once every request the kept-alive loop is
// forwarding has had its response, or when ctx is done; the connections
// that left net/http are not its Shutdown's to wait for.
func (f *FrontDoor) shutdownLoops(ctx context.Context) error {
	err := f.conns.Shutdown(ctx)
	return errors.Join(err, f.Close())
}

// SetStopping makes new instance requests answer 503 + Retry-After.
func (f *FrontDoor) SetStopping() {
	f.stopping.Store(true)
	f.conns.Drain()
}

// Listener wraps the front door's listener with its connection caps
// (MaxConnsPerIP, MaxConns): a connection over one is answered 503 +
// Retry-After and closed.
func (f *FrontDoor) Listener(ln net.Listener) net.Listener {
	if f.cfg.MaxConnsPerIP > 0 {
		f.peers.run(f.peerIPs) // until Close
	}
	return f.limiter.Listener(ln)
}

func (f *FrontDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.cfg.BodyReadTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		// Every route: a body that stalls is cut (BodyReadTimeout), a
		// held response after it is not.
		b := newBodyDeadline(w, r.Body, f.cfg.BodyReadTimeout)
		r.Body = b
		defer b.stop()
	}
	if f.cfg.AccessLog {
		f.serveLogged(w, r)
		return
	}
	f.serve(w, r)
}

func (f *FrontDoor) serve(w http.ResponseWriter, r *http.Request) {
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
	if strings.HasPrefix(r.URL.Path, ownerRoutePrefix+"/") {
		f.owned(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, wakePrefix+"/") && r.Method == http.MethodPost {
		f.wakeOwned(w, r)
		return
	}
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

// RequireScope wraps h: only a request that may act with scope reaches
// it (Tokens.Require).
func (f *FrontDoor) RequireScope(scope Scope, h http.HandlerFunc) http.HandlerFunc {
	return f.cfg.Tokens.Require(h, scope)
}

func (f *FrontDoor) healthz(w http.ResponseWriter, _ *http.Request) {
	httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz follows the seed's readiness table: 503 while waiting for the
// first registration or past the lease's expiry; 200 while registered,
// also when the lease is merely unhealthy or the node is draining. A state
// store that has failed for its grace (StoreHealth) is 503 too, with the
// reason.
//
// A node without hosts (--no-hosts) has no lease: it is ready when Ready
// says so (it follows a leader).
func (f *FrontDoor) readyz(w http.ResponseWriter, _ *http.Request) {
	body := f.readiness()
	code := http.StatusOK
	if body["ready"] != true || f.stopping.Load() {
		code = http.StatusServiceUnavailable
	}
	httpx.WriteJSON(w, code, body)
}

// readiness is /readyz's body: "ready", and why not (lease, stateStore,
// reason).
func (f *FrontDoor) readiness() map[string]any {
	ready := f.cfg.Ready == nil || f.cfg.Ready()
	body := map[string]any{}
	if f.cfg.Worker != nil {
		lease := f.cfg.Worker.Lease(time.Now())
		body["lease"] = lease.String()
		ready = ready && lease != LeaseUnregistered && lease != LeaseExpired
	}
	if err := f.storeHealth(); err != nil {
		ready = false
		body["stateStore"] = "unavailable"
		body["reason"] = err.Error()
	}
	body["ready"] = ready
	return body
}

func (f *FrontDoor) status(w http.ResponseWriter, _ *http.Request) {
	body := map[string]any{}
	if f.cfg.Worker != nil {
		body["worker"] = f.cfg.Worker.Status()
	}
	if f.cfg.Status != nil {
		for k, v := range f.cfg.Status() {
			body[k] = v
		}
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}

// splitInstancePath parses /<ns>/<id>[/<rest>] from the escaped path.
func splitInstancePath(escaped string) (ns, id, rest string, ok bool) {
	// Slices of escaped, not new strings: this runs for every request.
	p, ok := strings.CutPrefix(escaped, "/")
	if !ok {
		return "", "", "", false
	}
	i := strings.IndexByte(p, '/')
	if i < 0 {
		return escaped, "", "/", true
	}
	ns, after := escaped[:1+i], p[i+1:]
	if j := strings.IndexByte(after, '/'); j >= 0 {
		return ns, after[:j], after[j:], true
	}
	return ns, after, "/", true
}

// parseInstancePath is the one rule for the instance an escaped path
// /<ns>/<id>[/<rest>] names, on every path that parses one (net/http's
// instance and owner-side routes, the wake route, the kept-alive loop):
// the id segment is unescaped once and the decoded id validated, so a
// client's encodeURIComponent("a:b") (a%3Ab) is the id "a:b"; an escaped
// '/' (%2F) is refused, an id being one path segment. rest stays escaped,
// as the instance receives it. The error wraps plugins.ErrInvalidNamespace
// or plugins.ErrInvalidID.
func parseInstancePath(escaped string) (ns, id, rest string, err error) {
	ns, id, rest, ok := splitInstancePath(escaped)
	if !ok {
		return "", "", "", fmt.Errorf("%w: path must be /<namespace>/<id>/...", plugins.ErrInvalidNamespace)
	}
	if err := plugins.ValidateNamespace(ns); err != nil {
		return "", "", "", err
	}
	if strings.IndexByte(id, '%') >= 0 {
		raw := id
		if id, err = url.PathUnescape(raw); err != nil {
			return "", "", "", fmt.Errorf("%w %q: malformed %%-escape", plugins.ErrInvalidID, raw)
		}
		if strings.IndexByte(id, '/') >= 0 {
			return "", "", "", fmt.Errorf("%w %q: an escaped '/' (%%2F) is not allowed, an id is one path segment", plugins.ErrInvalidID, raw)
		}
	}
	if err := plugins.ValidateID(id); err != nil {
		return "", "", "", err
	}
	return ns, id, rest, nil
}

func (f *FrontDoor) instance(w http.ResponseWriter, r *http.Request) {
	ns, id, rest, err := parseInstancePath(r.URL.EscapedPath())
	if errors.Is(err, plugins.ErrInvalidNamespace) || err == nil && !f.knownNamespace(ns) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
		return
	}
	if err != nil {
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
	return f.cfg.Dir.Machine().NamespaceServed(ns)
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
