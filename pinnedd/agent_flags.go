package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/frontdoor"

	"github.com/urfave/cli/v2"

	"github.com/pinnedd/pinnedd/agent"
	"github.com/pinnedd/pinnedd/examples"
	"github.com/pinnedd/pinnedd/passport"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/supervisor"
)

// devToken is the public token --dev accepts.
const devToken = "dev-token"

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "run a pinnedd node",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dev", Usage: "one-node cluster in a temporary data dir, built-in example hosts, calls from loopback need no token (else dev-token); refused in production", EnvVars: []string{"PINNEDD_DEV"}},
			&cli.StringFlag{Name: "node-id", Usage: "this node's name in the cluster", DefaultText: "the hostname", EnvVars: []string{"PINNEDD_NODE_ID"}},
			&cli.StringFlag{Name: "http-addr", Value: "127.0.0.1:8080", Usage: "front door listen address", EnvVars: []string{"PINNEDD_HTTP_ADDR"}},
			&cli.StringFlag{Name: "advertise-url", Usage: "URL other nodes reach this one at", DefaultText: "http(s)://<http-addr>", EnvVars: envVars("PINNEDD_ADVERTISE_URL")},
			&cli.StringFlag{Name: "http-tls-cert", Usage: "serve the front door over HTTPS with this certificate (PEM, with --http-tls-key); reloaded when the file changes and on SIGHUP", EnvVars: []string{"PINNEDD_HTTP_TLS_CERT"}},
			&cli.StringFlag{Name: "http-tls-key", Usage: "the private key (PEM) of --http-tls-cert", EnvVars: []string{"PINNEDD_HTTP_TLS_KEY"}},
			&cli.StringFlag{Name: "http-tls-ca", Usage: "a CA certificate (PEM) that verifies HTTPS front doors besides the system roots: this node's own --http-tls-cert at start, other members' (--join, `pinnedd join`, the registry's probes, node-to-node calls with --insecure-cluster), and the plugins' cluster calls", EnvVars: []string{"PINNEDD_HTTP_TLS_CA"}},
			&cli.StringFlag{Name: "data-dir", Usage: "where durable node state lives (Raft log, snapshots); --dev without it uses a temporary one", EnvVars: []string{"PINNEDD_DATA_DIR"}},
			&cli.StringFlag{Name: "raft-addr", Value: "127.0.0.1:8300", Usage: "Raft transport listen address", DefaultText: "127.0.0.1:8300; with --dev a free loopback port", EnvVars: []string{"PINNEDD_RAFT_ADDR"}},
			&cli.StringFlag{Name: "raft-advertise-addr", Usage: "Raft address other nodes dial", DefaultText: "the bound --raft-addr", EnvVars: []string{"PINNEDD_RAFT_ADVERTISE_ADDR"}},
			&cli.BoolFlag{Name: "bootstrap", Usage: "start a new cluster with this node as its only voter (a no-op once the data dir holds Raft state)", EnvVars: []string{"PINNEDD_BOOTSTRAP"}},
			&cli.StringFlag{Name: "join", Usage: "join the cluster through the member at `URL` (any member; repeated harmlessly on restart)", EnvVars: []string{"PINNEDD_JOIN"}},
			&cli.StringFlag{Name: "raft-log-store", Usage: "Raft log format for a new data dir: wal (one fsync per batch) or bolt; an existing data dir keeps its own", EnvVars: []string{"PINNEDD_RAFT_LOG_STORE"}},
			&cli.BoolFlag{Name: "insecure-cluster", Usage: "run Raft and every node-to-node call WITHOUT mutual TLS: anyone who reaches --raft-addr or the front door's node-to-node routes can take the cluster over", DefaultText: "false: mutual TLS under the cluster's CA", EnvVars: []string{"PINNEDD_INSECURE_CLUSTER"}},
			&cli.StringFlag{Name: "tls-ca", Usage: "your own cluster CA certificate (PEM) for Raft's mutual TLS, with --tls-cert and --tls-key", DefaultText: "the CA the bootstrap node creates", EnvVars: []string{"PINNEDD_TLS_CA"}},
			&cli.StringFlag{Name: "tls-cert", Usage: "this node's certificate (PEM, CommonName = --node-id) from --tls-ca", EnvVars: []string{"PINNEDD_TLS_CERT"}},
			&cli.StringFlag{Name: "tls-key", Usage: "this node's private key (PEM) for --tls-cert", EnvVars: []string{"PINNEDD_TLS_KEY"}},
			&cli.IntFlag{Name: "max-voters", Value: 3, Usage: "Raft voters (3 or 5); members joining beyond it are nonvoters", EnvVars: []string{"PINNEDD_MAX_VOTERS"}},
			&cli.DurationFlag{Name: "raft-timeout", Usage: "Raft heartbeat and election timeout", DefaultText: "hashicorp/raft's 1s; 300ms with --dev", EnvVars: []string{"PINNEDD_RAFT_TIMEOUT"}, Hidden: true},
			&cli.StringSliceFlag{Name: "plugin", Usage: "serve `/NS=PATH`: namespace NS from the plugin binary at PATH (repeatable); with --hostname-aware HOST/NS=PATH[,env=ENV][,takeover=wind_down|deny][,epoch=N] serves it to requests for HOST, its ids in ENV (HOST if not given)", EnvVars: []string{"PINNEDD_PLUGINS"}},
			&cli.BoolFlag{Name: "hostname-aware", Usage: "route each request by its Host: every plugin serves its namespaces under a hostname, its ids in an env (preview builds side by side); every node of a fleet alike", EnvVars: []string{"PINNEDD_HOSTNAME_AWARE"}},
			&cli.StringSliceFlag{Name: "plugin-env", Usage: "pass `[/NS=]KEY` (pinnedd's own value) or set `[/NS=]KEY=VALUE` in plugins' environments, every plugin's or the one serving NS (repeatable); plugins get nothing else of pinnedd's environment but PATH, HOME, LANG, LC_*, TZ, TMPDIR", EnvVars: []string{"PINNEDD_PLUGIN_ENV"}},
			&cli.StringSliceFlag{Name: "plugin-user", Usage: "run plugins as user `[/NS=]NAME`: every plugin, or the one serving NS (repeatable); its uid, groups and HOME, its sockets in a directory of its own; pinnedd must run as root, NAME must not be root", DefaultText: "as root, pinnedd-plugin if the machine has it, else nobody; otherwise pinnedd's own user", EnvVars: []string{"PINNEDD_PLUGIN_USER"}},
			&cli.StringFlag{Name: "plugin-dir", Usage: "let operators add plugins at run time (pinnedd plugins add) from binaries under this `DIR`, which it and they must be owned by root or pinnedd's user and writable by no one else; unset: none may be added", EnvVars: []string{"PINNEDD_PLUGIN_DIR"}},
			&cli.BoolFlag{Name: "watch-plugins", Usage: "hot-swap a plugin when its binary is replaced", DefaultText: "on with --dev, off otherwise", EnvVars: []string{"PINNEDD_WATCH_PLUGINS"}},
			&cli.StringFlag{Name: "database-url", Usage: "Postgres for instance state, shared by the fleet, so any node can restore any id; prefer DATABASE_URL (e.g. from a 0600 environment file): on the command line its password is visible to every local user (ps)", EnvVars: []string{"DATABASE_URL"}},
			&cli.BoolFlag{Name: "local-state", Usage: "keep instance state in --data-dir instead of a shared --database-url: an id stays on its node while that node lives, but one that moves (a drain, a restart, the node's death) starts EMPTY on its new node", EnvVars: []string{"PINNEDD_LOCAL_STATE"}},
			&cli.DurationFlag{Name: "fence-gc-interval", Value: pinboard.DefaultFenceGCInterval, Usage: "how often the state store's fence rows of ids that never wrote are collected", EnvVars: []string{"PINNEDD_FENCE_GC_INTERVAL"}},
			&cli.DurationFlag{Name: "scan-interval", Value: pinboard.DefaultScanInterval, Usage: "how often the leader looks for marked durable work to resume", EnvVars: []string{"PINNEDD_SCAN_INTERVAL"}},
			&cli.BoolFlag{Name: "no-hosts", Usage: "serve no instances: a pure front door and Raft member (what a pinboard-only node is)", EnvVars: []string{"PINNEDD_NO_HOSTS"}},
			&cli.StringFlag{Name: "token", Usage: "deployment token (worker and operator scopes); prefer PINBOARD_TOKEN or --token-file: on the command line it is visible to every local user (ps)", EnvVars: []string{"PINBOARD_TOKEN"}},
			tokenFileFlag(),
			&cli.StringFlag{Name: "passport", Usage: "read the passport (keys with scopes and claims, namespace policies) from this `FILE`; PINBOARD_PASSPORT holds one inline (JSON); without either, PINBOARD_TOKEN is the one key, with every scope, and every namespace is anonymous", EnvVars: []string{"PINNEDD_PASSPORT_FILE"}},
			&cli.StringFlag{Name: "passport-json", Hidden: true, Usage: "the passport inline (JSON)", EnvVars: []string{"PINBOARD_PASSPORT"}},
			&cli.GenericFlag{Name: "lease-ttl", Value: &msDuration{pinboard.DefaultLeaseTTL}, Usage: "worker lease TTL: a duration (15s) or milliseconds (15000)", EnvVars: envVars("PINBOARD_LEASE_TTL_MS")},
			&cli.DurationFlag{Name: "heartbeat-interval", Value: pinboard.DefaultHeartbeatInterval, Usage: "worker heartbeat interval", EnvVars: []string{"PINNEDD_HEARTBEAT_INTERVAL"}},
			&cli.DurationFlag{Name: "detached-timeout", Value: 60 * time.Second, Usage: "evict an instance with no open request for this long (a host may set its own)", EnvVars: []string{"PINNEDD_DETACHED_TIMEOUT"}},
			&cli.DurationFlag{Name: "drain-deadline", Value: 30 * time.Second, Usage: "on SIGTERM, drain: instances with work get this long before they are evicted", EnvVars: []string{"PINNEDD_DRAIN_DEADLINE"}},
			&cli.DurationFlag{Name: "swap-deadline", Value: 10 * time.Second, Usage: "on a plugin hot swap, the old process's instances get this long to wind down", EnvVars: []string{"PINNEDD_SWAP_DEADLINE"}},
			&cli.DurationFlag{Name: "stop-grace", Value: 10 * time.Second, Usage: "at shutdown, how long instances' tasks get to return", EnvVars: []string{"PINNEDD_STOP_GRACE"}},
			&cli.DurationFlag{Name: "plugin-stable-period", Value: 30 * time.Second, Usage: "a plugin run this long resets its crash count", EnvVars: []string{"PINNEDD_PLUGIN_STABLE_PERIOD"}},
			&cli.Float64Flag{Name: "affinity-balance-factor", Value: pinboard.DefaultBalanceFactor, Usage: "keep a client's preferred worker while its headroom is at least the best / this", EnvVars: []string{"PINBOARD_AFFINITY_BALANCE_FACTOR"}},
			&cli.StringFlag{Name: "trusted-proxies", Usage: "comma-separated IPs/CIDRs whose X-Forwarded-For/Forwarded name the client", EnvVars: []string{"PINBOARD_TRUSTED_PROXIES"}},
			&cli.BoolFlag{Name: "access-log", Usage: "log one line per front-door request (method, path, status, bytes, duration, where it was served); turns the fast path off", EnvVars: []string{"PINNEDD_ACCESS_LOG"}},
			&cli.BoolFlag{Name: "fast-path", Value: true, Usage: "serve a kept-alive connection's plain requests from an event loop instead of net/http (Linux); --fast-path=false keeps every request in net/http: the same answers, more CPU per request", EnvVars: []string{"PINNEDD_FAST_PATH"}},
			&cli.IntFlag{Name: "max-conns-per-ip", Value: frontdoor.DefaultMaxConnsPerIP, Usage: "client connections one IP may hold open on the front door (the TCP peer's; the fleet's nodes and --trusted-proxies are exempt); one more is answered 503 and closed; 0: no cap", EnvVars: []string{"PINNEDD_MAX_CONNS_PER_IP"}},
			&cli.IntFlag{Name: "max-conns", Value: frontdoor.DefaultMaxConns, Usage: "client connections the front door holds open in all; one more is answered 503 and closed; 0: no cap", EnvVars: []string{"PINNEDD_MAX_CONNS"}},
			&cli.DurationFlag{Name: "http-idle-timeout", Value: frontdoor.DefaultIdleTimeout, Usage: "close a kept-alive client connection idle this long between requests, and an upgraded one (WebSocket) quiet both ways this long", EnvVars: []string{"PINNEDD_HTTP_IDLE_TIMEOUT"}},
			&cli.DurationFlag{Name: "http-body-timeout", Value: frontdoor.DefaultBodyReadTimeout, Usage: "close a client connection whose request body sends nothing for this long (held response streams are not affected)", EnvVars: []string{"PINNEDD_HTTP_BODY_TIMEOUT"}},
			&cli.StringFlag{Name: "max-body-size", Value: fmt.Sprintf("%dMiB", frontdoor.DefaultMaxBodyBytes>>20), Usage: "answer 413 to a request body over this `SIZE` (bytes, or with KiB, MiB, GiB); one without a length is cut there; 0: no cap", EnvVars: []string{"PINNEDD_MAX_BODY_SIZE"}},
			&cli.BoolFlag{Name: "metrics-public", Usage: "serve GET /metrics without a token, for a scraper on a trusted network (otherwise it needs the operator token); anyone who reaches the port then reads namespaces, load and node state", EnvVars: []string{"PINNEDD_METRICS_PUBLIC"}},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: envVars("PINNEDD_LOG_LEVEL")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: []string{"PINNEDD_LOG_FORMAT"}},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("pinnedd agent takes no arguments, got %q (flags start with --)", c.Args().First())
			}
			cfg, err := agentConfigFrom(c)
			if err != nil {
				return &configError{err}
			}
			ctx, cancel := signalContext()
			defer cancel()
			err = agent.Run(ctx, cfg)
			if errors.Is(err, supervisor.ErrPluginBinary) {
				// A binary its user cannot run fails every start alike:
				// a configuration to fix, not a crash to restart.
				return &configError{err}
			}
			return err
		},
	}
}

