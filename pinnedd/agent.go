package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
	"go.etcd.io/bbolt"

	"github.com/pinnedd/pinnedd/examples"
	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/procstat"
	"github.com/pinnedd/pinnedd/internal/sdnotify"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/boltstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore"
	"github.com/pinnedd/pinnedd/supervisor"
)

// devToken is the token --dev accepts, as the seed's dev pinboard does.
const devToken = "dev-token"

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "run a pinnedd node",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dev", Usage: "one node, in-process directory, built-in example hosts, token dev-token (refused in production)", EnvVars: []string{"PINNEDD_DEV"}},
			&cli.StringFlag{Name: "node-id", Usage: "this node's name in the cluster (default: hostname)", EnvVars: []string{"PINNEDD_NODE_ID"}},
			&cli.StringFlag{Name: "http-addr", Value: "127.0.0.1:8080", Usage: "front door listen address", EnvVars: []string{"PINNEDD_HTTP_ADDR"}},
			&cli.StringFlag{Name: "advertise-url", Usage: "URL other nodes reach this one at (default: http://<http-addr>)", EnvVars: []string{"ADVERTISE_URL"}},
			&cli.StringFlag{Name: "data-dir", Usage: "where durable node state lives (Raft log, snapshots); --dev without it uses a temporary one", EnvVars: []string{"PINNEDD_DATA_DIR"}},
			&cli.StringFlag{Name: "raft-addr", Value: "127.0.0.1:8300", Usage: "Raft transport listen address (--dev default: a free loopback port)", EnvVars: []string{"PINNEDD_RAFT_ADDR"}},
			&cli.StringFlag{Name: "raft-advertise-addr", Usage: "Raft address other nodes dial (default: the bound --raft-addr)", EnvVars: []string{"PINNEDD_RAFT_ADVERTISE_ADDR"}},
			&cli.BoolFlag{Name: "bootstrap", Usage: "start a new cluster with this node as its only voter (a no-op once the data dir holds Raft state)", EnvVars: []string{"PINNEDD_BOOTSTRAP"}},
			&cli.StringFlag{Name: "join", Usage: "join the cluster through the member at `URL` (any member; repeated harmlessly on restart)", EnvVars: []string{"PINNEDD_JOIN"}},
			&cli.IntFlag{Name: "max-voters", Value: 3, Usage: "Raft voters (3 or 5); members joining beyond it are nonvoters", EnvVars: []string{"PINNEDD_MAX_VOTERS"}},
			&cli.DurationFlag{Name: "raft-timeout", Usage: "Raft heartbeat and election timeout (default: hashicorp/raft's 1s)", EnvVars: []string{"PINNEDD_RAFT_TIMEOUT"}, Hidden: true},
			&cli.StringSliceFlag{Name: "plugin", Usage: "serve `/NS=PATH`: namespace NS from the plugin binary at PATH (repeatable)", EnvVars: []string{"PINNEDD_PLUGINS"}},
			&cli.StringFlag{Name: "database-url", Usage: "Postgres for instance state, shared by the fleet (default: an embedded store in --data-dir)", EnvVars: []string{"DATABASE_URL"}},
			&cli.DurationFlag{Name: "scan-interval", Value: 5 * time.Second, Usage: "how often the leader looks for marked durable work to resume", EnvVars: []string{"PINNEDD_SCAN_INTERVAL"}},
			&cli.BoolFlag{Name: "no-hosts", Usage: "serve no instances: a pure front door and Raft member (the seed's pinboard role)", EnvVars: []string{"PINNEDD_NO_HOSTS"}},
			&cli.StringFlag{Name: "token", Usage: "deployment token (worker and operator scopes)", EnvVars: []string{"PINBOARD_TOKEN"}},
			&cli.DurationFlag{Name: "lease-ttl", Value: pinboard.DefaultLeaseTTL, Usage: "worker lease TTL (also PINBOARD_LEASE_TTL_MS)", EnvVars: []string{"PINNEDD_LEASE_TTL"}},
			&cli.DurationFlag{Name: "heartbeat-interval", Value: pinboard.DefaultHeartbeatInterval, Usage: "worker heartbeat interval", EnvVars: []string{"PINNEDD_HEARTBEAT_INTERVAL"}},
			&cli.DurationFlag{Name: "detached-timeout", Value: 60 * time.Second, Usage: "evict an instance with no open request for this long (a host may set its own)", EnvVars: []string{"PINNEDD_DETACHED_TIMEOUT"}},
			&cli.DurationFlag{Name: "drain-deadline", Value: 30 * time.Second, Usage: "on SIGTERM, drain: instances with work get this long before they are evicted", EnvVars: []string{"PINNEDD_DRAIN_DEADLINE"}},
			&cli.DurationFlag{Name: "swap-deadline", Value: 10 * time.Second, Usage: "on a plugin hot swap, the old process's instances get this long to wind down", EnvVars: []string{"PINNEDD_SWAP_DEADLINE"}},
			&cli.DurationFlag{Name: "stop-grace", Value: 10 * time.Second, Usage: "at shutdown, how long instances' tasks get to return", EnvVars: []string{"PINNEDD_STOP_GRACE"}},
			&cli.DurationFlag{Name: "plugin-stable-period", Value: 30 * time.Second, Usage: "a plugin run this long resets its crash count", EnvVars: []string{"PINNEDD_PLUGIN_STABLE_PERIOD"}},
			&cli.Float64Flag{Name: "affinity-balance-factor", Value: pinboard.DefaultBalanceFactor, Usage: "keep a client's preferred worker while its headroom is at least the best / this", EnvVars: []string{"PINBOARD_AFFINITY_BALANCE_FACTOR"}},
			&cli.StringFlag{Name: "trusted-proxies", Usage: "comma-separated IPs/CIDRs whose X-Forwarded-For/Forwarded name the client", EnvVars: []string{"PINBOARD_TRUSTED_PROXIES"}},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: []string{"LOG_LEVEL"}},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: []string{"PINNEDD_LOG_FORMAT"}},
		},
		Action: func(c *cli.Context) error {
			cfg, err := agentConfigFrom(c)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			return runAgent(ctx, cfg)
		},
	}
}

