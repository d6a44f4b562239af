package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pinnedd/pinnedd/internal/datadir"
	"github.com/pinnedd/pinnedd/internal/procstat"
	"github.com/pinnedd/pinnedd/internal/sdnotify"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore"
	"github.com/pinnedd/pinnedd/supervisor"
)

// runAgent runs the node until ctx ends, then shuts it down in order:
// refuse new work, evict instances (releasing their placements), stop the
// plugins, deregister, close the front door, close Raft (handing
// leadership over first).
func runAgent(ctx context.Context, cfg agentConfig) error {
	log := cfg.logger
	if cfg.dev {
		log.Warn("DEV MODE: one-node cluster, token dev-token accepted, and calls with no token from this machine; never run this in production")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tokens := pinboard.NewTokens(cfg.tokens...)
	if cfg.dev {
		// dev-token is public anyway: a token-less call from this machine
		// (`pinnedd status`) is as trusted as one that sends it.
		tokens.AllowLoopbackAnonymous()
	}

	if cfg.insecureCluster {
		log.Warn("INSECURE CLUSTER: Raft runs without mutual TLS (--insecure-cluster); anyone who reaches --raft-addr can take this cluster over or destroy it")
	}

	dataDir := cfg.dataDir
	if dataDir == "" { // --dev only
		// A dev agent ended by kill -9 could not remove its own.
		if removed, err := datadir.SweepStale(os.TempDir()); err != nil {
			log.Warn("sweeping dead dev agents' data dirs", "err", err)
		} else if len(removed) > 0 {
			log.Info("removed data dirs of dev agents that are gone", "dirs", removed)
		}
		tmp, err := os.MkdirTemp("", datadir.DevPrefix+"*")
		if err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		defer os.RemoveAll(tmp)
		dataDir = tmp
	}
	// Held until exit: everything in the data dir is this process's, so
	// what a dead predecessor left there (plugin sockets) is stale.
	dirLock, err := datadir.Acquire(dataDir)
	if err != nil {
		return err
	}
	defer dirLock.Release()

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("front door: %w", err)
	}
	defer ln.Close()
	advertise, err := advertiseURL(cfg.advertiseURL, ln.Addr())
	if err != nil {
		return err
	}

	var fd *pinboard.FrontDoor
	var sup *supervisor.Supervisor
	var states statestore.Store
	if !cfg.noHosts {
		states, err = openStateStore(ctx, cfg, dataDir)
		if err != nil {
			return err
		}
		defer states.Close()
		sup, err = supervisor.New(supervisor.Config{
			Specs: cfg.specs, Logger: log, Registerer: reg, Store: states, RuntimeDir: runtimeDir(dataDir), FrontDoorURL: advertise,
			DetachedTimeout: cfg.detachedTimeout, StopGrace: cfg.stopGrace, StablePeriod: cfg.stablePeriod,
			SwapDeadline: cfg.swapDeadline, KeepPlacementsOnIdle: cfg.databaseURL == "",
			OnEvicted: func(k supervisor.Key, gen uint64, release bool) { fd.Released(k.Namespace, k.ID, gen, release) },
		})
		if err != nil {
			return err
		}
		if err := sup.Start(ctx); err != nil {
			return fmt.Errorf("start plugins: %w", err)
		}
		defer sup.Stop(context.Background())
	}

	machine := directory.New()
	store, err := raftstore.Open(ctx, raftstore.Config{
		NodeID: cfg.nodeID, RaftAddr: cfg.raftAddr, AdvertiseRaftAddr: cfg.raftAdvertise,
		APIAddr: advertise, DataDir: dataDir, Bootstrap: cfg.bootstrap, MaxVoters: cfg.maxVoters,
		LogStore: cfg.raftLogStore, TLS: cfg.raftTLS(),
		Logger: log, Token: cfg.tokens[0], Registerer: reg,
		HeartbeatTimeout: cfg.raftTimeout, ElectionTimeout: cfg.raftTimeout,
		LeaderLeaseTimeout: cfg.raftTimeout / 2,
	}, machine)
	if err != nil {
		return fmt.Errorf("open raft: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.Close(cctx); err != nil {
			log.Warn("close raft", "err", err)
		}
	}()
	dir := pinboard.NewDirectory(machine, store)
	dir.SetHandOff(store.HTTPClient(), cfg.tokens[0])
	defer dir.Close()
	store.RunAsLeader("directory", func(ctx context.Context) { directoryLeader(ctx, dir, log) })

	registry := pinboard.NewRegistry(dir, cfg.leaseTTL)
	var quarantine time.Duration
	if !cfg.dev {
		quarantine = cfg.leaseTTL
	}
	fdc := pinboard.FrontDoorConfig{
		Dir: dir, Tokens: tokens, Registry: registry,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Logger: log, Registerer: reg,
		Quarantine: quarantine, AccessLog: cfg.accessLog, FastPath: cfg.fastPath, IdleTimeout: cfg.idleTimeout,
		MetricsPublic: cfg.metricsPublic, BodyReadTimeout: cfg.bodyReadTimeout,
		MaxConnsPerIP: cfg.maxConnsPerIP, MaxConns: cfg.maxConns, PeerAddrs: func() []string { return memberAPIAddrs(store) },
		Policy: pinboard.PlacementPolicy{BalanceFactor: cfg.balanceFactor}, TrustedProxies: cfg.trustedProxies,
		Ready:  func() bool { id, _ := store.Leader(); return id != "" && store.Fault() == nil },
		Health: func() map[string]any { return raftHealth(store) },
		Status: func() map[string]any {
			st := map[string]any{
				"nodeId": cfg.nodeID, "version": version, "dev": cfg.dev, "advertiseUrl": advertise, "pid": os.Getpid(),
				"raft": raftHealth(store), "clusterTLS": store.ClusterTLS(), "insecureCluster": cfg.insecureCluster,
			}
			if sup != nil {
				st["plugins"], st["instances"] = sup.Plugins(), sup.Instances()
			}
			return st
		},
	}
	if sup != nil {
		fdc.ClusterCalls = sup.VerifyClusterCall
	}
	var worker *pinboard.Worker
	if sup != nil {
		worker = pinboard.NewWorker(pinboard.WorkerConfig{
			NodeID: cfg.nodeID, AdvertiseURL: advertise, Namespaces: sup.Namespaces(),
			TTL: cfg.leaseTTL, Interval: cfg.heartbeat, Logger: log,
			StateFile: filepath.Join(dataDir, "worker.json"),
			LiveIDs: func() []pinboard.InstanceKey {
				var out []pinboard.InstanceKey
				for _, in := range sup.Instances() {
					out = append(out, pinboard.InstanceKey{Namespace: in.Namespace, ID: in.ID})
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
					sup.Quit(qctx, supervisor.Key{Namespace: k.Namespace, ID: k.ID})
				}
			},
		}, registry)
		fdc.Worker, fdc.Local = worker, sup
		fdc.Ready = sup.Ready
		fdc.Drain = func(deadline time.Time, cordon bool) {
			sup.SetDrain(supervisor.DrainLocal, deadline, cordon)
			// Tell the directory now, not at the next heartbeat: new
			// placements must skip this node.
			go func() {
				hctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				worker.HeartbeatNow(hctx)
			}()
		}
		fdc.WindDown = sup.WindDown
		fdc.Reload = func(ctx context.Context, ns string) error {
			if err := sup.Reload(ctx, ns); errors.Is(err, supervisor.ErrUnknownNS) {
				return fmt.Errorf("%w: %s", pinboard.ErrUnknownNamespace, ns)
			} else if err != nil {
				return err
			}
			return nil
		}
		fdc.WorkerStats = func(ctx context.Context) map[string]any {
			nss, insts := sup.Stats(ctx)
			p := procstat.Read()
			return map[string]any{
				"nodeId": cfg.nodeID, "namespaces": nss, "instances": insts, "plugins": sup.Plugins(),
				"uptimeMs": p.UptimeMs, "rssBytes": p.RSSBytes, "cpuPercent": p.CPUPercent,
			}
		}
	}
	fd = pinboard.NewFrontDoor(fdc)
	if states != nil {
		// Bounded: a scan must not hang on a store that stopped answering.
		store.RunAsLeader("scanner", func(ctx context.Context) {
			scanMarked(ctx, statestore.Bounded(states, 0, nil), fd, cfg.scanInterval, log)
		})
	}
	member := func(r *http.Request) bool {
		return tokens.Allowed(r, pinboard.ScopeWorker) || tokens.Allowed(r, pinboard.ScopeOperator)
	}
	fd.Handle(raftstore.HandlerPrefix, store.Handler(member))
	fd.Handle("POST "+pinboard.HandOffPath, tokens.Require(dir.ServeHandOff, pinboard.ScopeWorker, pinboard.ScopeOperator))
	fd.Handle("POST /_pinned/join", joinHandler(tokens, cfg, store, log))
	leaveCh := make(chan time.Duration, 1)
	fd.Handle("POST /_pinned/leave", fd.RequireScope(pinboard.ScopeOperator, leaveHandler(store, cfg.drainDeadline, leaveCh)))
	// Go's profiles, for an operator chasing CPU or memory in a running
	// node (Consul and Nomad expose them behind an operator ACL too).
	fd.Handle("/_pinned/debug/pprof/", fd.RequireScope(pinboard.ScopeOperator, servePprof))

	serveErr := make(chan error, 1)
	go func() { serveErr <- fd.Serve(ln) }()
	var namespaces []string
	if sup != nil {
		namespaces = sup.Namespaces()
	}
	log.Info("front door listening", "addr", ln.Addr().String(), "advertise_url", advertise, "node_id", cfg.nodeID,
		"raft_addr", store.RaftAddr(), "namespaces", namespaces)

	wctx, wcancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	if cfg.join != "" {
		bg.Add(1)
		go func() { defer bg.Done(); joinUntilDone(wctx, cfg.join, cfg.tokens[0], store, log) }()
	}
	if !cfg.bootstrap && cfg.join == "" && !store.HadExistingState() {
		bg.Add(1)
		go func() { defer bg.Done(); waitToBeJoined(wctx, store, advertise, log) }()
	}
	if worker != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			// Registering goes through the leader: until there is one
			// (a node waiting to be joined) it could only fail.
			if store.WaitForLeader(wctx) == nil {
				worker.Run(wctx)
			}
		}()
	}

	bg.Add(1)
	go func() { defer bg.Done(); notifyReady(wctx, worker, store, log) }()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var runErr error
	leaving, storageFault := false, false
	drainDeadline := cfg.drainDeadline
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case d := <-leaveCh:
			leaving, drainDeadline = true, d
			log.Info("leaving the cluster: draining, then deregistering, leaving Raft and exiting", "deadline", d)
			break loop
		case err := <-serveErr:
			runErr = fmt.Errorf("front door: %w", err)
			break loop
		case err := <-store.Fatal():
			// raftstore logged what failed and what to do. Exit non-zero for systemd to
			// restart us (the log reopens consistently from disk); no drain, deregistration
			// or leave, which are Raft writes this node can no longer make.
			runErr, storageFault = fmt.Errorf("raft storage: %w", err), true
			break loop
		case <-hup:
			if sup == nil {
				continue
			}
			// SIGHUP (systemctl reload): hot-swap every plugin.
			_ = sdnotify.Reloading()
			log.Info("SIGHUP: reloading plugins")
			if err := sup.Reload(context.Background(), ""); err != nil {
				log.Error("plugin reload failed", "err", err)
			}
			_ = sdnotify.Ready()
		}
	}
	_ = sdnotify.Stopping()
	if sup != nil && runErr == nil {
		// SIGTERM drains: no new activations, idle instances go at once,
		// the rest when their work is done or at the deadline; then exit.
		deadline := time.Now().Add(drainDeadline)
		fd.Drain(deadline, false)
		dctx, dcancel := context.WithDeadline(context.Background(), deadline.Add(deadlineGrace))
		if err := sup.WaitDrained(dctx); err != nil {
			log.Warn("drain deadline passed with instances left; stopping them", "err", err)
		} else {
			log.Info("drained")
		}
		dcancel()
	}
	log.Info("shutting down")

	fd.SetStopping()
	if sup != nil {
		sup.Stop(context.Background()) // evicts, releasing placements, and ends every plugin
	}
	wcancel()
	bg.Wait()
	if worker != nil && !storageFault {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := worker.Deregister(dctx); err != nil {
			log.Warn("deregister failed", "err", err)
		}
		dcancel()
	}
	if leaving && !storageFault {
		// Leadership is handed over first when this node leads.
		lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := store.Leave(lctx); err != nil {
			log.Error("leaving the Raft cluster failed; it still counts this node as a member (pinnedd remove "+cfg.nodeID+" from another node)", "err", err)
			runErr = fmt.Errorf("leave: %w", err)
		}
		lcancel()
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := fd.Shutdown(sctx); err != nil {
		log.Warn("requests still under way at the shutdown deadline; cut them off", "err", err)
	}
	log.Info("stopped")
	return runErr
}