// leaseTiming checks a worker lease against the Raft election timeout
// (--raft-timeout; 0: raft's default): while a leader is being elected no
// heartbeat commits. A lease no longer than the longest election is
// refused: a leader's death would expire every worker's lease, so every
// node refuses every request by itself. One whose healthy stretch (the TTL
// less the unhealthy buffer and one heartbeat interval, the age of the
// last ack at worst) is shorter than an election gets a warning: workers
// go unhealthy (not ready, refusing new instances) during one.
func leaseTiming(ttl, heartbeat, raftTimeout time.Duration) (warn string, err error) {
	gap := raftstore.ElectionBound(raftTimeout, raftTimeout)
	switch {
	case ttl <= gap:
		return "", fmt.Errorf("--lease-ttl (%s) must be longer than a Raft election, up to %s with --raft-timeout %s: a leader's death would expire every worker's lease (raise --lease-ttl, or lower --raft-timeout on a fast network)",
			ttl, gap, cmp.Or(raftTimeout, gap/4))
	case ttl-pinboard.LeaseBuffer(ttl)-heartbeat < gap:
		return "--lease-ttl leaves workers healthy for less than a Raft election after their last ack: they go unhealthy (not ready, refusing new instances) while a new leader is elected", nil
	}
	return "", nil
}

