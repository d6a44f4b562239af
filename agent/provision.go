package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/console"
	"github.com/pinnedd/pinnedd/frontdoor"
	"github.com/pinnedd/pinnedd/internal/certfile"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/datadir"
	"github.com/pinnedd/pinnedd/internal/procstat"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore"
	"github.com/pinnedd/pinnedd/supervisor"
)

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// provisionDataDir takes the data dir's lock (Dev without a data dir: a new
// temporary one). The lock is held until Stop: everything in the data dir
// is this process's, so what a dead predecessor left there (plugin
// sockets) is stale.
func (a *Agent) provisionDataDir(context.Context) error {
	a.dataDir = a.cfg.DataDir
	if a.dataDir == "" {
		// A dev agent ended by kill -9 could not remove its own.
		if removed, err := datadir.SweepStale(os.TempDir()); err != nil {
			a.log.Warn("sweeping dead dev agents' data dirs", "err", err)
		} else if len(removed) > 0 {
			a.log.Info("removed data dirs of dev agents that are gone", "dirs", removed)
		}
		tmp, err := os.MkdirTemp("", datadir.DevPrefix+"*")
		if err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		a.devDir, a.dataDir = tmp, tmp
	}
	lock, err := datadir.Acquire(a.dataDir)
	if err != nil {
		return err
	}
	a.lock = lock
	return nil
}

// provisionListener binds the front door's address and settles the URL
// other nodes reach it at.
func (a *Agent) provisionListener(context.Context) error {
	scheme := "http"
	if a.cfg.HTTPTLSCert != "" {
		pair, err := certfile.Load(a.cfg.HTTPTLSCert, a.cfg.HTTPTLSKey, a.log)
		if err != nil {
			return fmt.Errorf("front door: --http-tls-cert, --http-tls-key: %w", err)
		}
		a.frontCert, scheme = pair, "https"
	}
	var err error
	if a.memberRoots, a.memberCA, err = certfile.Roots(a.cfg.HTTPTLSCA); err != nil {
		return fmt.Errorf("--http-tls-ca: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: a.memberRoots, MinVersion: tls.VersionTLS12}
	a.joinClient = &http.Client{Timeout: 30 * time.Second, Transport: tr}
	ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("front door: %w", err)
	}
	a.ln = ln
	if a.advertise, err = advertiseURL(a.cfg.AdvertiseURL, scheme, ln.Addr()); err != nil {
		return err
	}
	if a.frontCert != nil {
		// The registry probes the advertise URL (this node's own
		// registration too), and members join through it: a certificate
		// they cannot verify would fail there, later and less clearly.
		u, _ := url.Parse(a.advertise)
		if err := a.frontCert.Verify(a.memberRoots, u.Hostname()); err != nil {
			return fmt.Errorf("front door: --http-tls-cert does not verify for the advertise URL %s with the system roots or --http-tls-ca (pass the CA that issued it as --http-tls-ca; the certificate must name that host): %w", a.advertise, err)
		}
	}
	return nil
}

// advertiseURL is the flag's value, or scheme://<bound address> when that
// names a concrete host.
func advertiseURL(flag, scheme string, bound net.Addr) (string, error) {
	if flag != "" {
		u, err := url.Parse(flag)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--advertise-url %q: want http(s)://host:port", flag)
		}
		if u.Scheme != scheme {
			return "", fmt.Errorf("--advertise-url %q: the front door serves %s here (--http-tls-cert), so other nodes must reach it at %s://", flag, scheme, scheme)
		}
		return strings.TrimRight(flag, "/"), nil
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("--http-addr %s listens on every interface: set --advertise-url to the address other nodes reach", bound)
	}
	return scheme + "://" + bound.String(), nil
}