// memberAPIAddrs lists the Raft members' front-door addresses (the per-IP
// connection cap exempts them).
func memberAPIAddrs(store *raftstore.Store) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ms, err := store.Members(ctx)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.APIAddr)
	}
	return out
}

// advertiseURL is the flag's value, or http://<bound address> when that
// names a concrete host.
func advertiseURL(flag string, bound net.Addr) (string, error) {
	if flag != "" {
		u, err := url.Parse(flag)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--advertise-url %q: want http(s)://host:port", flag)
		}
		return strings.TrimRight(flag, "/"), nil
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("--http-addr %s listens on every interface: set --advertise-url to the address other nodes reach", bound)
	}
	return "http://" + bound.String(), nil
}

// openStateStore opens the node's instance state store: Postgres when
// --database-url is set (shared by the fleet, so any node can restore any
// id), else an embedded bbolt file in the data dir (this node only).
func openStateStore(ctx context.Context, cfg agentConfig, dataDir string) (statestore.Store, error) {
	var st statestore.Store
	if cfg.databaseURL != "" {
		pg, err := pgstore.Open(ctx, cfg.databaseURL)
		if err != nil {
			return nil, fmt.Errorf("state store: %w", err)
		}
		st = pg
	} else {
		b, err := boltstore.Open(filepath.Join(dataDir, "state.db"))
		if err != nil {
			return nil, fmt.Errorf("state store: %w", err)
		}
		st = b
		if !cfg.dev {
			cfg.logger.Warn("--local-state: instance state is in this node's data dir only; an id that moves to another node starts empty there")
		}
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := st.Setup(sctx); err != nil {
		st.Close()
		return nil, fmt.Errorf("state store setup: %w", err)
	}
	return st, nil
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

// deadlineGrace is how long past the drain deadline SIGTERM waits for the
// last evictions before stopping everything.
const deadlineGrace = 3 * time.Second

// notifyReady tells systemd READY=1 once the node serves: Raft is open,
// the front door listens and the worker is registered (a node without
// hosts: once it follows a leader).
func notifyReady(ctx context.Context, worker *pinboard.Worker, store *raftstore.Store, log *slog.Logger) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ready := false
		if worker != nil {
			ready = worker.Lease(time.Now()) == pinboard.LeaseHealthy
		} else {
			id, _ := store.Leader()
			ready = id != ""
		}
		if ready {
			if err := sdnotify.Ready(); err != nil {
				log.Warn("sd_notify READY", "err", err)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// servePprof serves net/http/pprof under /_pinned/debug/pprof/ (its Index
// only knows /debug/pprof/, so named profiles are routed here).
func servePprof(w http.ResponseWriter, r *http.Request) {
	switch name := strings.TrimPrefix(r.URL.Path, "/_pinned/debug/pprof/"); name {
	case "":
		pprof.Index(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "trace":
		pprof.Trace(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "cmdline":
		pprof.Cmdline(w, r)
	default:
		pprof.Handler(name).ServeHTTP(w, r)
	}
}