// exitConfig is the agent's exit status for a configuration it refuses
// (sysexits.h's EX_CONFIG): the systemd unit does not restart on it
// (RestartPreventExitStatus), since the same configuration fails the same way.
const exitConfig = 78

// configError is a configuration agentConfigFrom refused.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }
func (e *configError) ExitCode() int { return exitConfig }

// agentConfigFrom reads and checks the agent's flags.
func agentConfigFrom(c *cli.Context) (agent.Config, error) {
	logger, err := newLogger(c.String("log-level"), c.String("log-format"))
	if err != nil {
		return agent.Config{}, err
	}
	warnDeprecatedEnv(logger, os.LookupEnv)
	cfg := agent.Config{
		Version:           version,
		Dev:               c.Bool("dev"),
		HostnameAware:     c.Bool("hostname-aware"),
		AccessLog:         c.Bool("access-log"),
		FastPath:          c.Bool("fast-path"),
		MetricsPublic:     c.Bool("metrics-public"),
		MaxConnsPerIP:     c.Int("max-conns-per-ip"),
		MaxConns:          c.Int("max-conns"),
		IdleTimeout:       c.Duration("http-idle-timeout"),
		BodyReadTimeout:   c.Duration("http-body-timeout"),
		NoHosts:           c.Bool("no-hosts"),
		RaftAddr:          c.String("raft-addr"),
		RaftAdvertiseAddr: c.String("raft-advertise-addr"),
		Bootstrap:         c.Bool("bootstrap"),
		Join:              c.String("join"),
		MaxVoters:         c.Int("max-voters"),
		RaftLogStore:      c.String("raft-log-store"),
		RaftTimeout:       c.Duration("raft-timeout"),
		InsecureCluster:   c.Bool("insecure-cluster"),
		TLSCA:             c.String("tls-ca"),
		TLSCert:           c.String("tls-cert"),
		TLSKey:            c.String("tls-key"),
		NodeID:            c.String("node-id"),
		HTTPAddr:          c.String("http-addr"),
		AdvertiseURL:      c.String("advertise-url"),
		HTTPTLSCert:       c.String("http-tls-cert"),
		HTTPTLSKey:        c.String("http-tls-key"),
		HTTPTLSCA:         c.String("http-tls-ca"),
		DataDir:           c.String("data-dir"),
		LeaseTTL:          c.Generic("lease-ttl").(*msDuration).d,
		Heartbeat:         c.Duration("heartbeat-interval"),
		DetachedTimeout:   c.Duration("detached-timeout"),
		StopGrace:         c.Duration("stop-grace"),
		StablePeriod:      c.Duration("plugin-stable-period"),
		Logger:            logger,
	}
	localState := c.Bool("local-state")
	cfg.BalanceFactor = c.Float64("affinity-balance-factor")
	cfg.DatabaseURL = c.String("database-url")
	cfg.DrainDeadline = c.Duration("drain-deadline")
	cfg.SwapDeadline = c.Duration("swap-deadline")
	cfg.ScanInterval = c.Duration("scan-interval")
	cfg.FenceGCInterval = c.Duration("fence-gc-interval")
	if cfg.TrustedProxies, err = pinboard.ParseTrustedProxies(c.String("trusted-proxies")); err != nil {
		return cfg, fmt.Errorf("--trusted-proxies: %w", err)
	}
	if cfg.MaxConnsPerIP < 0 || cfg.MaxConns < 0 {
		return cfg, fmt.Errorf("--max-conns-per-ip (%d) and --max-conns (%d) must be 0 (no cap) or more", cfg.MaxConnsPerIP, cfg.MaxConns)
	}
	if cfg.MaxBodyBytes, err = parseSize(c.String("max-body-size")); err != nil {
		return cfg, fmt.Errorf("--max-body-size: %w", err)
	}
	if cfg.IdleTimeout < 0 || cfg.BodyReadTimeout < 0 {
		return cfg, errors.New("--http-idle-timeout and --http-body-timeout must not be negative (0: no bound)")
	}
	if err := checkTimings(cfg, logger); err != nil {
		return cfg, err
	}
	if cfg.NodeID == "" {
		cfg.NodeID, _ = os.Hostname()
	}
	if err := tokensAndMode(c, &cfg); err != nil {
		return cfg, err
	}
	if cfg.Bootstrap && cfg.Join != "" {
		return cfg, errors.New("--bootstrap and --join exclude each other: bootstrap one node, join the rest")
	}
	if err := checkClusterTLS(cfg); err != nil {
		return cfg, err
	}
	if cfg.MaxVoters != 3 && cfg.MaxVoters != 5 && cfg.MaxVoters != 1 {
		return cfg, fmt.Errorf("--max-voters %d: use 3 or 5 (1 for a single node)", cfg.MaxVoters)
	}
	if cfg.NoHosts {
		if len(c.StringSlice("plugin")) > 0 || len(c.StringSlice("plugin-user")) > 0 || cfg.Dev {
			return cfg, errors.New("--no-hosts serves no instances: it excludes --plugin, --plugin-user and --dev")
		}
		cfg.Passport, err = passportFrom(c, cfg.Tokens, nil)
		return cfg, err
	}
	switch {
	case cfg.DatabaseURL != "" && localState:
		return cfg, errors.New("--local-state and --database-url exclude each other: state is either on this node or shared")
	case cfg.DatabaseURL == "" && !localState && !cfg.Dev:
		return cfg, errors.New("a fleet node needs a shared state store: give --database-url (Postgres, so any node can restore any id), " +
			"or --local-state to keep state on this node and accept that an id which moves (a drain, a restart, the node's death) starts empty elsewhere")
	}
	specs, err := hostSpecs(c, cfg.Dev)
	if err != nil {
		return cfg, err
	}
	cfg.Specs = specs
	cfg.NewPlugin = newPlugin(c, cfg.Dev)
	if dir := c.String("plugin-dir"); dir != "" {
		// The CLI sends absolute paths: a relative --plugin-dir would
		// never contain one.
		if cfg.PluginDir, err = filepath.Abs(dir); err != nil {
			return cfg, fmt.Errorf("--plugin-dir %q: %w", dir, err)
		}
	}
	if len(cfg.Specs) == 0 {
		return cfg, errors.New("no hosts to serve: give --plugin /ns=path (or --dev for the built-in examples, or --no-hosts for a pure front door)")
	}
	if cfg.Passport, err = passportFrom(c, cfg.Tokens, specs); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// checkTimings refuses intervals that cannot work (a heartbeat no shorter
// than the lease, a lease an election outlasts) and warns of tight ones.
func checkTimings(cfg agent.Config, logger *slog.Logger) error {
	if cfg.ScanInterval <= 0 {
		return fmt.Errorf("--scan-interval (%s) must be positive", cfg.ScanInterval)
	}
	if cfg.FenceGCInterval <= 0 {
		return fmt.Errorf("--fence-gc-interval (%s) must be positive", cfg.FenceGCInterval)
	}
	if cfg.Heartbeat >= cfg.LeaseTTL {
		return fmt.Errorf("--heartbeat-interval (%s) must be shorter than --lease-ttl (%s)", cfg.Heartbeat, cfg.LeaseTTL)
	}
	if cfg.Dev { // one voter: no election after its first
		return nil
	}
	warn, err := leaseTiming(cfg.LeaseTTL, cfg.Heartbeat, cfg.RaftTimeout)
	if err != nil {
		return err
	}
	if warn != "" {
		logger.Warn(warn, "lease_ttl", cfg.LeaseTTL, "heartbeat_interval", cfg.Heartbeat, "election_bound", raftstore.ElectionBound(cfg.RaftTimeout, cfg.RaftTimeout))
	}
	return nil
}

// tokensAndMode adds the node's token to cfg and settles what --dev
// changes (the dev token, bootstrap, a free Raft port, fast elections),
// or, for a fleet node, checks that it has a strong token and a data dir.
func tokensAndMode(c *cli.Context, cfg *agent.Config) error {
	if t, err := tokenFrom(c); err != nil {
		return err
	} else if t != "" {
		cfg.Tokens = append(cfg.Tokens, t)
	}
	if !cfg.Dev {
		if len(cfg.Tokens) == 0 {
			return errors.New("a fleet node needs a deployment token: set PINBOARD_TOKEN (or --token-file); make one with `pinnedd token generate`")
		}
		if err := validateToken(cfg.Tokens[0]); err != nil {
			return fmt.Errorf("PINBOARD_TOKEN (or --token-file, --token) refused: %w", err)
		}
		if cfg.DataDir == "" {
			return errors.New("a fleet node needs --data-dir (its Raft log lives there)")
		}
		return nil
	}
	if err := devAllowed(os.Getenv); err != nil {
		return err
	}
	cfg.Tokens = append(cfg.Tokens, devToken)
	cfg.Bootstrap = true
	if !c.IsSet("raft-addr") {
		cfg.RaftAddr = "127.0.0.1:0"
	}
	if cfg.Join != "" {
		return errors.New("--dev is a one-node cluster: it cannot --join")
	}
	if !c.IsSet("raft-timeout") {
		// One voter elects itself; no need to wait out a LAN timeout.
		cfg.RaftTimeout = 300 * time.Millisecond
	}
	return nil
}

// hostSpecs are the plugins to run (--plugin, or --dev's built-in hosts),
// with their watch setting, environment (--plugin-env) and users
// (--plugin-user).
func hostSpecs(c *cli.Context, dev bool) ([]supervisor.Spec, error) {
	specs, err := pluginSpecs(c.StringSlice("plugin"), dev, c.Bool("hostname-aware"))
	if err != nil {
		return nil, err
	}
	return specs, configureSpecs(c, dev, specs, "")
}

// newPlugin builds the spec of a plugin added at run time (pinnedd
// plugins add) as hostSpecs builds --plugin's: the same syntax, and the
// settings of the flags that apply to every plugin or to its namespace;
// its name is apart from taken.
func newPlugin(c *cli.Context, dev bool) func(arg string, taken []string) (supervisor.Spec, error) {
	return func(arg string, taken []string) (supervisor.Spec, error) {
		specs, err := pluginSpecs([]string{arg}, false, c.Bool("hostname-aware"))
		if err != nil {
			return supervisor.Spec{}, err
		}
		sp := &specs[0]
		base := sp.Name
		for i := 2; slices.Contains(taken, sp.Name); i++ {
			sp.Name = fmt.Sprintf("%s-%d", base, i)
		}
		return *sp, configureSpecs(c, dev, specs, sp.Namespaces[0])
	}
}

// configureSpecs gives specs their watch setting, environment
// (--plugin-env) and users (--plugin-user). With only set (a plugin added
// at run time), settings that name another namespace are left out.
func configureSpecs(c *cli.Context, dev bool, specs []supervisor.Spec, only string) error {
	watch := dev
	if c.IsSet("watch-plugins") {
		watch = c.Bool("watch-plugins")
	}
	for i := range specs {
		// Under --dev the built-in hosts are pinnedd's own binary:
		// rebuilding pinnedd hot-swaps them too.
		specs[i].Watch = watch
	}
	applies := func(ns string) bool { return only == "" || ns == "" || ns == only }
	var envSets []supervisor.PluginEnvSetting
	for _, f := range c.StringSlice("plugin-env") {
		set, err := supervisor.ParsePluginEnv(f)
		if err != nil {
			return fmt.Errorf("--plugin-env: %w", err)
		}
		if applies(set.Namespace) {
			envSets = append(envSets, set)
		}
	}
	if err := supervisor.ApplyPluginEnv(specs, envSets, os.LookupEnv); err != nil {
		return err
	}
	var userFlags []string
	for _, f := range c.StringSlice("plugin-user") {
		if set, err := supervisor.ParsePluginUser(f); err != nil || applies(set.Namespace) {
			userFlags = append(userFlags, f) // a bad one is pluginUsers' to refuse
		}
	}
	return pluginUsers(specs, userFlags, os.Geteuid())
}

// passportFrom reads the passport (--passport FILE, or PINBOARD_PASSPORT
// inline), nil for none. The node's own token must be a worker key of it
// whose claims admit every namespace the node's --plugin flags name.
func passportFrom(c *cli.Context, tokens []string, specs []supervisor.Spec) (*passport.Passport, error) {
	inline, file := c.String("passport-json"), c.String("passport")
	var doc []byte
	switch {
	case inline != "" && file != "":
		return nil, usagef("--passport and PINBOARD_PASSPORT both give the passport: use one")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--passport: %w", err)
		}
		doc = b
	case inline != "":
		doc = []byte(inline)
	default:
		return nil, nil
	}
	p, err := passport.Parse(doc, os.LookupEnv, validateToken)
	if err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return p, nil
	}
	k, ok := p.Lookup(tokens[0])
	if !ok || !k.Has(passport.Worker) {
		return nil, fmt.Errorf("%w: PINBOARD_TOKEN (the node's own key) is not a key of it with scope %s", passport.ErrInvalid, passport.Worker)
	}
	for _, sp := range specs {
		for _, ns := range sp.Namespaces {
			if !k.Claims.Namespace(ns) {
				return nil, fmt.Errorf("--plugin %s=%s: this node's key %q does not admit namespace %s (its claims.pinboard.namespaces)", ns, sp.Path, k.Name, ns)
			}
		}
	}
	return p, nil
}

