package raftstore

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/hashicorp/raft"
	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures one node of the group. Zero values take the defaults documented per field
// (see DESIGN.md for why they are what they are).
type Config struct {
	// NodeID is this node's stable Raft server id. Required; it must not change across
	// restarts of the same data directory.
	NodeID string
	// RaftAddr is the bind address of the plain Raft TCP transport ("127.0.0.1:0" picks a free
	// port). Required unless Cluster or StreamLayer is set.
	RaftAddr string
	// AdvertiseRaftAddr is the address other nodes dial; default the bound address. Required
	// when RaftAddr binds a wildcard address such as ":8300". Ignored with a Cluster or StreamLayer (its
	// Addr is advertised).
	AdvertiseRaftAddr string
	// APIAddr is this node's HTTP base URL (e.g. "http://10.0.0.5:8080"). It is replicated as
	// member metadata so followers can forward to the leader. Required.
	APIAddr string
	// DataDir holds raft/ (the log and stable store, snapshots and a LOCK file held while
	// open). Required.
	DataDir string
	// LogStore is the log store's format: LogStoreWAL or LogStoreBolt. Empty means the format
	// the data dir already holds, else LogStoreWAL.
	LogStore string
	// WALSegmentSize is the size of one WAL segment file (preallocated); default an eighth of
	// the free space in whole MiB, between 1 and 64 MiB (see "Disk space" in DESIGN.md). The
	// log is compacted a whole segment at a time, so a smaller size keeps less behind a
	// snapshot.
	WALSegmentSize int
	// Bootstrap bootstraps a new single-voter cluster if, and only if, DataDir holds no Raft
	// state. With existing state it is a no-op, so the same command line can be restarted.
	Bootstrap bool
	// MaxVoters caps the number of voters; joins beyond it become nonvoters. Default 3.
	MaxVoters int
	// Logger receives raftstore's logs; raft's own INFO lines are logged at DEBUG. Default
	// slog.Default().
	Logger *slog.Logger
	// Registerer receives raftstore's metrics (pinned_raft_entries_skipped_total, and the
	// gauges of raftCollector: pinned_raft_leader, _term, _commit_index, ...). Optional.
	Registerer prometheus.Registerer
	// Cluster is the cluster port Raft runs on, over mutual TLS (see "Mutual TLS" in DESIGN.md):
	// Open opens it as its stream layer once it knows whether DataDir holds Raft state, applies
	// the CA entries of the log to its ledger and attaches the log to it, and forwards to the
	// leader over it. nil: plain TCP on RaftAddr (anyone who reaches it can drive Raft), or
	// StreamLayer.
	Cluster *clusterport.Cluster
	// StreamLayer replaces the plain TCP transport with another one. Optional; excludes
	// Cluster.
	StreamLayer raft.StreamLayer
	// HTTPClient is used to forward RPCs to the leader. Default: a private client whose idle
	// connections are closed by Close.
	HTTPClient *http.Client
	// APIRoots verify a member's https APIAddr, where the default HTTPClient forwards without
	// TLS between nodes (nil: the system roots).
	APIRoots *x509.CertPool
	// Token is sent as "Authorization: Bearer <Token>" on forwarded RPCs. Optional. With TLS
	// and the cluster's own CA it also pins the CA a joining node accepts.
	Token string
	// JoinTokens are the tokens a join proof to this node may be made with, Token among them
	// (the first if Token is not): the values of a node key being rotated. Empty: Token
	// alone. With a Cluster, its Config.Tokens decide, and pin its CA.
	JoinTokens []string

	// Raft timing. Defaults are hashicorp/raft's (1s, 1s, 500ms, 50ms), sized for a LAN.
	// Tests use a few hundred milliseconds.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration

	// SnapshotThreshold is the number of entries since the last snapshot that triggers a new
	// one; default 16384. TrailingLogs is how many entries are kept behind a snapshot so a
	// lagging follower can catch up from the log; default 16384. SnapshotInterval is how often
	// the threshold is checked; default 30s. SnapshotRetain is the number of snapshots kept;
	// default 2.
	SnapshotThreshold uint64
	TrailingLogs      uint64
	SnapshotInterval  time.Duration
	SnapshotRetain    int

	// MaxAppendEntries bounds how many entries the leader commits in one batch (one fsync) and
	// sends in one AppendEntries RPC; default 256.
	MaxAppendEntries int
	// BatchApplyCh turns on raft's buffered apply channel. Default off: entries stranded in
	// that buffer when raft shuts down are never answered (see DESIGN.md).
	BatchApplyCh bool

	// ApplyTimeout bounds Apply, Join, Remove and Leave when the caller's context has no
	// deadline; default 10s.
	ApplyTimeout time.Duration
	// MaxCommandBytes bounds a forwarded command body; default 4 MiB.
	MaxCommandBytes int64
	// TransportTimeout is the Raft transport's I/O deadline; default 10s.
	TransportTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.MaxVoters <= 0 {
		c.MaxVoters = 3
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	def := raft.DefaultConfig()
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = def.HeartbeatTimeout
	}
	if c.ElectionTimeout <= 0 {
		c.ElectionTimeout = def.ElectionTimeout
	}
	if c.LeaderLeaseTimeout <= 0 {
		c.LeaderLeaseTimeout = min(def.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = def.CommitTimeout
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 16384
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 16384
	}
	if c.SnapshotInterval <= 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.SnapshotRetain <= 0 {
		c.SnapshotRetain = 2
	}
	if c.MaxAppendEntries <= 0 {
		c.MaxAppendEntries = 256
	}
	if c.ApplyTimeout <= 0 {
		c.ApplyTimeout = 10 * time.Second
	}
	if c.MaxCommandBytes <= 0 {
		c.MaxCommandBytes = 4 << 20
	}
	if c.TransportTimeout <= 0 {
		c.TransportTimeout = 10 * time.Second
	}
}

func (c *Config) validate() error {
	switch {
	case c.NodeID == "":
		return fmt.Errorf("%w: NodeID is required", ErrInvalidConfig)
	case c.DataDir == "":
		return fmt.Errorf("%w: DataDir is required", ErrInvalidConfig)
	case c.APIAddr == "":
		return fmt.Errorf("%w: APIAddr is required", ErrInvalidConfig)
	case c.RaftAddr == "" && c.StreamLayer == nil && c.Cluster == nil:
		return fmt.Errorf("%w: RaftAddr is required without a Cluster or StreamLayer", ErrInvalidConfig)
	case c.MaxAppendEntries > 1024:
		return fmt.Errorf("%w: MaxAppendEntries %d exceeds raft's limit of 1024", ErrInvalidConfig, c.MaxAppendEntries)
	}
	return nil
}

// ElectionBound is how long a group with these timeouts (0: raft's defaults) can be without a
// leader when its leader dies: followers notice within twice the heartbeat timeout (raft draws
// each timer between one and two timeouts), and an election round that no split vote repeats
// takes up to twice the election timeout. Anything that must outlast a leader's death (a
// worker's lease) needs to be longer.
func ElectionBound(heartbeatTimeout, electionTimeout time.Duration) time.Duration {
	def := raft.DefaultConfig()
	if heartbeatTimeout <= 0 {
		heartbeatTimeout = def.HeartbeatTimeout
	}
	if electionTimeout <= 0 {
		electionTimeout = def.ElectionTimeout
	}
	return 2*heartbeatTimeout + 2*electionTimeout
}