type agentConfig struct {
	drainDeadline   time.Duration
	swapDeadline    time.Duration
	databaseURL     string
	scanInterval    time.Duration
	balanceFactor   float64
	trustedProxies  []netip.Prefix
	dev             bool
	noHosts         bool
	raftAddr        string
	raftAdvertise   string
	bootstrap       bool
	join            string
	maxVoters       int
	raftTimeout     time.Duration
	nodeID          string
	httpAddr        string
	advertiseURL    string
	dataDir         string
	specs           []supervisor.Spec
	tokens          []string
	leaseTTL        time.Duration
	heartbeat       time.Duration
	detachedTimeout time.Duration
	stopGrace       time.Duration
	stablePeriod    time.Duration
	logger          *slog.Logger
}

func agentConfigFrom(c *cli.Context) (agentConfig, error) {
	logger, err := newLogger(c.String("log-level"), c.String("log-format"))
	if err != nil {
		return agentConfig{}, err
	}
	cfg := agentConfig{
		dev:             c.Bool("dev"),
		noHosts:         c.Bool("no-hosts"),
		raftAddr:        c.String("raft-addr"),
		raftAdvertise:   c.String("raft-advertise-addr"),
		bootstrap:       c.Bool("bootstrap"),
		join:            c.String("join"),
		maxVoters:       c.Int("max-voters"),
		raftTimeout:     c.Duration("raft-timeout"),
		nodeID:          c.String("node-id"),
		httpAddr:        c.String("http-addr"),
		advertiseURL:    c.String("advertise-url"),
		dataDir:         c.String("data-dir"),
		leaseTTL:        c.Duration("lease-ttl"),
		heartbeat:       c.Duration("heartbeat-interval"),
		detachedTimeout: c.Duration("detached-timeout"),
		stopGrace:       c.Duration("stop-grace"),
		stablePeriod:    c.Duration("plugin-stable-period"),
		logger:          logger,
	}
	if ms := os.Getenv("PINBOARD_LEASE_TTL_MS"); ms != "" && !c.IsSet("lease-ttl") {
		d, err := time.ParseDuration(ms + "ms")
		if err != nil {
			return cfg, fmt.Errorf("PINBOARD_LEASE_TTL_MS: %w", err)
		}
		cfg.leaseTTL = d
	}
	cfg.balanceFactor = c.Float64("affinity-balance-factor")
	cfg.databaseURL = c.String("database-url")
	cfg.drainDeadline = c.Duration("drain-deadline")
	cfg.swapDeadline = c.Duration("swap-deadline")
	cfg.scanInterval = c.Duration("scan-interval")
	if cfg.trustedProxies, err = pinboard.ParseTrustedProxies(c.String("trusted-proxies")); err != nil {
		return cfg, fmt.Errorf("--trusted-proxies: %w", err)
	}
	if cfg.heartbeat >= cfg.leaseTTL {
		return cfg, fmt.Errorf("--heartbeat-interval (%s) must be shorter than --lease-ttl (%s)", cfg.heartbeat, cfg.leaseTTL)
	}
	if cfg.nodeID == "" {
		cfg.nodeID, _ = os.Hostname()
	}
	if t := c.String("token"); t != "" {
		cfg.tokens = append(cfg.tokens, t)
	}
	if cfg.dev {
		if err := devAllowed(os.Getenv); err != nil {
			return cfg, err
		}
		cfg.tokens = append(cfg.tokens, devToken)
		cfg.bootstrap = true
		if !c.IsSet("raft-addr") {
			cfg.raftAddr = "127.0.0.1:0"
		}
		if cfg.join != "" {
			return cfg, errors.New("--dev is a one-node cluster: it cannot --join")
		}
		if !c.IsSet("raft-timeout") {
			// One voter elects itself; no need to wait out a LAN timeout.
			cfg.raftTimeout = 300 * time.Millisecond
		}
	} else {
		if len(cfg.tokens) == 0 {
			return cfg, errors.New("a fleet node needs a deployment token: set PINBOARD_TOKEN (or --token)")
		}
		if cfg.dataDir == "" {
			return cfg, errors.New("a fleet node needs --data-dir (its Raft log lives there)")
		}
	}
	if cfg.bootstrap && cfg.join != "" {
		return cfg, errors.New("--bootstrap and --join exclude each other: bootstrap one node, join the rest")
	}
	if cfg.maxVoters != 3 && cfg.maxVoters != 5 && cfg.maxVoters != 1 {
		return cfg, fmt.Errorf("--max-voters %d: use 3 or 5 (1 for a single node)", cfg.maxVoters)
	}
	if cfg.noHosts {
		if len(c.StringSlice("plugin")) > 0 || cfg.dev {
			return cfg, errors.New("--no-hosts serves no instances: it excludes --plugin and --dev")
		}
		return cfg, nil
	}
	specs, err := pluginSpecs(c.StringSlice("plugin"), cfg.dev)
	if err != nil {
		return cfg, err
	}
	cfg.specs = specs
	if len(cfg.specs) == 0 {
		return cfg, errors.New("no hosts to serve: give --plugin /ns=path (or --dev for the built-in examples, or --no-hosts for a pure front door)")
	}
	return cfg, nil
}