// checkClusterTLS: --tls-ca, --tls-cert and --tls-key go together, and not with
// --insecure-cluster; --http-tls-cert and --http-tls-key go together.
func checkClusterTLS(cfg agent.Config) error {
	own := cfg.TLSCA != "" || cfg.TLSCert != "" || cfg.TLSKey != ""
	switch {
	case (cfg.HTTPTLSCert == "") != (cfg.HTTPTLSKey == ""):
		return errors.New("the front door's HTTPS needs --http-tls-cert and --http-tls-key together (make a pair with `pinnedd tls cert create --node <name> --host <address>`)")
	case own && cfg.InsecureCluster:
		return errors.New("--insecure-cluster turns Raft's TLS off: it excludes --tls-ca, --tls-cert and --tls-key")
	case own && (cfg.TLSCA == "" || cfg.TLSCert == "" || cfg.TLSKey == ""):
		return errors.New("your own PKI needs --tls-ca, --tls-cert and --tls-key together (make them with `pinnedd tls ca create` and `pinnedd tls cert create`)")
	}
	return nil
}

// devAllowed refuses --dev in production (NODE_ENV, ENVIRONMENT or APP_ENV
// says production), unless PINBOARD_ALLOW_DEV_IN_PRODUCTION=1.
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
func pluginSpecs(flags []string, builtin, hostnames bool) ([]supervisor.Spec, error) {
	type group struct {
		path string
		bind supervisor.Binding
	}
	byGroup := map[group]*supervisor.Spec{}
	var order []group
	claimed := map[supervisor.Route]string{}
	for _, f := range joinPluginOptions(flags) {
		route, path, bind, err := parsePluginFlag(f, hostnames)
		if err != nil {
			return nil, err
		}
		if prev, dup := claimed[route]; dup {
			return nil, fmt.Errorf("--plugin: %s given twice (%s and %s)", route, prev, path)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("--plugin %q: %w", f, err)
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("--plugin %q: %s is not an executable file", f, abs)
		}
		claimed[route] = abs
		g := group{abs, bind}
		sp := byGroup[g]
		if sp == nil {
			sp = &supervisor.Spec{Path: abs, Bind: bind}
			byGroup[g] = sp
			order = append(order, g)
		}
		sp.Namespaces = append(sp.Namespaces, route.Namespace)
	}
	var specs []supervisor.Spec
	names := map[string]int{}
	for _, g := range order {
		sp := *byGroup[g]
		sp.Name = uniqueName(names, filepath.Base(g.path))
		specs = append(specs, sp)
	}
	if builtin {
		// In hostname-aware mode --dev serves them as localhost, in env
		// localhost: what a browser or curl on the machine sends.
		var bind supervisor.Binding
		if hostnames {
			bind = supervisor.Binding{Hostname: devHostname, Env: devHostname}
		}
		var nss []string
		for ns := range examples.Builtin() {
			if _, overridden := claimed[supervisor.Route{Hostname: bind.Hostname, Namespace: ns}]; !overridden {
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
				Args: append([]string{"plugin-host"}, nss...), Namespaces: nss, Bind: bind,
			})
		}
	}
	return specs, nil
}