// provisionStateStore opens the node's instance state store: Postgres with
// a DatabaseURL (shared by the fleet, so any node can restore any id), else
// an embedded bbolt file in the data dir (this node only).
func (a *Agent) provisionStateStore(ctx context.Context) error {
	if a.cfg.NoHosts {
		return nil
	}
	var st statestore.Store
	if a.cfg.DatabaseURL != "" {
		pg, err := pgstore.Open(ctx, a.cfg.DatabaseURL)
		if err != nil {
			return fmt.Errorf("state store: %w", err)
		}
		st = pg
	} else {
		b, err := boltstore.Open(filepath.Join(a.dataDir, "state.db"))
		if err != nil {
			return fmt.Errorf("state store: %w", err)
		}
		st = b
		if !a.cfg.Dev {
			a.log.Warn("--local-state: instance state is in this node's data dir only; an id that moves to another node starts empty there")
		}
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := st.Setup(sctx); err != nil {
		st.Close()
		return fmt.Errorf("state store setup: %w", err)
	}
	a.states = st
	return nil
}

// provisionPlugins spawns the plugins and waits for their handshakes: the
// worker registers the namespaces they announce.
func (a *Agent) provisionPlugins(ctx context.Context) error {
	if a.cfg.NoHosts {
		return nil
	}
	if a.cfg.Dev {
		if err := a.provisionDevBinary(); err != nil {
			return err
		}
	}
	sup, err := supervisor.New(supervisor.Config{
		Specs: a.cfg.Specs, Logger: a.log, Registerer: a.reg, Store: a.states, RuntimeDir: runtimeDir(a.dataDir), FrontDoorURL: a.advertise, FrontDoorCA: a.pluginFrontDoorCA(),
		DetachedTimeout: a.cfg.DetachedTimeout, StopGrace: a.cfg.StopGrace, StablePeriod: a.cfg.StablePeriod, UpgradeIdle: a.cfg.IdleTimeout,
		SwapDeadline: a.cfg.SwapDeadline, KeepPlacementsOnIdle: a.cfg.DatabaseURL == "",
		OnEvicted: a.released, OnDegraded: a.degraded,
	})
	if err != nil {
		return err
	}
	if err := sup.Start(ctx); err != nil {
		return fmt.Errorf("start plugins: %w", err)
	}
	a.sup = sup
	return nil
}

// released is the supervisor's OnEvicted hook: the front door gives the
// placement back. The front door exists by then: an instance is only
// activated through it, after New.
func (a *Agent) released(k supervisor.Key, gen uint64, release bool) {
	a.fd.Released(k, gen, release)
}

// degraded is the supervisor's OnDegraded hook: the front door gives up
// the namespaces' placements here. A crash loop before the front door
// exists is left to it: a request for such an id gives it up then.
func (a *Agent) degraded(routes []supervisor.Route) {
	if fd := a.serving.Load(); fd != nil {
		fd.Degraded(routes)
	}
}

// runtimeDir is where plugin sockets live: systemd's RuntimeDirectory= when
// the unit sets one, else <data-dir>/run. The data dir lock makes either
// this process's alone.
func runtimeDir(dataDir string) string {
	if rd, _, _ := strings.Cut(os.Getenv("RUNTIME_DIRECTORY"), ":"); rd != "" {
		return rd
	}
	return filepath.Join(dataDir, "run")
}

// provisionRaft opens this node's Raft store (bootstrapping or rejoining
// from the data dir) over a new directory state machine.
func (a *Agent) provisionRaft(ctx context.Context) error {
	cfg := a.cfg
	a.machine = directory.New()
	if err := a.provisionSealer(); err != nil {
		return err
	}
	a.cluster = a.clusterPort()
	store, err := raftstore.Open(ctx, raftstore.Config{
		NodeID: cfg.NodeID, RaftAddr: cfg.RaftAddr, AdvertiseRaftAddr: cfg.RaftAdvertiseAddr,
		APIAddr: a.advertise, DataDir: a.dataDir, Bootstrap: cfg.Bootstrap, MaxVoters: cfg.MaxVoters,
		LogStore: cfg.RaftLogStore, Cluster: a.cluster,
		Logger: a.log, Token: cfg.Tokens[0], JoinTokens: cfg.nodeTokens(), Registerer: a.reg,
		APIRoots:         a.memberRoots,
		HeartbeatTimeout: cfg.RaftTimeout, ElectionTimeout: cfg.RaftTimeout,
		LeaderLeaseTimeout: cfg.RaftTimeout / 2,
	}, a.machine)
	if err != nil {
		return fmt.Errorf("open raft: %w", err)
	}
	// A new leader renews the leases no leader could before its term
	// judges any.
	store.SetLeaderPreamble(pinboard.LeasePreamble(cfg.LeaseTTL))
	a.store = store
	return nil
}

// clusterPort is the port Raft and the nodes' HTTP run on, under mutual
// TLS with the cluster's own CA or the operator's PKI; nil with
// --insecure-cluster (plain TCP).
func (a *Agent) clusterPort() *clusterport.Cluster {
	cfg := a.cfg
	if cfg.InsecureCluster {
		return nil
	}
	return clusterport.NewCluster(clusterport.Config{
		NodeID: cfg.NodeID, DataDir: a.dataDir, Addr: cfg.RaftAddr, Advertise: cfg.RaftAdvertiseAddr,
		CAFile: cfg.TLSCA, CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, Bootstrap: cfg.Bootstrap,
		Tokens: cfg.nodeTokens(), Sealer: a.sealer, Logger: a.log,
		// With the fast path, the kept-alive loop may take the cluster
		// port's connections, as the front door's (FrontDoor.PeerHandBacks).
		ServerConn: frontdoor.ClusterPortTLS(cfg.FastPath),
	})
}

// provisionSealer makes the sealer of the cluster's keys at rest (the CA
// key, this node's key, the cluster secret) from the deployment tokens,
// and has the directory's secret recorded sealed and opened with it.
func (a *Agent) provisionSealer() error {
	if len(a.cfg.Tokens) == 0 || a.cfg.Tokens[0] == "" {
		a.machine.SetSecretOpener(func(recorded []byte) ([]byte, bool) {
			if clustertls.IsSealed(recorded) {
				a.log.Error("the cluster secret is sealed with the deployment token, and this node has none: it cannot attest requests to owners")
				return nil, false
			}
			return recorded, false
		})
		return nil
	}
	s, err := clustertls.NewSealer(a.cfg.nodeTokens()...)
	if err != nil {
		return err
	}
	a.sealer = s
	a.machine.SetSecretOpener(func(recorded []byte) ([]byte, bool) {
		if !clustertls.IsSealed(recorded) {
			return recorded, true // an older version's, in clear: the leader seals it (Reseal)
		}
		plain, stale, err := s.OpenStale(clustertls.LabelClusterSecret, recorded)
		if err != nil {
			a.log.Error("the cluster secret does not open with this node's deployment token: it cannot attest requests to owners", "err", err)
			return nil, false
		}
		return plain, stale
	})
	return nil
}

// provisionDirectory builds the directory over Raft's replica of the
// directory state machine, and the registry over it.
func (a *Agent) provisionDirectory(context.Context) error {
	a.dir = pinboard.NewDirectory(a.machine, a.store)
	if a.sealer != nil {
		a.dir.SealSecretWith(func(plain []byte) []byte { return a.sealer.Seal(clustertls.LabelClusterSecret, plain) })
	}
	a.registry = pinboard.NewRegistry(a.dir, a.cfg.LeaseTTL)
	if a.cfg.HostnameAware {
		a.registry.HostnameAware()
	}
	if a.memberRoots != nil {
		a.registry.VerifyWith(a.memberRoots)
	}
	return nil
}

// provisionWorker builds this node's worker: its lease in the directory,
// its drains, and the instances the supervisor runs.
func (a *Agent) provisionWorker(context.Context) error {
	if a.sup == nil {
		return nil
	}
	sup := a.sup
	wc := pinboard.WorkerConfig{
		NodeID: a.cfg.NodeID, AdvertiseURL: a.advertise, Namespaces: a.registeredNamespaces(),
		TTL: a.cfg.LeaseTTL, Interval: a.cfg.Heartbeat, Logger: a.log,
		StateFile: filepath.Join(a.dataDir, "worker.json"),
		LiveIDs: func() []pinboard.InstanceKey {
			var out []pinboard.InstanceKey
			for _, in := range sup.Instances() {
				out = append(out, pinboard.InstanceKey{Env: in.Env, Namespace: in.Namespace, ID: in.ID})
			}
			return out
		},
		Draining: func() bool { return sup.DrainingBy(supervisor.DrainLocal) },
		OnOperatorDrain: func(active bool, deadline time.Time, cordon bool) {
			if !active {
				deadline, cordon = time.Time{}, false
			}
			sup.SetDrain(supervisor.DrainOperator, deadline, cordon)
		},
		// A re-registration found ids placed elsewhere meanwhile: quit them.
		OnDuplicates: func(keys []pinboard.InstanceKey) {
			qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, k := range keys {
				sup.Quit(qctx, supervisor.Key{Env: k.Env, Namespace: k.Namespace, ID: k.ID})
			}
		},
	}
	if a.cfg.HostnameAware {
		wc.Routes, wc.OnSuperseded = a.registeredRoutes, a.superseded
	}
	a.worker = pinboard.NewWorker(wc, a.registry)
	return nil
}

// keysToSeal names the keys at rest in the log still sealed under a token
// this node is rotating out (or in clear): the leader seals them again
// under its own; the old token may go once every node lists none.
func (a *Agent) keysToSeal() []string {
	out := []string{}
	if a.store.CA().KeyToSeal() {
		out = append(out, clustertls.LabelCAKey)
	}
	if a.machine.SecretStale() {
		out = append(out, clustertls.LabelClusterSecret)
	}
	return out
}

// pluginFrontDoorCA is the CA plugins verify the front door's HTTPS with
// for their cluster calls: --http-tls-ca's certificates (public, like any
// CA certificate); nil for plain HTTP or the system roots.
func (a *Agent) pluginFrontDoorCA() []byte {
	if a.frontCert == nil {
		return nil
	}
	return a.memberCA
}

// frontDoorTLS is the front door's HTTPS config, nil for plain HTTP.
func (a *Agent) frontDoorTLS() *tls.Config {
	if a.frontCert == nil {
		return nil
	}
	return a.frontCert.ServerConfig()
}

// fleetWorker: r carries a worker key whose claims admit every namespace
// (a node's own, not a client's narrowed one).
func fleetWorker(tokens *pinboard.Tokens, r *http.Request) bool {
	_, err := tokens.AuthorizeFleet(r, pinboard.ScopeWorker)
	return err == nil
}

// provisionFrontDoor builds the front door over every other part, mounts
// the control plane's API and the cluster's routes on it, and hands the
// cluster port's HTTP to it.
func (a *Agent) provisionFrontDoor(context.Context) error {
	self := pinboard.NewSelf(a.dir, a.worker)
	gate := pinboard.NewOwnerGate(self, 0)
	a.fd = frontdoor.New(a.frontDoorConfig(self, gate))
	a.serving.Store(a.fd)
	a.history = console.NewSeries(a.reg, 0, 0, a.log)
	a.api = pinboard.NewAPI(a.apiConfig(self, gate))
	a.api.Mount(a.fd)
	// The admin console: static files only; its pages call the routes
	// above, which authorise each call.
	a.fd.Handle("GET "+console.Prefix, console.NewHandler())
	tokens, store := a.tokens, a.store
	insecure := a.cfg.InsecureCluster
	member := func(r *http.Request) error {
		_, err := tokens.AuthorizeFleet(r, pinboard.ScopeOperator)
		switch {
		case err == nil:
			return nil
		case insecure && fleetWorker(tokens, r):
			// Without mutual TLS the members' own calls come here too,
			// with their worker keys.
			return nil
		}
		tokens.Count(err) // raftstore answers it; the refusal counts as any other
		if errors.Is(err, pinboard.ErrMissingScope) {
			return fmt.Errorf("%w: %w", raftstore.ErrForbidden, err)
		}
		return err
	}
	a.fd.Handle(raftstore.HandlerPrefix, store.Handler(member))
	a.fd.Handle("POST /_pinned/join", joinHandler(tokens, store, a.joinClient, a.log))
	a.fd.Handle("POST /_pinned/leave", a.fd.RequireScope(pinboard.ScopeOperator, leaveHandler(store, a.cfg.DrainDeadline, a.leave)))
	// Go's profiles, for an operator chasing CPU or memory in a running
	// node (Consul and Nomad expose them behind an operator ACL too).
	a.fd.Handle("/_pinned/debug/pprof/", a.fd.RequireScope(pinboard.ScopeOperator, servePprof))
	// The cluster port's HTTP (with mutual TLS): the other nodes' calls,
	// raftstore's and the front door's peer routes.
	if a.cluster != nil {
		rpc, peer := store.PeerHandler(), a.fd.PeerHandler()
		a.cluster.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, raftstore.HandlerPrefix) {
				rpc.ServeHTTP(w, r)
				return
			}
			peer.ServeHTTP(w, r)
		}), a.fd.PeerHandBacks())
	}
	return nil
}

