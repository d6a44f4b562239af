package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/examples"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
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
			&cli.StringFlag{Name: "data-dir", Usage: "where durable node state lives", EnvVars: []string{"PINNEDD_DATA_DIR"}},
			&cli.StringSliceFlag{Name: "plugin", Usage: "serve `/NS=PATH`: namespace NS from the plugin binary at PATH (repeatable)", EnvVars: []string{"PINNEDD_PLUGINS"}},
			&cli.StringFlag{Name: "token", Usage: "deployment token (worker and operator scopes)", EnvVars: []string{"PINBOARD_TOKEN"}},
			&cli.DurationFlag{Name: "lease-ttl", Value: pinboard.DefaultLeaseTTL, Usage: "worker lease TTL (also PINBOARD_LEASE_TTL_MS)", EnvVars: []string{"PINNEDD_LEASE_TTL"}},
			&cli.DurationFlag{Name: "heartbeat-interval", Value: pinboard.DefaultHeartbeatInterval, Usage: "worker heartbeat interval", EnvVars: []string{"PINNEDD_HEARTBEAT_INTERVAL"}},
			&cli.DurationFlag{Name: "detached-timeout", Value: 60 * time.Second, Usage: "evict an instance with no open request for this long (a host may set its own)", EnvVars: []string{"PINNEDD_DETACHED_TIMEOUT"}},
			&cli.DurationFlag{Name: "stop-grace", Value: 10 * time.Second, Usage: "at shutdown, how long instances' tasks get to return", EnvVars: []string{"PINNEDD_STOP_GRACE"}},
			&cli.DurationFlag{Name: "plugin-stable-period", Value: 30 * time.Second, Usage: "a plugin run this long resets its crash count", EnvVars: []string{"PINNEDD_PLUGIN_STABLE_PERIOD"}},
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
	dev             bool
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
	} else {
		return cfg, errors.New("a fleet node (without --dev) needs the Raft directory, which this build does not have yet; run with --dev")
	}
	specs, err := pluginSpecs(c.StringSlice("plugin"), cfg.dev)
	if err != nil {
		return cfg, err
	}
	cfg.specs = specs
	if len(cfg.specs) == 0 {
		return cfg, errors.New("no hosts to serve: give --plugin /ns=path (or --dev for the built-in examples)")
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
// plugins, deregister, close the front door.
func runAgent(ctx context.Context, cfg agentConfig) error {
	log := cfg.logger
	if cfg.dev {
		log.Warn("DEV MODE: in-process directory, token dev-token accepted, no attestation; never run this in production")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	machine := directory.New()
	dir := pinboard.NewDirectory(machine, pinboard.NewLocalApplier(machine))
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	if _, err := dir.Do(ctx, directory.Init{Secret: secret}); err != nil {
		return fmt.Errorf("init directory: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("front door: %w", err)
	}
	defer ln.Close()
	advertise := cfg.advertiseURL
	if advertise == "" {
		advertise = "http://" + ln.Addr().String()
	}

	var fd *pinboard.FrontDoor
	sup, err := supervisor.New(supervisor.Config{
		Specs: cfg.specs, Logger: log, Registerer: reg,
		DetachedTimeout: cfg.detachedTimeout, StopGrace: cfg.stopGrace, StablePeriod: cfg.stablePeriod,
		OnEvicted: func(k supervisor.Key, gen uint64, release bool) { fd.Released(k.Namespace, k.ID, gen, release) },
	})
	if err != nil {
		return err
	}
	if err := sup.Start(ctx); err != nil {
		return fmt.Errorf("start plugins: %w", err)
	}
	defer sup.Stop(context.Background())

	worker := pinboard.NewWorker(pinboard.WorkerConfig{
		NodeID: cfg.nodeID, AdvertiseURL: advertise, Namespaces: sup.Namespaces(),
		TTL: cfg.leaseTTL, Interval: cfg.heartbeat, Logger: log,
	}, pinboard.NewRegistry(dir, cfg.leaseTTL))

	var quarantine time.Duration
	if !cfg.dev {
		quarantine = cfg.leaseTTL
	}
	fd = pinboard.NewFrontDoor(pinboard.FrontDoorConfig{
		Dir: dir, Worker: worker, Local: sup, Tokens: pinboard.NewTokens(cfg.tokens...),
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Logger: log, Registry: reg,
		Quarantine: quarantine, Ready: sup.Ready,
		Status: func() map[string]any {
			return map[string]any{
				"nodeId": cfg.nodeID, "version": version, "advertiseUrl": advertise, "pid": os.Getpid(),
				"plugins": sup.Plugins(), "instances": sup.Instances(),
			}
		},
	})

	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() { defer close(wdone); worker.Run(wctx) }()

	srv := &http.Server{Handler: fd, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("front door listening", "addr", ln.Addr().String(), "advertise_url", advertise, "node_id", cfg.nodeID, "namespaces", sup.Namespaces())

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		runErr = fmt.Errorf("front door: %w", err)
	}

	fd.SetStopping()
	sup.Stop(context.Background()) // evicts, releasing placements, and ends every plugin
	wcancel()
	<-wdone
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := worker.Deregister(dctx); err != nil {
		log.Warn("deregister failed", "err", err)
	}
	dcancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	log.Info("stopped")
	return runErr
}
