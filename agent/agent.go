// Package agent owns a pinnedd node's lifecycle, in the manner of Caddy's
// modules: New provisions every part in dependency order (data dir,
// listener, state store, plugins, Raft, directory, worker, front door),
// Start sets the node to work (serving, background work, leader work),
// Wait waits for a reason to stop, and Stop takes the parts down in one
// explicit order. A New that fails half way cleans up through the same
// Stop.
//
// It wires parts together and holds no policy of its own: placement is
// pinboard's, instances are supervisor's, consensus is raftstore's. It
// never parses flags (package main does) and never exits the process.
package agent

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/console"
	"github.com/pinnedd/pinnedd/frontdoor"
	"github.com/pinnedd/pinnedd/internal/certfile"
	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/datadir"
	"github.com/pinnedd/pinnedd/internal/harden"
	"github.com/pinnedd/pinnedd/internal/sdnotify"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Agent is one pinnedd node.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	reg    *prometheus.Registry
	tokens *pinboard.Tokens
	// leaving are the routes of a plugin being removed: no longer
	// registered (registeredNamespaces, registeredRoutes).
	leavingMu sync.Mutex
	leaving   []supervisor.Route

	// The parts, in the order New builds them. Stop skips the ones never
	// built; the optional ones are nil with NoHosts.
	devDir    string     // Dev's temporary data dir, removed last
	devBin    *devBinary // Dev's copy of pinnedd's binary for its built-in hosts, if made
	dataDir   string
	lock      *datadir.Lock
	ln        net.Listener
	frontCert *certfile.Pair // the front door's HTTPS pair; nil: plain HTTP
	advertise string
	// memberRoots verify members' HTTPS front doors (the system roots and
	// --http-tls-ca; nil: the system roots): joinClient's calls (joining
	// through one) and the registry's challenge probes.
	memberRoots *x509.CertPool
	memberCA    []byte // --http-tls-ca's certificates, as read at start
	joinClient  *http.Client
	states      statestore.Store
	sup         *supervisor.Supervisor
	machine     *directory.Machine   // Raft's replica of the directory
	sealer      *clustertls.Sealer   // the keys at rest's (provisionSealer); nil without a token
	cluster     *clusterport.Cluster // the cluster port; nil with --insecure-cluster
	store       *raftstore.Store
	dir         *pinboard.Directory
	registry    *pinboard.Registry
	worker      *pinboard.Worker
	fd          *frontdoor.FrontDoor
	api         *pinboard.API
	history     *console.Series                     // this node's recent counts, for the console's charts
	serving     atomic.Pointer[frontdoor.FrontDoor] // fd, for hooks that may run before it exists

	leave    chan time.Duration // POST /_pinned/leave, with its drain deadline
	serveErr chan error

	started  bool
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	stopOnce sync.Once
	stopErr  error
}

// Run runs a node: New, Start, then Stop once Wait returns (ctx ends, a
// leave is asked for, the front door fails or Raft's storage does). The
// error is why the node failed, nil after a clean stop. Before anything
// else it makes the process non-dumpable, so that no process of its user
// (a plugin not run as a user of its own) can read its memory or
// environment.
func Run(ctx context.Context, cfg Config) error {
	if err := harden.NonDumpable(); err != nil {
		return err
	}
	a, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	a.Start()
	return a.Stop(a.Wait(ctx))
}

