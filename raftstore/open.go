package raftstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/hclogslog"
)

// What Open sets up, in order: the forwarding client, the stores on disk, the transport (the
// cluster port with TLS), Raft, bootstrap, and the store's loops.

// Open opens (or creates) the node's Raft state in cfg.DataDir and starts Raft. With
// cfg.Bootstrap and no existing state it bootstraps a single-voter cluster; otherwise the node
// waits to be contacted by a leader (after a Join for a new node). Open does not wait for a
// leader: use WaitForLeader.
func Open(ctx context.Context, cfg Config, sm StateMachine) (_ *Store, err error) {
	if sm == nil {
		return nil, fmt.Errorf("%w: nil StateMachine", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Store{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "raftstore", "node", cfg.NodeID),
		raftDone: make(chan struct{}),
		fatalCh:  make(chan error, 1),
		raftUp:   make(chan struct{}),
	}
	s.rpc, s.lead, s.fwd = &rpcServer{s: s}, newLeadership(s), &forwarder{s: s}
	s.pre.s, s.members = s, &membership{s: s, regCh: make(chan struct{}, 1)}
	s.baseCtx, s.baseCancel = context.WithCancel(context.Background())
	var undo cleanups
	defer func() {
		if err != nil {
			s.baseCancel()
			undo.run()
		}
	}()

	s.fwd.openForwardClient(&undo)
	// Raft repeats a WARN or ERROR for as long as its cause lasts (a down peer: "failed to
	// heartbeat to" twice a second): one line, then a summary every 30 s.
	hlog := hclogslog.New(s.log, hclogslog.Options{RepeatWindow: 30 * time.Second, Relevel: raftLevels.Relevel})
	st, err := s.openStorage(hlog, &undo)
	if err != nil {
		return nil, err
	}
	ledger := clusterport.NewLedger(nil, 0, s.log)
	if cfg.Cluster != nil {
		ledger = cfg.Cluster.Ledger()
	}
	s.fsm = newFSM(sm, s.metaChanged, s.log, cfg.Registerer, ledger)
	s.fsm.onConfiguration = clusterLog{s}.configured
	if err := s.openTransport(hlog, &undo); err != nil {
		return nil, err
	}
	if s.ca == nil {
		// No cluster port: the CA answers that there is none, and checks join proofs.
		s.ca = clusterport.NewAuthority(clusterport.AuthorityConfig{NodeID: cfg.NodeID, Tokens: joinTokens(cfg), Logger: s.log},
			ledger, clusterLog{s}, clusterport.Keys{}, nil, nil, nil)
	}
	rc := raftConfig(cfg, hlog, s.lead.notifyCh)
	s.raft, err = raft.NewRaft(rc, s.fsm, st.logs, st.stable, st.snaps, s.trans)
	if err != nil {
		return nil, fmt.Errorf("raftstore: starting raft: %w", err)
	}
	close(s.raftUp)
	if cfg.Cluster != nil {
		cfg.Cluster.Attach(clusterLog{s})
	}
	for _, w := range s.ca.LeaderWork() {
		s.RunAsLeader(w.Name, w.Run)
	}
	undo.add(func() { _ = s.raft.Shutdown().Error() })
	if cfg.Registerer != nil {
		col := newRaftCollector(s)
		cfg.Registerer.MustRegister(col)
		undo.add(func() { cfg.Registerer.Unregister(col) })
	}
	if err := s.bootstrap(ctx, rc.LocalID, st.dir); err != nil {
		return nil, err
	}
	s.startLoops()
	s.log.Info("raft started", "raft_addr", s.advertise, "api_addr", cfg.APIAddr, "existing_state", s.existing, "log_store", st.format)
	return s, nil
}

// cleanups undo what a failed Open set up, last first.
type cleanups []func()

func (c *cleanups) add(fn func()) { *c = append(*c, fn) }

func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// storage is what Raft keeps on disk: its log (behind the fault detector and a cache), its
// stable store and its snapshots, in dir.
type storage struct {
	dir    string
	format string
	logs   raft.LogStore
	stable raft.StableStore
	snaps  raft.SnapshotStore
}

// openStorage locks <DataDir>/raft and opens Raft's stores in it.
func (s *Store) openStorage(hlog hclog.Logger, undo *cleanups) (storage, error) {
	st := storage{dir: filepath.Join(s.cfg.DataDir, "raft")}
	var err error
	if err := os.MkdirAll(st.dir, 0o700); err != nil {
		return st, fmt.Errorf("raftstore: creating %s: %w", st.dir, err)
	}
	if s.lock, err = lockDir(st.dir); err != nil {
		return st, err
	}
	undo.add(func() { _ = s.lock.Close() })
	if st.format, err = chooseLogStore(st.dir, s.cfg.LogStore); err != nil {
		return st, err
	}
	if s.logs, err = openLogStore(st.dir, st.format, s.cfg.WALSegmentSize, hlog.Named("logstore")); err != nil {
		return st, err
	}
	undo.add(func() { _ = s.logs.Close() })
	s.logDir = st.dir
	if st.format == LogStoreWAL {
		s.logDir = filepath.Join(st.dir, "wal")
	}
	// Raft gets the log through faultStore, so the first failed write is reported here, not
	// lost in raft's own handling (a leader steps down, a follower fails the append RPC and
	// the leader retries forever). Below the LogCache: it wraps store errors without %w.
	stable := &faultStore{logStore: s.logs, onFault: s.storageFault, halt: s.baseCtx.Done()}
	st.stable = stable
	if st.logs, err = raft.NewLogCache(512, stable); err != nil {
		return st, fmt.Errorf("raftstore: log cache: %w", err)
	}
	if st.snaps, err = raft.NewFileSnapshotStoreWithLogger(st.dir, s.cfg.SnapshotRetain, hlog.Named("snapshots")); err != nil {
		return st, fmt.Errorf("raftstore: snapshot store: %w", err)
	}
	if s.existing, err = raft.HasExistingState(st.logs, st.stable, st.snaps); err != nil {
		return st, fmt.Errorf("raftstore: checking existing state: %w", err)
	}
	return st, nil
}

// openTransport makes Raft's transport: the cluster port, the config's StreamLayer, or plain
// TCP.
func (s *Store) openTransport(hlog hclog.Logger, undo *cleanups) error {
	cfg := s.cfg
	stream := cfg.StreamLayer
	switch {
	case cfg.Cluster != nil && stream != nil:
		return fmt.Errorf("%w: Cluster and StreamLayer exclude each other", ErrInvalidConfig)
	case cfg.Cluster != nil:
		// Now that Open knows whether the data dir holds Raft state (the node's identity
		// depends on it).
		var err error
		switch stream, err = cfg.Cluster.Listen(s.existing); {
		case errors.Is(err, clusterport.ErrConfig):
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		case err != nil:
			return fmt.Errorf("raftstore: %w", err)
		}
		undo.add(cfg.Cluster.CloseClients)
		s.ca, s.fwd.peerClient = cfg.Cluster.Authority(), cfg.Cluster.PeerClient()
	}
	if stream != nil {
		s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: stream, MaxPool: 3, Timeout: cfg.TransportTimeout, Logger: hlog.Named("transport"),
		})
	} else {
		var adv net.Addr
		var err error
		if cfg.AdvertiseRaftAddr != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.AdvertiseRaftAddr); err != nil {
				return fmt.Errorf("%w: AdvertiseRaftAddr %q: %w", ErrInvalidConfig, cfg.AdvertiseRaftAddr, err)
			}
		}
		s.trans, err = raft.NewTCPTransportWithLogger(cfg.RaftAddr, adv, 3, cfg.TransportTimeout, hlog.Named("transport"))
		if err != nil {
			return fmt.Errorf("raftstore: raft transport on %s: %w", cfg.RaftAddr, err)
		}
	}
	undo.add(func() { _ = s.trans.Close() })
	s.advertise = string(s.trans.LocalAddr())
	return nil
}