// devAllowed refuses --dev in production, as the seed's local mode does.
func devAllowed(getenv func(string) string) error {
	for _, v := range []string{"NODE_ENV", "ENVIRONMENT", "APP_ENV"} {
		switch strings.ToLower(getenv(v)) {
		case "production", "prod":
			if getenv("PINBOARD_ALLOW_DEV_IN_PRODUCTION") == "1" {
				return nil
			}
			return fmt.Errorf("--dev refused: %s=%s (set PINBOARD_ALLOW_DEV_IN_PRODUCTION=1 to override)", v, getenv(v))
		}
	}
	return nil
}

// pluginSpecs turns --plugin /ns=path flags into one spec per binary; with
// builtin, the built-in example hosts not overridden by a flag run in one
// more plugin process (pinnedd re-executing itself).
func pluginSpecs(flags []string, builtin bool) ([]supervisor.Spec, error) {
	byPath := map[string]*supervisor.Spec{}
	var order []string
	claimed := map[string]string{}
	for _, f := range flags {
		ns, path, ok := strings.Cut(f, "=")
		if !ok || path == "" {
			return nil, fmt.Errorf("--plugin %q: want /namespace=/path/to/binary", f)
		}
		if err := plugins.ValidateNamespace(ns); err != nil {
			return nil, fmt.Errorf("--plugin %q: %w", f, err)
		}
		if prev, dup := claimed[ns]; dup {
			return nil, fmt.Errorf("--plugin: namespace %s given twice (%s and %s)", ns, prev, path)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("--plugin %q: %w", f, err)
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("--plugin %q: %s is not an executable file", f, abs)
		}
		claimed[ns] = abs
		sp := byPath[abs]
		if sp == nil {
			sp = &supervisor.Spec{Path: abs}
			byPath[abs] = sp
			order = append(order, abs)
		}
		sp.Namespaces = append(sp.Namespaces, ns)
	}
	var specs []supervisor.Spec
	names := map[string]int{}
	for _, p := range order {
		sp := *byPath[p]
		sp.Name = uniqueName(names, filepath.Base(p))
		specs = append(specs, sp)
	}
	if builtin {
		var nss []string
		for ns := range examples.Builtin() {
			if _, overridden := claimed[ns]; !overridden {
				nss = append(nss, ns)
			}
		}
		slices.Sort(nss)
		if len(nss) > 0 {
			self, err := os.Executable()
			if err != nil {
				return nil, fmt.Errorf("find own binary for the built-in hosts: %w", err)
			}
			specs = append(specs, supervisor.Spec{
				Name: uniqueName(names, "builtin"), Path: self,
				Args: append([]string{"plugin-host"}, nss...), Namespaces: nss,
			})
		}
	}
	return specs, nil
}