// New provisions the node: it builds every part in dependency order and
// starts none of the agent's own work (the plugins run, as the worker
// registers the namespaces their handshakes announce; Raft is open). If a
// part fails, what was built is taken down again and the error returned.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	cfg.Specs = slices.Clone(cfg.Specs) // absolute changes them: the caller's stay as they were
	if err := cfg.absolute(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, leave: make(chan time.Duration, 1), serveErr: make(chan error, 1)}
	if cfg.Dev {
		a.log.Warn("DEV MODE: one-node cluster, token dev-token accepted, and calls with no token from this machine; never run this in production")
	}
	a.reg = newRegistry()
	if cfg.Passport != nil {
		a.tokens = pinboard.NewPassportTokens(cfg.Passport)
	} else {
		a.tokens = pinboard.NewTokens(cfg.Tokens...)
	}
	if cfg.Dev {
		// dev-token is public anyway: a token-less call from this machine
		// (`pinnedd status`) is as trusted as one that sends it.
		a.tokens.AllowLoopbackAnonymous()
	}
	if shared := sharedUserPlugins(cfg.Specs, os.Geteuid()); len(shared) > 0 && !cfg.Dev {
		a.log.Warn("PLUGINS RUN AS PINNEDD'S OWN USER: they can read and alter everything pinnedd can, its data dir included (its keys are sealed under the deployment token, but not its Raft log's other entries, nor a --token-file pinnedd's user reads); run pinnedd as root, which runs them as an account of their own ("+supervisor.DefaultPluginUserName+", or --plugin-user NAME) (README: Plugins and the agent's user)",
			"plugins", shared, "uid", os.Geteuid())
	}
	if nobody := sharedAccountPlugins(cfg.Specs); len(nobody) > 0 {
		a.log.Warn("PLUGINS RUN AS THE SHARED ACCOUNT "+supervisor.SharedPluginUserName+": any other process running as "+supervisor.SharedPluginUserName+" can signal them and reach their sockets and temporary files; give them an account of their own: create "+supervisor.DefaultPluginUserName+" (systemd/pinnedd.sysusers; a root pinnedd runs its plugins as it when it exists), or set --plugin-user NAME (README: Plugins and the agent's user)",
			"plugins", nobody)
	}
	if cfg.InsecureCluster {
		a.log.Warn("INSECURE CLUSTER: Raft and node-to-node calls run without mutual TLS (--insecure-cluster); anyone who reaches --raft-addr or the front door's node-to-node routes can take this cluster over or destroy it")
	}
	for _, p := range []struct {
		part      string
		provision func(context.Context) error
	}{
		{"data dir", a.provisionDataDir},
		{"listener", a.provisionListener},
		{"state store", a.provisionStateStore},
		{"plugins", a.provisionPlugins},
		{"raft", a.provisionRaft},
		{"directory", a.provisionDirectory},
		{"worker", a.provisionWorker},
		{"front door", a.provisionFrontDoor},
	} {
		a.log.Debug("provisioning", "part", p.part)
		if err := p.provision(ctx); err != nil {
			_ = a.Stop(Ending{Err: err})
			return nil, err
		}
	}
	return a, nil
}

// Start sets the node to work: leader work (directory housekeeping, the
// marked-work scanner) for whenever this node leads, the front door, and
// the background work (join, waiting to be joined, the worker's lease,
// telling systemd it is ready).
func (a *Agent) Start() {
	a.started = true
	a.store.RunAsLeader("directory", pinboard.NewHousekeeping(a.dir, 0, a.log).Run)
	if a.states != nil {
		// Bounded: a scan must not hang on a store that stopped answering.
		scanner := pinboard.NewMarkedScanner(statestore.Bounded(a.states, 0, nil), a.fd, a.cfg.ScanInterval, a.log)
		a.store.RunAsLeader("scanner", scanner.Run)
	}
	var fenceGC *pinboard.FenceCollector
	if a.states != nil {
		fenceGC = pinboard.NewFenceCollector(a.dir, statestore.Bounded(a.states, 0, nil), a.cfg.FenceGCInterval, a.log)
		if a.cfg.DatabaseURL != "" {
			// One store for the fleet: its leader collects. Collecting from a follower's older
			// directory would be safe too (it only keeps more), just repeated work.
			a.store.RunAsLeader("fence gc", fenceGC.Run)
		}
	}

	go func() { a.serveErr <- a.fd.Serve(a.ln) }()
	var namespaces []string
	if a.sup != nil {
		namespaces = a.sup.Namespaces()
	}
	a.log.Info("front door listening", "addr", a.ln.Addr().String(), "advertise_url", a.advertise, "node_id", a.cfg.NodeID,
		"raft_addr", a.store.RaftAddr(), "namespaces", namespaces)

	ctx, cancel := context.WithCancel(context.Background())
	a.bgCancel = cancel
	if fenceGC != nil && a.cfg.DatabaseURL == "" {
		// This node's own store: it collects it, leader or not.
		a.background(ctx, fenceGC.Run)
	}
	if a.cfg.Join != "" {
		a.background(ctx, func(ctx context.Context) { joinUntilDone(ctx, a.cfg.Join, a.store, a.joinClient, a.log) })
	}
	if a.cfg.Join == "" && (!a.cfg.Bootstrap || a.store.HadExistingState()) {
		a.background(ctx, func(ctx context.Context) { waitToBeJoined(ctx, a.store, a.advertise, a.log) })
	}
	if a.worker != nil {
		a.background(ctx, func(ctx context.Context) {
			// Registering goes through the leader: until there is one (a
			// node waiting to be joined) it could only fail.
			if a.store.WaitForLeader(ctx) == nil {
				a.worker.Run(ctx)
			}
		})
	}
	a.background(ctx, a.history.Run)
	a.background(ctx, a.notifyReady)
	a.background(ctx, a.watchFleetMode)
}

