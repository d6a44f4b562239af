package frontdoor

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Config wires a FrontDoor: the control plane's parts it routes by (Dir,
// Self, Tokens, Gate), this node's instances (Local) and the front door's
// own limits. The control plane's HTTP API is mounted on it after (Mount).
type Config struct {
	Dir *pinboard.Directory
	// Self is this node's worker (nil without hosts) and replica.
	Self *pinboard.Self
	// Local runs this node's instances; nil on a node without hosts.
	Local *supervisor.Supervisor
	// Tokens decides who may call what; Gate admits attested peers to
	// the owner side.
	Tokens *pinboard.Tokens
	Gate   *pinboard.OwnerGate
	Logger *slog.Logger
	// Registerer receives the pinboard_* collectors.
	Registerer prometheus.Registerer
	// Quarantine is the cold-start quarantine: a fresh directory refuses
	// placements this long from its first placement attempt. One lease
	// TTL in a fleet; 0 for a single dev node, where no other worker can
	// still be holding an id.
	Quarantine time.Duration
	// Transport carries node-to-node requests; nil is the front door's own
	// (over PeerTLS, if set). Tests plug in here.
	Transport http.RoundTripper
	// PeerTLS, with the cluster's mutual TLS, is the client side of
	// node-to-node requests, and PeerAddr the cluster address of a member
	// node: its peer routes (the hop's owner side, wake, stats,
	// wind-down) are reached there, and this front door serves them only
	// through PeerHandler, on its own cluster port. nil: an insecure
	// cluster, whose nodes call each other's advertise URLs.
	PeerTLS  *tls.Config
	PeerAddr func(nodeID string) (string, bool)
	// Policy chooses the worker for a new placement.
	Policy pinboard.PlacementPolicy
	// TrustedProxies are the peers whose forwarding headers name the
	// client IP (PINBOARD_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
	// AffinityKey, if set, is the programmatic affinity for a request:
	// nil keeps client-IP affinity, "" asks for power of two choices, a
	// string is a rendezvous preference. It must not consume the body.
	AffinityKey func(*http.Request) *string
	// ClusterCalls names the namespaces a cluster-call credential (from
	// plugins.HeaderClusterCall) speaks for, ok false for one no live
	// plugin process of this node holds (supervisor.VerifyClusterCall).
	// nil: no cluster calls.
	ClusterCalls func(token string) (hostname string, namespaces []string, ok bool)
	// HostnameAware routes a client's request by its Host (plugins'
	// NormalizeHost): the directory binds (hostname, namespace) to the env
	// its ids live in (seed 004's hostname-aware mode). Every node of a
	// fleet runs alike. LeaseTTL is a worker's lease, a takeover fence's
	// length (0: pinboard.DefaultLeaseTTL).
	HostnameAware bool
	LeaseTTL      time.Duration
	// AccessLog logs one line per front-door request (method, path,
	// status, bytes, duration, served here or forwarded to which node).
	// It keeps every connection in net/http: the kept-alive loop is off.
	AccessLog bool
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
	// net/http, and held streams forwarded to another node move to the
	// relay loop (package relay; Linux only). Off, every request takes
	// net/http's path: the same answers, more CPU per request.
	FastPath bool
	// IdleTimeout closes a kept-alive client connection that sent nothing
	// for this long (an upgraded one that moved nothing either way), in
	// net/http (its IdleTimeout) and in the kept-alive
	// loop alike; 0: no bound.
	IdleTimeout time.Duration
	// MaxBodyBytes caps a request body (boundRequest): over it, 413; 0:
	// no cap.
	MaxBodyBytes int64
	// MemberRoots verify an https advertise URL that node-to-node requests
	// go to without the cluster's TLS (--insecure-cluster): the system
	// roots and --http-tls-ca; nil: the system roots.
	MemberRoots *x509.CertPool
	// TLS, if set, makes Serve serve HTTPS (HTTP/2 and HTTP/1.1, as its
	// NextProtos offer) on the listeners it is given. TLS clients stay in
	// net/http: the kept-alive loop takes plain connections only.
	TLS *tls.Config
}

// FrontDoor is the node's HTTP entry point: the router of every request
// (router.go) and the façade the agent wires. Its parts, each with one
// job (DESIGN.md): the resolver (where an instance is, or will be), the
// owner side (this worker's instances, and attestations for it), the
// forwarder (a request to another node's owner) and keptAlive
// (connections moving between net/http and the kept-alive loop). The
// control plane's API (pinboard.API) is mounted on its mux.
type FrontDoor struct {
	res       *resolver
	owner     *ownerSide
	fwd       *forwarder
	keep      *keptAlive
	transport peerTransport // node-to-node requests (the forwarder's, Wake's, the API's)

	dir    *pinboard.Directory // the cluster secret (Wake); worker URLs (peerIPs)
	tokens *pinboard.Tokens
	logger *slog.Logger
	mux    *routeMux
	srv    *http.Server // Serve's
	// stopping: new instance requests are answered 503 (SetStopping),
	// every answer ends its connection; since stoppedAt (unix ns).
	stopping  atomic.Bool
	stoppedAt atomic.Int64
	conns     httpx.ConnStates // net/http's client connections
	// lns are the listeners Serve serves, for Shutdown to close before
	// net/http's Shutdown; serving counts Serve's loops still accepting.
	lnMu    sync.Mutex
	lns     []net.Listener
	serving sync.WaitGroup

	trustedProxies  []netip.Prefix
	affinityKey     func(*http.Request) *string
	clusterCalls    func(token string) (string, []string, bool)
	bodyReadTimeout time.Duration
	maxBody         int64
	accessLog       bool
	fastPath        bool

	tls *tls.Config // Serve's HTTPS; nil: plain HTTP

	limiter   *ConnLimiter
	fleetIPs  peerSet // the fleet's own IPs, exempt from the per-IP cap
	peerAddrs func() []string
	capPerIP  bool
}