// joinPluginOptions undoes the CLI's split of a slice flag's value at its
// commas (also PINNEDD_PLUGINS's): a --plugin's ",env=...", ",takeover=..."
// and ",epoch=..." go back onto the plugin they follow.
func joinPluginOptions(flags []string) []string {
	var out []string
	for _, f := range flags {
		k, _, _ := strings.Cut(f, "=")
		if len(out) > 0 && (k == "env" || k == "takeover" || k == "epoch") {
			out[len(out)-1] += "," + f
			continue
		}
		out = append(out, f)
	}
	return out
}

// devHostname is the hostname --dev --hostname-aware serves its built-in
// hosts under.
const devHostname = "localhost"

// parsePluginFlag reads one --plugin: /NS=PATH, or in hostname-aware mode
// HOST/NS=PATH[,env=ENV][,takeover=wind_down|deny][,epoch=N] (env
// defaults to the hostname, takeover to wind_down, epoch to 0).
func parsePluginFlag(f string, hostnames bool) (supervisor.Route, string, supervisor.Binding, error) {
	lhs, rhs, ok := strings.Cut(f, "=")
	path, opts, _ := strings.Cut(rhs, ",")
	want := "/namespace=/path/to/binary"
	if hostnames {
		want = "hostname/namespace=/path/to/binary[,env=ENV][,takeover=wind_down|deny][,epoch=N]"
	}
	if !ok || path == "" {
		return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: want %s", f, want)
	}
	route, err := supervisor.ParseRoute(lhs)
	if err != nil {
		return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: %w", f, err)
	}
	switch {
	case hostnames && route.Hostname == "":
		return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: hostname-aware mode serves a namespace under a hostname: want %s", f, want)
	case !hostnames && (route.Hostname != "" || opts != ""):
		return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: a hostname, env, takeover or epoch needs --hostname-aware", f)
	case !hostnames:
		return route, path, supervisor.Binding{}, nil
	}
	bind := supervisor.Binding{Hostname: route.Hostname, Env: route.Hostname}
	for _, o := range strings.Split(opts, ",") {
		if o == "" {
			continue
		}
		k, v, _ := strings.Cut(o, "=")
		switch k {
		case "env":
			bind.Env = v
		case "takeover":
			if v != "wind_down" && v != "deny" {
				return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: takeover %q: want wind_down or deny", f, v)
			}
			bind.Takeover = v
		case "epoch":
			if bind.Epoch, err = strconv.ParseUint(v, 10, 64); err != nil {
				return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: epoch %q: want a whole number", f, v)
			}
		default:
			return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: unknown option %q: want env=, takeover= or epoch=", f, k)
		}
	}
	if !plugins.ValidEnv(bind.Env) {
		return supervisor.Route{}, "", supervisor.Binding{}, fmt.Errorf("--plugin %q: env %q: 1-128 characters from a-z A-Z 0-9 . - _ (name one with env= when the hostname is not)", f, bind.Env)
	}
	return route, path, bind, nil
}