// raftConfig is hashicorp/raft's config from ours.
func raftConfig(cfg Config, hlog hclog.Logger, notify chan bool) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.NotifyCh = notify
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	rc.BatchApplyCh = cfg.BatchApplyCh
	rc.ShutdownOnRemove = true
	rc.NoLegacyTelemetry = true
	return rc
}

// bootstrap makes this node a new cluster's only voter, when the config asks and the data
// dir holds no Raft state.
func (s *Store) bootstrap(ctx context.Context, id raft.ServerID, dir string) error {
	switch {
	case s.cfg.Bootstrap && s.existing:
		s.log.Info("existing raft state found; not bootstrapping", "dir", dir)
	case s.cfg.Bootstrap:
		f := s.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: id, Address: raft.ServerAddress(s.advertise),
		}}})
		if err := s.await(ctx, f); err != nil {
			return fmt.Errorf("raftstore: bootstrap: %w", err)
		}
		s.log.Info("bootstrapped a new cluster", "raft_addr", s.advertise)
	}
	return nil
}

// startLoops registers the observer and starts the store's goroutines (Close waits for
// them).
func (s *Store) startLoops() {
	s.lead.observer = raft.NewObserver(s.lead.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation,
			raft.ResumedHeartbeatObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	s.raft.RegisterObserver(s.lead.observer)
	s.wg.Add(3)
	go s.lead.leaderLoop()
	go s.lead.observeLoop()
	go s.members.registerLoop()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.ca.Renew(s.baseCtx)
	}()
	s.members.nudgeRegistrar()
}