// New builds the front door and its parts from cfg.
func New(cfg Config) *FrontDoor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tokens == nil {
		cfg.Tokens = pinboard.NewTokens()
	}
	if cfg.Self == nil {
		cfg.Self = pinboard.NewSelf(cfg.Dir, nil)
	}
	if cfg.Gate == nil {
		cfg.Gate = pinboard.NewOwnerGate(cfg.Self, 0)
	}
	f := &FrontDoor{
		dir: cfg.Dir, tokens: cfg.Tokens, logger: cfg.Logger, mux: &routeMux{ServeMux: http.NewServeMux()},
		trustedProxies: cfg.TrustedProxies, affinityKey: cfg.AffinityKey, clusterCalls: cfg.ClusterCalls,
		bodyReadTimeout: cfg.BodyReadTimeout, maxBody: cfg.MaxBodyBytes, accessLog: cfg.AccessLog, fastPath: cfg.FastPath,
		peerAddrs: cfg.PeerAddrs, capPerIP: cfg.MaxConnsPerIP > 0, tls: cfg.TLS,
		transport: newPeerTransport(cfg.Transport, cfg.PeerTLS, cfg.MemberRoots, cfg.PeerAddr),
	}
	f.res = newResolver(cfg.Dir, cfg.Self, cfg.Local, cfg.Policy, cfg.Quarantine, cfg.Logger)
	f.res.hostnames, f.res.leaseTTL = cfg.HostnameAware, cmp.Or(cfg.LeaseTTL, pinboard.DefaultLeaseTTL)
	f.keep = newKeptAlive(loopRouter{f}, cfg.FastPath, cfg.AccessLog, cfg.Logger,
		relay.ClientLimits{Idle: cfg.IdleTimeout, MaxBody: cfg.MaxBodyBytes})
	f.owner = newOwnerSide(cfg.Dir, cfg.Self, cfg.Local, f.res, f.keep, cfg.Gate)
	f.fwd = newForwarder(cfg.Dir, f.res, f.keep, f.transport, cfg.Logger, f.routeRequest)
	f.fwd.upgradeIdle = cfg.IdleTimeout
	f.limiter = NewConnLimiter(ConnLimits{PerIP: cfg.MaxConnsPerIP, Total: cfg.MaxConns, Exempt: f.exemptFromIPCap},
		cfg.Logger, cfg.Registerer)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.res.collectors()...)
		cfg.Registerer.MustRegister(f.fwd.collectors()...)
		cfg.Registerer.MustRegister(f.keep.collectors()...)
	}
	// No ReadTimeout: it bounds a whole request from its first byte (a
	// slow but steady upload, a body read after a long activation);
	// bodies get a deadline on progress instead (BodyReadTimeout).
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: MaxHeaderBytes, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		ConnState: f.conns.Track}
	return f
}

// Peers reaches other nodes' owner-side routes over the front door's
// transport, for the API's attested calls (stats, wind-down).
func (f *FrontDoor) Peers() pinboard.Peers { return f.transport }

// Stopping reports SetStopping: the node is shutting down.
func (f *FrontDoor) Stopping() bool { return f.stopping.Load() }

// Serve serves the front door on ln until Shutdown, with its connection
// caps (MaxConnsPerIP, MaxConns) and net/http's bounds, over TLS if the
// config has it (the handshake bounded as a request's header is); with
// FastPath, the kept-alive loop takes the connections it can serve.
func (f *FrontDoor) Serve(ln net.Listener) error {
	if f.fastPath {
		f.serveHandBacks(f.srv)
	}
	ln = f.Listener(ln)
	if f.tls != nil {
		// With no TLSConfig of its own, net/http sets up HTTP/2 for the
		// *tls.Conn this listener returns when ALPN chose h2.
		ln = tls.NewListener(ln, f.tls)
	}
	f.lnMu.Lock()
	f.lns = append(f.lns, ln)
	f.serving.Add(1)
	f.lnMu.Unlock()
	defer f.serving.Done()
	err := f.srv.Serve(ln)
	if errors.Is(err, net.ErrClosed) && f.stopping.Load() {
		err = http.ErrServerClosed // Shutdown closed it
	}
	return err
}