// quarantine is the cold-start quarantine: one lease TTL in a fleet, none
// on a dev node, where no other worker can still be holding an id.
func (a *Agent) quarantine() time.Duration {
	if a.cfg.Dev {
		return 0
	}
	return a.cfg.LeaseTTL
}

// frontDoorConfig is the data plane's: what it routes by and its limits.
func (a *Agent) frontDoorConfig(self *pinboard.Self, gate *pinboard.OwnerGate) frontdoor.Config {
	cfg, store := a.cfg, a.store
	fdc := frontdoor.Config{
		Dir: a.dir, Self: self, Tokens: a.tokens, Gate: gate, Logger: a.log, Registerer: a.reg,
		Quarantine: a.quarantine(), AccessLog: cfg.AccessLog, FastPath: cfg.FastPath, IdleTimeout: cfg.IdleTimeout,
		BodyReadTimeout: cfg.BodyReadTimeout, MaxBodyBytes: cfg.MaxBodyBytes,
		MaxConnsPerIP: cfg.MaxConnsPerIP, MaxConns: cfg.MaxConns, PeerAddrs: func() []string { return memberAPIAddrs(store) },
		Policy: pinboard.PlacementPolicy{BalanceFactor: cfg.BalanceFactor}, TrustedProxies: cfg.TrustedProxies,
		MemberRoots: a.memberRoots,
		TLS:         a.frontDoorTLS(),
	}
	if a.cluster != nil {
		fdc.PeerTLS, fdc.PeerAddr = a.cluster.PeerTLS(), a.cluster.PeerAddr
	}
	if a.sup != nil {
		fdc.Local, fdc.ClusterCalls = a.sup, a.sup.VerifyClusterCall
	}
	fdc.HostnameAware, fdc.LeaseTTL = cfg.HostnameAware, cfg.LeaseTTL
	return fdc
}