// pluginUsers applies --plugin-user settings to the specs and, when
// pinnedd runs as root (euid), its default user to the plugins they leave
// out (supervisor.WithDefaultPluginUser): refused unless pinnedd runs as
// root, for root itself and for unknown users.
func pluginUsers(specs []supervisor.Spec, flags []string, euid int) error {
	if len(flags) > 0 {
		if err := supervisor.CheckCanSwitchUser(); err != nil {
			return fmt.Errorf("--plugin-user %w", err)
		}
	}
	var sets []supervisor.PluginUserSetting
	for _, f := range flags {
		set, err := supervisor.ParsePluginUser(f)
		if err != nil {
			return fmt.Errorf("--plugin-user: %w", err)
		}
		sets = append(sets, set)
	}
	sets, err := supervisor.WithDefaultPluginUser(sets, euid)
	if err != nil {
		return err
	}
	if len(sets) == 0 {
		return nil
	}
	if len(flags) == 0 {
		// Root, without the capabilities to switch (a unit's
		// CapabilityBoundingSet=, a container's --cap-drop).
		if err := supervisor.CheckCanSwitchUser(); err != nil {
			return fmt.Errorf("pinnedd runs as root, so its plugins run as %s (no --plugin-user): that %w; or run pinnedd as another user (its plugins then share that user)", sets[len(sets)-1].User.Name, err)
		}
	}
	if err := supervisor.ApplyPluginUsers(specs, sets); err != nil {
		return fmt.Errorf("--plugin-user: %w", err)
	}
	return nil
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

// sizeUnits are parseSize's suffixes.
var sizeUnits = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseSize reads a byte count: digits, optionally followed by B, KiB,
// MiB or GiB (powers of 1024; the case of the suffix does not matter).
func parseSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if len(num) > len(u.suffix) && strings.EqualFold(num[len(num)-len(u.suffix):], u.suffix) {
			num, mult = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size: give bytes, or a whole number of KiB, MiB or GiB (0: no cap)", s)
	}
	return n * mult, nil
}