// serveHandBacks lets the kept-alive loop take connections from srv
// (keptAlive.serveHandBacks).
func (f *FrontDoor) serveHandBacks(srv *http.Server) { f.keep.serveHandBacks(srv) }

// Handle mounts h on the front door's mux (the API, raft, ...): a path
// no pattern matches is an unknown namespace's (404).
func (f *FrontDoor) Handle(pattern string, h http.Handler) { f.mux.Handle(pattern, h) }

// HandleFunc mounts h on the front door's mux.
func (f *FrontDoor) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	f.mux.HandleFunc(pattern, h)
}

// Routes are the patterns mounted on the front door's mux, in the order
// they were: what a test holds to an authorization rule, one by one.
// Instance paths (/<namespace>/<id>/...) are not among them: the router
// serves those itself.
func (f *FrontDoor) Routes() []string {
	f.mux.mu.Lock()
	defer f.mux.mu.Unlock()
	return slices.Clone(f.mux.patterns)
}

// routeMux is the front door's mux, remembering what was mounted.
type routeMux struct {
	*http.ServeMux
	mu       sync.Mutex
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.record(pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.record(pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

func (m *routeMux) record(pattern string) {
	m.mu.Lock()
	m.patterns = append(m.patterns, pattern)
	m.mu.Unlock()
}

// RequireScope wraps h: only a request that may act with scope over every
// namespace reaches it (Tokens.RequireFleet).
func (f *FrontDoor) RequireScope(scope pinboard.Scope, h http.HandlerFunc) http.HandlerFunc {
	return f.tokens.RequireFleet(h, scope)
}

// stopAccepting closes the listeners Serve serves and waits (up to ctx)
// until its loops returned: every connection they accepted is then one
// net/http tracks (it does before accepting the next).
func (f *FrontDoor) stopAccepting(ctx context.Context) {
	f.lnMu.Lock()
	for _, ln := range f.lns {
		_ = ln.Close()
	}
	f.lnMu.Unlock()
	done := make(chan struct{})
	go func() { f.serving.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Close ends the held streams this front door relays and stops the relay
// loop (http.Server's Shutdown does not see them: they left net/http),
// then closes its pooled connections to owners. Call it after the server
// stopped serving.
func (f *FrontDoor) Close() error {
	f.fleetIPs.close()
	_ = f.keep.close()
	err := f.fwd.close()
	f.transport.close()
	return err
}

// Shutdown stops Serve as http.Server's Shutdown does, for net/http's
// connections and the kept-alive loop's alike: no new requests, and every
// request under way gets its response unless ctx ends first (then they
// are cut). Held streams end. After SetStopping, idle connections first
// get until idleGrace from it to bring a request already on its way.
//
// The kept-alive loop stops first: a request it gives back to net/http
// then still finds it serving. net/http's own Shutdown comes last, once
// the listeners are closed and the connections accepted before have
// brought their first request (it drops unanswered one it reads after).
func (f *FrontDoor) Shutdown(ctx context.Context) error {
	f.awaitIdle(ctx)
	err := f.keep.shutdown(ctx)
	f.stopAccepting(ctx)
	f.conns.AwaitFirstRequests(ctx)
	if serr := f.srv.Shutdown(ctx); serr != nil {
		err = errors.Join(err, serr, f.srv.Close())
	}
	return errors.Join(err, f.Close())
}

// SetStopping makes new instance requests answer 503 + Retry-After, and
// every answer end its connection (Connection: close), so that Shutdown
// finds few idle connections to close.
func (f *FrontDoor) SetStopping() {
	f.stoppedAt.CompareAndSwap(0, time.Now().UnixNano())
	f.stopping.Store(true)
	f.keep.stop()
}

// Listener wraps the front door's listener with its connection caps
// (MaxConnsPerIP, MaxConns): a connection over one is answered 503 +
// Retry-After and closed.
func (f *FrontDoor) Listener(ln net.Listener) net.Listener {
	if f.capPerIP {
		f.fleetIPs.run(f.peerIPs) // until Close
	}
	return f.limiter.Listener(ln)
}

// Released is the supervisor's OnEvicted hook: give the placement back.
func (f *FrontDoor) Released(k supervisor.Key, generation uint64, release bool) {
	if release {
		f.res.release(directory.Key(k), generation)
	}
}

// Degraded is the supervisor's OnDegraded hook: the ids this worker holds
// through routes whose plugin crash-loops here are given up at once, so
// other nodes take them on their next request (and the leader's scanner
// wakes those with marked work elsewhere).
func (f *FrontDoor) Degraded(routes []supervisor.Route) {
	if f.owner.worker == nil {
		return
	}
	self := f.res.self.ID()
	for _, p := range f.dir.Machine().PlacementsOf(self) {
		if slices.Contains(routes, supervisor.Route{Hostname: p.Hostname, Namespace: p.Key.Namespace}) {
			f.res.release(p.Key, p.Generation)
		}
	}
}