// apiConfig is the control plane API's: its parts and the hooks into the
// node's others (Raft's health, the supervisor's drains and reloads).
func (a *Agent) apiConfig(self *pinboard.Self, gate *pinboard.OwnerGate) pinboard.APIConfig {
	cfg, store, sup := a.cfg, a.store, a.sup
	ac := pinboard.APIConfig{
		Dir: a.dir, Self: self, Registry: a.registry, Tokens: a.tokens, Gate: gate, Peers: a.fd.Peers(),
		Stopping: a.fd.Stopping, Logger: a.log, Registerer: a.reg, Quarantine: a.quarantine(),
		Metrics: promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}), MetricsPublic: cfg.MetricsPublic,
		HTTPS:  a.frontCert != nil,
		Ready:  func() bool { id, _ := store.Leader(); return id != "" && store.Fault() == nil },
		Health: func() map[string]any { return raftHealth(store) },
		Status: a.status,
	}
	if sup == nil {
		return ac
	}
	worker := a.worker
	ac.Local = sup
	ac.Ready = sup.Ready
	ac.Drain = func(deadline time.Time, cordon bool) {
		sup.SetDrain(supervisor.DrainLocal, deadline, cordon)
		// Tell the directory now, not at the next heartbeat: new
		// placements must skip this node.
		go func() {
			hctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			worker.HeartbeatNow(hctx)
		}()
	}
	ac.WindDown = func(k directory.Key, deadline time.Time) int { return sup.WindDown(supervisor.Key(k), deadline) }
	ac.Reload = func(ctx context.Context, ns string) error {
		if err := sup.Reload(ctx, ns); errors.Is(err, supervisor.ErrUnknownNS) {
			return fmt.Errorf("%w: %s", pinboard.ErrUnknownNamespace, ns)
		} else if err != nil {
			return err
		}
		return nil
	}
	ac.AddPlugin, ac.RemovePlugin = a.addPlugin, a.removePlugin
	ac.WorkerStats = func(ctx context.Context) map[string]any {
		nss, insts := sup.Stats(ctx)
		p := procstat.Read()
		return map[string]any{
			"nodeId": cfg.NodeID, "namespaces": nss, "instances": insts, "plugins": sup.Plugins(),
			"uptimeMs": p.UptimeMs, "rssBytes": p.RSSBytes, "cpuPercent": p.CPUPercent,
			"series": a.history.Snapshot(),
		}
	}
	return ac
}

// status is what /_pinned/status adds to the worker's: the node, Raft,
// the keys at rest, plugins and instances.
func (a *Agent) status() map[string]any {
	cfg, store, sup := a.cfg, a.store, a.sup
	st := map[string]any{
		"nodeId": cfg.NodeID, "version": cfg.Version, "dev": cfg.Dev, "advertiseUrl": a.advertise, "pid": os.Getpid(),
		"raft": raftHealth(store), "clusterTLS": store.CA().Mode(), "insecureCluster": cfg.InsecureCluster,
	}
	if a.frontCert != nil {
		st["frontDoorCertNotAfter"] = a.frontCert.NotAfter().UTC().Format(time.RFC3339)
	}
	if a.sealer != nil {
		st["keysToSeal"] = a.keysToSeal()
	}
	if sup != nil {
		st["plugins"], st["instances"] = sup.Plugins(), sup.Instances()
	}
	return st
}