func uniqueName(seen map[string]int, base string) string {
	seen[base]++
	if n := seen[base]; n > 1 {
		return fmt.Sprintf("%s-%d", base, n)
	}
	return base
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

// runAgent runs the node until ctx ends, then shuts it down in order:
// refuse new work, evict instances (releasing their placements), stop the
// plugins, deregister, close the front door, close Raft (handing
// leadership over first).
func runAgent(ctx context.Context, cfg agentConfig) error {
	log := cfg.logger
	if cfg.dev {
		log.Warn("DEV MODE: one-node cluster, token dev-token accepted, no attestation; never run this in production")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tokens := pinboard.NewTokens(cfg.tokens...)

	dataDir := cfg.dataDir
	if dataDir == "" { // --dev only
		tmp, err := os.MkdirTemp("", "pinnedd-dev-")
		if err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		defer os.RemoveAll(tmp)
		dataDir = tmp
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("front door: %w", err)
	}
	defer ln.Close()
	advertise, err := advertiseURL(cfg.advertiseURL, ln.Addr())
	if err != nil {
		return err
	}

	callToken := make([]byte, 16)
	_, _ = rand.Read(callToken)
	clusterCallToken := hex.EncodeToString(callToken)
	for i := range cfg.specs {
		cfg.specs[i].Env = append(cfg.specs[i].Env,
			plugins.EnvFrontDoor+"="+advertise, plugins.EnvClusterCallToken+"="+clusterCallToken)
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
			Specs: cfg.specs, Logger: log, Registerer: reg, Store: states,
			DetachedTimeout: cfg.detachedTimeout, StopGrace: cfg.stopGrace, StablePeriod: cfg.stablePeriod,
			SwapDeadline: cfg.swapDeadline,
			OnEvicted:    func(k supervisor.Key, gen uint64, release bool) { fd.Released(k.Namespace, k.ID, gen, release) },
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
		Logger: log, Token: cfg.tokens[0],
		HeartbeatTimeout: cfg.raftTimeout, ElectionTimeout: cfg.raftTimeout,
		LeaderLeaseTimeout: cfg.raftTimeout / 2,
	}, machine)
	if err != nil {
		return fmt.Errorf("open raft: %w", dataDirInUse(err, dataDir))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.Close(cctx); err != nil {
			log.Warn("close raft", "err", err)
		}
	}()
	dir := pinboard.NewDirectory(machine, store)
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
		Quarantine: quarantine,
		Policy:     pinboard.PlacementPolicy{BalanceFactor: cfg.balanceFactor}, TrustedProxies: cfg.trustedProxies,
		ClusterCallToken: clusterCallToken,
		Ready:            func() bool { id, _ := store.Leader(); return id != "" },
		Health:           func() map[string]any { return raftHealth(store) },
		Status: func() map[string]any {
			st := map[string]any{
				"nodeId": cfg.nodeID, "version": version, "advertiseUrl": advertise, "pid": os.Getpid(),
				"raft": raftHealth(store),
			}
			if sup != nil {
				st["plugins"], st["instances"] = sup.Plugins(), sup.Instances()
			}
			return st
		},
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
				for _, k := range keys {
					sup.Evict(context.Background(), supervisor.Key{Namespace: k.Namespace, ID: k.ID}, 0)
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
		store.RunAsLeader("scanner", func(ctx context.Context) { scanMarked(ctx, states, fd, cfg.scanInterval, log) })
	}
	member := func(r *http.Request) bool {
		return tokens.Allowed(r, pinboard.ScopeWorker) || tokens.Allowed(r, pinboard.ScopeOperator)
	}
	fd.Handle(raftstore.HandlerPrefix, store.Handler(member))
	fd.Handle("POST /_pinned/join", joinHandler(tokens, cfg, store, log))

	srv := &http.Server{Handler: fd, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
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
	if worker != nil {
		bg.Add(1)
		go func() { defer bg.Done(); worker.Run(wctx) }()
	}

	bg.Add(1)
	go func() { defer bg.Done(); notifyReady(wctx, worker, store, log) }()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-serveErr:
			runErr = fmt.Errorf("front door: %w", err)
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
		deadline := time.Now().Add(cfg.drainDeadline)
		log.Info("draining", "deadline", cfg.drainDeadline)
		fdc.Drain(deadline, false)
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
	if worker != nil {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := worker.Deregister(dctx); err != nil {
			log.Warn("deregister failed", "err", err)
		}
		dcancel()
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	log.Info("stopped")
	return runErr
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

// directoryLeader is the leader-only directory upkeep: it makes sure the
// cluster secret exists and garbage-collects lapsed workers and expired
// drains.
func directoryLeader(ctx context.Context, dir *pinboard.Directory, log *slog.Logger) {
	if len(dir.Machine().Secret()) == 0 {
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		if _, err := dir.Do(ctx, directory.Init{Secret: secret}); err != nil && ctx.Err() == nil {
			log.Warn("init cluster secret", "err", err)
		}
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			res, err := dir.Do(ctx, directory.GC{Now: time.Now().UnixMilli()})
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("directory gc", "err", err)
				}
				continue
			}
			if res.WorkersForgotten+res.DrainsExpired > 0 {
				log.Info("directory gc", "workers_forgotten", res.WorkersForgotten, "placements_dropped", res.PlacementsDropped, "drains_expired", res.DrainsExpired)
			}
		}
	}
}

func raftHealth(store *raftstore.Store) map[string]any {
	id, api := store.Leader()
	st := store.Stats()
	return map[string]any{
		"leader": id, "leaderUrl": api, "raftState": st["state"], "isLeader": store.IsLeader(),
		"term": st["term"], "lastContact": st["last_contact"],
	}
}

// joinUntilDone asks the member at url to add this node, retrying with
// backoff until it succeeds: on a restart it is harmless (join is
// idempotent), and the member may simply not be up yet.
func joinUntilDone(ctx context.Context, url, token string, store *raftstore.Store, log *slog.Logger) {
	client := &http.Client{Timeout: 15 * time.Second}
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		err := raftstore.JoinVia(ctx, client, url, token, store.NodeID(), store.RaftAddr(), store.APIAddr())
		if err == nil {
			log.Info("joined the cluster", "via", url)
			return
		}
		log.Warn("join failed; retrying", "via", url, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// joinHandler serves POST /_pinned/join {"url": ...}: `pinnedd join` asks
// the local agent to join the cluster through the member at url.
func joinHandler(tokens *pinboard.Tokens, cfg agentConfig, store *raftstore.Store, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokens.Allowed(r, pinboard.ScopeOperator) {
			httpx.WriteError(w, http.StatusForbidden, "forbidden", 0)
			return
		}
		var req struct {
			URL string `json:"url"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.URL == "" {
			httpx.WriteError(w, http.StatusBadRequest, `body must be {"url": "http://member:port"}`, 0)
			return
		}
		if u, err := url.Parse(req.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			httpx.WriteError(w, http.StatusBadRequest, "url must be an absolute http(s) URL", 0)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		err := raftstore.JoinVia(ctx, &http.Client{}, req.URL, cfg.tokens[0], store.NodeID(), store.RaftAddr(), store.APIAddr())
		if err != nil {
			log.Warn("join failed", "via", req.URL, "err", err)
			httpx.WriteError(w, http.StatusBadGateway, "join via "+req.URL+": "+err.Error(), 0)
			return
		}
		log.Info("joined the cluster", "via", req.URL)
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "nodeId": store.NodeID()})
	})
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
			return nil, fmt.Errorf("state store: %w", dataDirInUse(err, dataDir))
		}
		st = b
		if !cfg.dev {
			cfg.logger.Warn("instance state is in this node's data dir only; give --database-url so another node can restore an id after this one dies")
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

// scanMarked is the leader's background scanner: instances with marked
// durable work whose id is unplaced or whose owner's lease lapsed are woken
// on a live worker, so interrupted work resumes without any client.
func scanMarked(ctx context.Context, states statestore.Store, fd *pinboard.FrontDoor, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		after := statestore.InstanceKey{}
		for ctx.Err() == nil {
			page, err := states.ListMarked(ctx, after, 256)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("scan for marked work", "err", err)
				}
				break
			}
			for _, k := range page {
				woke, err := fd.Wake(ctx, directory.Key{Namespace: k.Namespace, ID: k.ID})
				switch {
				case err != nil && ctx.Err() == nil:
					log.Debug("wake for marked work failed", "instance", k.String(), "err", err)
				case woke:
					log.Info("woke an instance to resume its marked work", "instance", k.String())
				}
			}
			if len(page) < 256 {
				break
			}
			after = page[len(page)-1]
		}
	}
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

// dataDirInUse explains a bbolt lock timeout: another pinnedd holds the data
// dir (the lock is how a restarted node knows its predecessor is gone).
func dataDirInUse(err error, dataDir string) error {
	if errors.Is(err, bbolt.ErrTimeout) {
		return fmt.Errorf("data dir %s is in use by another pinnedd process: %w", dataDir, err)
	}
	return err
}
