package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/pinnedd/pinnedd/passport"
	"github.com/pinnedd/pinnedd/supervisor"
)

// Config is a node's configuration, as `pinnedd agent`'s flags give it
// (they validate it: the agent takes it as it is).
type Config struct {
	// Version is reported by /_pinned/status.
	Version string
	// Dev is a one-node cluster in a temporary data dir (when DataDir is
	// empty), whose token-less loopback calls are trusted, and with no
	// placement quarantine.
	Dev bool
	// NoHosts serves no instances: no state store, plugins or worker.
	NoHosts bool
	// Logger receives every log line of the node.
	Logger *slog.Logger

	// NodeID names this node in the cluster.
	NodeID string
	// HTTPAddr is where the front door listens; AdvertiseURL is where
	// other nodes reach it (default http://<bound HTTPAddr>).
	HTTPAddr     string
	AdvertiseURL string
	// HTTPTLSCert and HTTPTLSKey, if set, make the front door serve HTTPS
	// with this pair (reloaded when the files change, and on SIGHUP).
	HTTPTLSCert string
	HTTPTLSKey  string
	// HTTPTLSCA, if set, verifies HTTPS front doors besides the system
	// roots: this node's own certificate at start, other members' (Join,
	// the registry's probes, calls between nodes without the cluster's
	// TLS), and the plugins' cluster calls.
	HTTPTLSCA string
	// DataDir holds the node's durable state; empty with Dev only.
	DataDir string
	// Tokens are the deployment tokens accepted; the first is the one
	// this node sends.
	Tokens []string
	// Passport, if set, is the deployment's keys and namespace policies
	// (PINBOARD_PASSPORT): requests are authorized against it instead of
	// Tokens, which must then be a worker key of it (the node's own).
	Passport *passport.Passport

	// Raft: the transport's listen and advertised addresses, bootstrap or
	// join, voters, the log format for a new data dir, and timing (zero:
	// hashicorp/raft's).
	RaftAddr          string
	RaftAdvertiseAddr string
	Bootstrap         bool
	Join              string
	MaxVoters         int
	RaftLogStore      string
	RaftTimeout       time.Duration
	// InsecureCluster runs Raft without mutual TLS; TLSCA, TLSCert and
	// TLSKey bring the operator's own PKI (all three or none).
	InsecureCluster bool
	TLSCA           string
	TLSCert         string
	TLSKey          string

	// Specs are the plugins serving this node's namespaces.
	Specs []supervisor.Spec
	// HostnameAware routes requests by their Host: each plugin serves its
	// namespaces under a hostname (Spec.Bind), and its ids live in its
	// env (seed 004). Every node of a fleet runs alike.
	HostnameAware bool
	// PluginDir is where plugins added at run time (pinnedd plugins add)
	// must live; empty: none may be added. NewPlugin builds such a
	// plugin's spec from --plugin's /NS=PATH as the flags built Specs
	// (environment, user, watch), named apart from taken.
	PluginDir string
	NewPlugin func(arg string, taken []string) (supervisor.Spec, error)
	// DatabaseURL is the fleet's shared Postgres for instance state; empty:
	// a bbolt file in DataDir, this node's alone.
	DatabaseURL string
	// ScanInterval is how often the leader looks for marked work to resume.
	ScanInterval time.Duration
	// FenceGCInterval is how often the state store's fences of instances that never wrote are
	// collected (zero: pinboard.DefaultFenceGCInterval).
	FenceGCInterval time.Duration
	// Plugin and instance timing (zero: the supervisor's defaults).
	DetachedTimeout time.Duration
	StopGrace       time.Duration
	StablePeriod    time.Duration
	SwapDeadline    time.Duration
	// DrainDeadline bounds the drain on SIGTERM, and a leave's by default.
	DrainDeadline time.Duration

	// The worker's lease TTL and heartbeat interval.
	LeaseTTL  time.Duration
	Heartbeat time.Duration

	// Front door.
	AccessLog       bool
	FastPath        bool
	MetricsPublic   bool
	MaxConnsPerIP   int
	MaxConns        int
	IdleTimeout     time.Duration
	BodyReadTimeout time.Duration
	MaxBodyBytes    int64 // 0: no cap
	TrustedProxies  []netip.Prefix
	BalanceFactor   float64
}

// nodeTokens are the values of this node's own key: the token it sends
// first, then, with a passport, the other values its key lists (a rotation
// under way). They seal its keys at rest (the first seals, any opens) and
// are the tokens a join proof may be made with and the CA is pinned for.
func (c Config) nodeTokens() []string {
	if len(c.Tokens) == 0 || c.Tokens[0] == "" {
		return nil
	}
	own := c.Tokens[0]
	out := []string{own}
	if c.Passport == nil {
		return append(out, c.Tokens[1:]...)
	}
	if k, ok := c.Passport.Lookup(own); ok {
		for _, t := range k.Tokens() {
			if t != own {
				out = append(out, t)
			}
		}
	}
	return out
}

// absolute makes every path in c absolute, against the working directory
// at start: the agent keeps them (a plugin's socket under DataDir is dialed
// long after, by code that must not depend on the working directory).
func (c *Config) absolute() error {
	paths := []*string{&c.DataDir, &c.TLSCA, &c.TLSCert, &c.TLSKey, &c.HTTPTLSCert, &c.HTTPTLSKey, &c.HTTPTLSCA}
	for i := range c.Specs {
		paths = append(paths, &c.Specs[i].Path)
	}
	for _, p := range paths {
		if *p == "" || filepath.IsAbs(*p) {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("making %q absolute: %w", *p, err)
		}
		*p = abs
	}
	return nil
}