// background runs fn until ctx ends; Stop waits for it.
func (a *Agent) background(ctx context.Context, fn func(context.Context)) {
	a.bg.Add(1)
	go func() { defer a.bg.Done(); fn(ctx) }()
}

// Ending says why a node stops, which decides the steps Stop takes.
type Ending struct {
	// DrainDeadline is how long instances get to finish (SIGTERM:
	// Config.DrainDeadline; a leave: the one it asked for).
	DrainDeadline time.Duration
	// Leave: after draining, deregister and leave the Raft cluster.
	Leave bool
	// Err is why the node failed; nil for a stop that was asked for. A
	// failed node does not drain.
	Err error
	// StorageFault: Raft's log storage failed. The node makes no Raft
	// writes (deregistration, leave) on its way out, as none can commit.
	StorageFault bool
}

// Wait serves SIGHUP (reload the front door's certificate, hot-swap every
// plugin) until there is a reason to stop: ctx ends (SIGTERM, SIGINT), a
// leave is asked for, the front door fails, or Raft's storage does.
func (a *Agent) Wait(ctx context.Context) Ending {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return Ending{DrainDeadline: a.cfg.DrainDeadline}
		case d := <-a.leave:
			a.log.Info("leaving the cluster: draining, then deregistering, leaving Raft and exiting", "deadline", d)
			return Ending{DrainDeadline: d, Leave: true}
		case err := <-a.serveErr:
			return Ending{Err: fmt.Errorf("front door: %w", err)}
		case err := <-a.store.Fatal():
			// raftstore logged what failed and what to do. Exit non-zero for
			// systemd to restart us (the log reopens consistently from disk).
			return Ending{Err: fmt.Errorf("raft storage: %w", err), StorageFault: true}
		case <-hup:
			a.reload()
		}
	}
}

// reload re-reads the front door's certificate and hot-swaps every plugin
// (SIGHUP, systemctl reload).
func (a *Agent) reload() {
	_ = sdnotify.Reloading()
	defer func() { _ = sdnotify.Ready() }()
	if a.frontCert != nil {
		_ = a.frontCert.Reload() // logged; the working pair stays
	}
	if a.sup == nil {
		return
	}
	a.log.Info("SIGHUP: reloading plugins")
	if err := a.sup.Reload(context.Background(), ""); err != nil {
		a.log.Error("plugin reload failed", "err", err)
	}
}

// sharedAccountPlugins names the plugins that run as
// supervisor.SharedPluginUserName, the default of a root pinnedd on a
// machine without supervisor.DefaultPluginUserName (or an operator's
// --plugin-user): an account other daemons may run as too.
func sharedAccountPlugins(specs []supervisor.Spec) []string {
	var out []string
	for _, sp := range specs {
		if sp.User != nil && sp.User.Name == supervisor.SharedPluginUserName {
			out = append(out, sp.Name)
		}
	}
	return out
}

// sharedUserPlugins names the plugins that would run as uid, pinnedd's own
// user: those given no user of their own, or their own user with that uid.
func sharedUserPlugins(specs []supervisor.Spec, uid int) []string {
	var out []string
	for _, sp := range specs {
		if sp.User == nil || int(sp.User.UID) == uid {
			out = append(out, sp.Name)
		}
	}
	return out
}
