package raftstore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/hclogslog"
	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Member is one server of the Raft configuration as this node sees it.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	// APIAddr is the member's HTTP base URL; empty until the member has recorded it.
	APIAddr string `json:"api_addr,omitempty"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	// LastContact is, as far as this node knows, when the member was last heard from: on the
	// leader, now for healthy followers and the time of the last successful contact for
	// followers failing heartbeats; on a follower, the last contact with the leader and now for
	// itself. Zero means unknown.
	LastContact time.Time `json:"last_contact,omitzero"`
}

// Store is this node's member of the Raft group. Create it with Open; all methods are safe
// for concurrent use.
type Store struct {
	cfg       Config
	log       *slog.Logger
	raft      *raft.Raft
	fsm       *fsm
	logs      logStore
	logDir    string // where the log lives, for the storage fault's message
	lock      *os.File
	trans     *raft.NetworkTransport
	stream    *tlsStream           // the mutual TLS stream layer, when Config.TLS is set
	ident     *clustertls.Identity // this node's TLS identity, when Config.TLS is set
	tlsDir    string               // <DataDir>/tls with the cluster's own CA
	localCA   *clustertls.CA       // the CA this node created (bootstrap), to record in the log
	raftUp    chan struct{}        // closed once s.raft is set
	advertise string
	existing  bool
	client    *http.Client
	// closeClient closes the connections of a client Open made itself.
	closeClient func()
	// peerTLS and peerClient call other nodes' cluster ports, with mutual TLS (nil without).
	peerTLS    *tls.Config
	peerClient *http.Client
	members    memberCache
	peerSrv    atomic.Pointer[http.Server] // ServePeers'
	peerConns  httpx.ConnStates            // peerSrv's connections

	notifyCh chan bool
	obsCh    chan raft.Observation
	observer *raft.Observer
	regCh    chan struct{}
	certCh   chan struct{} // the recorded CAs changed: renewLoop looks again

	baseCtx    context.Context // cancelled when Close starts
	baseCancel context.CancelFunc
	raftDone   chan struct{} // closed once Close has stopped raft (or given up on it)
	wg         sync.WaitGroup
	closed     atomic.Bool
	closeOnce  sync.Once
	closeErr   error

	// forwarded takes the commands followers forward here (SetForwarded); nil: ApplyLocal.
	forwarded atomic.Pointer[ForwardedFunc]
	pre       preamble // SetLeaderPreamble

	// memberMu makes the leader's membership changes one at a time, so a join's fence check and
	// its add never interleave with a removal's fence and its remove.
	memberMu sync.Mutex

	// A storage fault: set once, by the first failed log or stable store write.
	fault     atomic.Pointer[error]
	fatalCh   chan error
	faultOnce sync.Once

	mu            sync.Mutex
	changed       chan struct{} // closed and replaced on every leader or metadata change
	leaderFns     []leaderFn
	leaderCtx     context.Context // non-nil while leading (after the barrier)
	leaderRunning *sync.WaitGroup
	failing       map[raft.ServerID]time.Time
	lastLeader    raft.ServerID
}

type leaderFn struct {
	name string
	fn   func(ctx context.Context)
}

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
		notifyCh: make(chan bool, 16),
		obsCh:    make(chan raft.Observation, 64),
		regCh:    make(chan struct{}, 1),
		certCh:   make(chan struct{}, 1),
		changed:  make(chan struct{}),
		raftDone: make(chan struct{}),
		fatalCh:  make(chan error, 1),
		failing:  map[raft.ServerID]time.Time{},
		raftUp:   make(chan struct{}),
	}
	s.baseCtx, s.baseCancel = context.WithCancel(context.Background())
	var cleanups []func()
	defer func() {
		if err != nil {
			s.baseCancel()
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()

	s.client = cfg.HTTPClient
	if s.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// Forwards to the leader run concurrently (group-commit flushers,
		// registrations); the default 2 idle connections per host would
		// make every extra one dial and close.
		tr.MaxIdleConnsPerHost = 64
		// Forwarded applies are small and on the claim path: written and
		// read on the caller's goroutine, without net/http's per-connection
		// goroutine hand-offs (large bodies and https go to tr).
		sync := &httpx.SyncTransport{Fallback: tr, MaxIdlePerHost: 64, DialTimeout: 5 * time.Second}
		s.client = &http.Client{Transport: sync}
		s.closeClient = func() { sync.Close(); tr.CloseIdleConnections() }
		cleanups = append(cleanups, s.closeClient)
	}
	// Raft repeats a WARN or ERROR for as long as its cause lasts (a down peer: "failed to
	// heartbeat to" twice a second): one line, then a summary every 30 s.
	hlog := hclogslog.New(s.log, hclogslog.Options{RepeatWindow: 30 * time.Second, Relevel: raftLevels.Relevel})

	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftstore: creating %s: %w", dir, err)
	}
	if s.lock, err = lockDir(dir); err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { _ = s.lock.Close() })
	format, err := chooseLogStore(dir, cfg.LogStore)
	if err != nil {
		return nil, err
	}
	if s.logs, err = openLogStore(dir, format, cfg.WALSegmentSize, hlog.Named("logstore")); err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { _ = s.logs.Close() })
	s.logDir = dir
	if format == LogStoreWAL {
		s.logDir = filepath.Join(dir, "wal")
	}
	// Raft gets the log through faultStore, so the first failed write is reported here, not
	// lost in raft's own handling (a leader steps down, a follower fails the append RPC and
	// the leader retries forever). Below the LogCache: it wraps store errors without %w.
	stable := &faultStore{logStore: s.logs, onFault: s.storageFault, halt: s.baseCtx.Done()}
	logs, err := raft.NewLogCache(512, stable)
	if err != nil {
		return nil, fmt.Errorf("raftstore: log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, cfg.SnapshotRetain, hlog.Named("snapshots"))
	if err != nil {
		return nil, fmt.Errorf("raftstore: snapshot store: %w", err)
	}

	s.existing, err = raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return nil, fmt.Errorf("raftstore: checking existing state: %w", err)
	}

	switch {
	case cfg.TLS != nil:
		if cfg.StreamLayer != nil {
			return nil, fmt.Errorf("%w: TLS and StreamLayer exclude each other", ErrInvalidConfig)
		}
		if err := s.setupTLS(); err != nil {
			return nil, err
		}
		s.peerTLS = s.ident.ClientConfig(alpnHTTP)
		tr := &http.Transport{TLSClientConfig: s.peerTLS, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
		// A connection beyond the idle pool is closed after its request, and a new one costs
		// a handshake: keep as many as forwards run at once.
		sync := &httpx.SyncTransport{TLS: s.peerTLS, Fallback: tr, MaxIdlePerHost: peerIdlePerHost, DialTimeout: 5 * time.Second}
		s.peerClient = &http.Client{Transport: sync}
		cleanups = append(cleanups, func() { sync.Close(); tr.CloseIdleConnections() })
		ln, err := net.Listen("tcp", cfg.RaftAddr)
		if err != nil {
			return nil, fmt.Errorf("raftstore: raft transport on %s: %w", cfg.RaftAddr, err)
		}
		adv := ln.Addr()
		if cfg.AdvertiseRaftAddr != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.AdvertiseRaftAddr); err != nil {
				_ = ln.Close()
				return nil, fmt.Errorf("%w: AdvertiseRaftAddr %q: %w", ErrInvalidConfig, cfg.AdvertiseRaftAddr, err)
			}
		} else if tcp, ok := adv.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
			_ = ln.Close()
			return nil, fmt.Errorf("%w: RaftAddr %s binds every interface: set AdvertiseRaftAddr", ErrInvalidConfig, cfg.RaftAddr)
		}
		s.stream = newTLSStream(ln, adv, s.ident, s.allowPeer, s.memberHost, s.log.With("component", "raft-tls"))
		if cfg.TLS.ServerConn != nil {
			s.stream.server = cfg.TLS.ServerConn
		}
		s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  s.stream,
			MaxPool: 3,
			Timeout: cfg.TransportTimeout,
			Logger:  hlog.Named("transport"),
		})
	case cfg.StreamLayer != nil:
		s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  cfg.StreamLayer,
			MaxPool: 3,
			Timeout: cfg.TransportTimeout,
			Logger:  hlog.Named("transport"),
		})
	default:
		var adv net.Addr
		if cfg.AdvertiseRaftAddr != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.AdvertiseRaftAddr); err != nil {
				return nil, fmt.Errorf("%w: AdvertiseRaftAddr %q: %w", ErrInvalidConfig, cfg.AdvertiseRaftAddr, err)
			}
		}
		s.trans, err = raft.NewTCPTransportWithLogger(cfg.RaftAddr, adv, 3, cfg.TransportTimeout, hlog.Named("transport"))
		if err != nil {
			return nil, fmt.Errorf("raftstore: raft transport on %s: %w", cfg.RaftAddr, err)
		}
	}
	cleanups = append(cleanups, func() { _ = s.trans.Close() })
	s.advertise = string(s.trans.LocalAddr())

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.NotifyCh = s.notifyCh
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

	s.fsm = newFSM(sm, s.metaChanged, s.log, cfg.Registerer, cfg.Sealer, cfg.CertValidity)
	s.fsm.onConfiguration = s.configurationCommitted
	s.raft, err = raft.NewRaft(rc, s.fsm, logs, stable, snaps, s.trans)
	if err != nil {
		return nil, fmt.Errorf("raftstore: starting raft: %w", err)
	}
	close(s.raftUp)
	if s.localCA != nil {
		s.leaderFns = append(s.leaderFns, leaderFn{name: "cluster-ca", fn: s.proposeCA})
	}
	if cfg.Sealer != nil && s.ident != nil {
		s.leaderFns = append(s.leaderFns, leaderFn{name: "seal-cluster-ca", fn: s.sealCA})
	}
	if s.ident != nil && !cfg.TLS.own() {
		s.leaderFns = append(s.leaderFns, leaderFn{name: "retire-cluster-cas", fn: s.retireCAs})
	}
	cleanups = append(cleanups, func() { _ = s.raft.Shutdown().Error() })
	if cfg.Registerer != nil {
		col := newRaftCollector(s)
		cfg.Registerer.MustRegister(col)
		cleanups = append(cleanups, func() { cfg.Registerer.Unregister(col) })
	}

	switch {
	case cfg.Bootstrap && s.existing:
		s.log.Info("existing raft state found; not bootstrapping", "dir", dir)
	case cfg.Bootstrap:
		f := s.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: rc.LocalID, Address: raft.ServerAddress(s.advertise),
		}}})
		if err := s.await(ctx, f); err != nil {
			return nil, fmt.Errorf("raftstore: bootstrap: %w", err)
		}
		s.log.Info("bootstrapped a new cluster", "raft_addr", s.advertise)
	}

	s.observer = raft.NewObserver(s.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation,
			raft.ResumedHeartbeatObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	s.raft.RegisterObserver(s.observer)

	s.wg.Add(3)
	go s.leaderLoop()
	go s.observeLoop()
	go s.registerLoop()
	if s.ident != nil && !cfg.TLS.own() {
		s.wg.Add(1)
		go s.renewLoop()
	}
	s.nudgeRegistrar()
	s.log.Info("raft started", "raft_addr", s.advertise, "api_addr", cfg.APIAddr, "existing_state", s.existing, "log_store", format)
	return s, nil
}

// Fatal delivers the node's storage fault (wrapping ErrStorageFault), once: a write to the Raft
// log or stable store failed. The node refuses further work from then on; the process must exit
// non-zero without attempting Raft writes (a drain, deregistration or leave cannot commit) and be
// restarted (systemd's Restart=on-failure), which reopens the log consistently from disk.
func (s *Store) Fatal() <-chan error { return s.fatalCh }

// Fault returns the storage fault (wrapping ErrStorageFault), or nil while there is none. A
// node with a fault is not ready.
func (s *Store) Fault() error {
	if p := s.fault.Load(); p != nil {
		return *p
	}
	return nil
}

// storageFault records the first failed write, logs it once and delivers it on Fatal.
func (s *Store) storageFault(op string, err error) {
	s.faultOnce.Do(func() {
		free := "unknown"
		if n, ferr := freeBytes(s.logDir); ferr == nil {
			free = mib(n)
		}
		// A failed segment rotation (raft-wal logs its cause as "rotate error") shows here as
		// the next append's "segment is sealed".
		ferr := fmt.Errorf("%w: %s in %s (%s free): %w", ErrStorageFault, op, s.logDir, free, err)
		s.fault.Store(&ferr)
		s.log.Error("raft log storage failed: this node stops and exits; free space in "+s.logDir+
			" (or repair the disk), then systemd restarts the node and it catches up",
			"dir", s.logDir, "op", op, "err", err, "free", free)
		s.fatalCh <- ferr
		s.notifyChange()
		// Fail-stop means silent at once: peers' dials are refused and their
		// connections close now, not when the agent's shutdown reaches Close;
		// a half-alive node drives the leader's replication to it into raft's
		// longest backoff, which then delays its restarted successor.
		_ = s.trans.Close()
	})
}

// NodeID returns this node's id.
func (s *Store) NodeID() string { return s.cfg.NodeID }

// RaftAddr returns the Raft address other nodes use to reach this node.
func (s *Store) RaftAddr() string { return s.advertise }

// APIAddr returns this node's HTTP base URL.
func (s *Store) APIAddr() string { return s.cfg.APIAddr }

// HadExistingState reports whether DataDir held Raft state when Open ran. A node with state
// is already a member (or was removed) and needs no join; re-sending one is harmless.
func (s *Store) HadExistingState() bool { return s.existing }

// IsLeader reports whether this node currently believes it is the leader.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the current leader's id and API URL as far as this node knows; empty strings
// if unknown.
func (s *Store) Leader() (id, apiAddr string) {
	_, lid := s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	return string(lid), s.fsm.apiAddr(string(lid))
}

// whileLeader returns ctx, cut short with the cause ErrLeaderChanged once this node sees a
// leader other than id, or none. A request forwarded to a leader that was then cut off gets no
// answer, not even an error (a partition drops packets silently): without this it would wait
// out its whole timeout after the followers had already elected another leader, holding up
// whatever queued behind it. Cancel the returned func when done.
func (s *Store) whileLeader(ctx context.Context, id string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		// The change channel is the fast path; the ticker covers observations raft dropped.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			changed := s.changes()
			if cur, _ := s.Leader(); cur != id || s.closed.Load() {
				cancel(ErrLeaderChanged)
				return
			}
			select {
			case <-changed:
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// AppliedIndex returns the index of the last entry raft has handed to the state machine on
// this node; the state machine may still be applying it (read the state machine's own index
// to know what it holds).
func (s *Store) AppliedIndex() uint64 { return s.raft.AppliedIndex() }

// Stats returns raft's own statistics (state, term, indexes, last contact ...).
func (s *Store) Stats() map[string]string { return s.raft.Stats() }

// Apply commits cmd and returns the state machine's result. On the leader it is a raft.Apply;
// on a follower it is forwarded to the leader's API (POST <leader>/_raft/apply), where the
// ForwardedFunc set with SetForwarded takes it, if there is one. While no leader is known, or
// the contacted node turns out not to be the leader before accepting the command, Apply waits
// and tries again until ctx ends (then ErrNoLeader/ErrNotLeader). An error wrapping
// ErrOutcomeUnknown means the command may have been committed; Apply never retries those.
func (s *Store) Apply(ctx context.Context, cmd []byte) ([]byte, error) {
	var res []byte
	err := s.onLeader(ctx, "apply",
		func(ctx context.Context) (err error) {
			res, err = s.applyUser(ctx, cmd)
			return err
		},
		func(ctx context.Context, api string) (err error) {
			res, err = s.call(ctx, api, "apply", cmd, true)
			return err
		})
	if err != nil || len(res) == 0 {
		return nil, err // an empty result is nil on the leader and across forwarding alike
	}
	return res, nil
}

// ApplyLocal commits cmd through this node's log and returns the state machine's result, if
// this node leads; otherwise it fails with ErrNotLeader and nothing was started. Unlike Apply
// it never forwards and never waits for a leader: it is how a command a follower forwarded is
// committed, so a command travels one hop at most.
func (s *Store) ApplyLocal(ctx context.Context, cmd []byte) ([]byte, error) {
	if err := s.Fault(); err != nil {
		return nil, fmt.Errorf("raftstore: apply: %w", err)
	}
	if err := s.leads(); err != nil {
		return nil, fmt.Errorf("raftstore: apply: %w", err)
	}
	ctx, cancel := s.withDefaultTimeout(ctx)
	defer cancel()
	res, err := s.applyUser(ctx, cmd)
	if err != nil || len(res) == 0 {
		return nil, err
	}
	return res, nil
}

// ForwardedFunc takes a command a follower forwarded to this node, the leader, and returns the
// state machine's result. It must commit through ApplyLocal (never Apply: a forwarded command
// is not passed on again), and its errors wrap this package's sentinels as Apply's do:
// ErrNotLeader or ErrClosed if the command was not started (the follower retries it with the
// next leader), ErrOutcomeUnknown if it may have been, ErrBadRequest if it is malformed.
type ForwardedFunc func(ctx context.Context, cmd []byte) ([]byte, error)

// SetForwarded hands the commands followers forward to this node, while it leads, to fn
// instead of straight to ApplyLocal, so the state machine's owner can commit them together
// with its own (the directory merges every node's commands into few entries). nil restores
// ApplyLocal.
func (s *Store) SetForwarded(fn ForwardedFunc) {
	if fn == nil {
		s.forwarded.Store(nil)
		return
	}
	s.forwarded.Store(&fn)
}

// applyForwarded commits a command a follower forwarded, on this node only.
func (s *Store) applyForwarded(ctx context.Context, cmd []byte) ([]byte, error) {
	if fn := s.forwarded.Load(); fn != nil {
		var res []byte
		err := s.localOnly(func() (err error) {
			res, err = (*fn)(ctx, cmd)
			return err
		})
		return res, err
	}
	return s.ApplyLocal(ctx, cmd)
}

// Barrier waits until every entry committed before it has been applied on this node, which
// must be the leader (a follower gets ErrNotLeader).
func (s *Store) Barrier(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.Fault(); err != nil {
		return err
	}
	f := s.raft.Barrier(timeoutFrom(ctx, s.cfg.ApplyTimeout))
	if err := s.await(ctx, f); err != nil {
		return fmt.Errorf("raftstore: barrier: %w", err)
	}
	return nil
}

// WaitForLeader blocks until a leader is known and its API URL is recorded, i.e. until Apply
// can reach it, or ctx ends.
func (s *Store) WaitForLeader(ctx context.Context) error {
	for {
		changed := s.changes()
		if s.closed.Load() {
			return ErrClosed
		}
		if id, api := s.Leader(); id != "" && api != "" {
			return nil
		}
		// The change channel is the fast path; the timer covers observations raft dropped.
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("raftstore: waiting for leader: %w: %w", ErrNoLeader, ctx.Err())
		}
		t.Stop()
	}
}

// Join adds a node to the group, or does nothing if it is already a member with this id and
// address. It runs on the leader; a follower forwards it. The node becomes a voter while the
// group has fewer than MaxVoters voters, else a nonvoter (an existing nonvoter is promoted when
// a voter slot is free). A different member that holds the same id or the same Raft address is
// stale (the node was rebuilt or re-addressed) and is removed first, as Consul and rqlite do.
// apiAddr, if given, is recorded as the member's metadata.
func (s *Store) Join(ctx context.Context, nodeID, raftAddr, apiAddr string) error {
	if nodeID == "" || raftAddr == "" {
		return fmt.Errorf("%w: join needs a node id and a raft address", ErrBadRequest)
	}
	return joinFenced(s.fsm.membershipFence(), func(fence uint64) error {
		return s.join(ctx, joinRequest{ID: nodeID, RaftAddr: raftAddr, APIAddr: apiAddr, Fence: fence})
	})
}

// join runs req on the leader as it is, fence included.
func (s *Store) join(ctx context.Context, req joinRequest) error {
	return s.onLeader(ctx, "join",
		func(ctx context.Context) error { return s.joinLocal(ctx, req) },
		func(ctx context.Context, api string) error { return s.callJSON(ctx, api, "join", req, nil, true) })
}

// joinFenced runs join with fence, and again with the cluster's fence while the leader refuses
// it as made before a removal (ErrStaleJoin): a few times at most, since each refusal names a
// higher fence and only a removal that races the join raises it again.
func joinFenced(fence uint64, join func(fence uint64) error) error {
	for tries := 1; ; tries++ {
		err := join(fence)
		var stale *staleJoinError
		if !errors.As(err, &stale) || stale.current <= fence || tries == 4 {
			return err
		}
		fence = stale.current
	}
}

// Remove removes a (typically dead) member from the group; it runs on the leader, a follower
// forwards it. Removing a non-member is a no-op. Removing this node itself is Leave. The last
// voter cannot be removed (ErrLastVoter).
func (s *Store) Remove(ctx context.Context, nodeID string) error {
	if nodeID == "" {
		return fmt.Errorf("%w: remove needs a node id", ErrBadRequest)
	}
	if nodeID == s.cfg.NodeID {
		return s.Leave(ctx)
	}
	return s.remove(ctx, nodeID)
}

func (s *Store) remove(ctx context.Context, nodeID string) error {
	req := removeRequest{ID: nodeID}
	return s.onLeader(ctx, "remove",
		func(ctx context.Context) error { return s.removeLocal(ctx, req.ID) },
		func(ctx context.Context, api string) error { return s.callJSON(ctx, api, "remove", req, nil, true) })
}

// Leave removes this node from the group: if it is the leader it first transfers leadership,
// then asks the (new) leader to remove it. Close the store afterwards.
func (s *Store) Leave(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.Fault(); err != nil {
		return fmt.Errorf("raftstore: leave: %w", err)
	}
	ctx, cancel := s.withDefaultTimeout(ctx)
	defer cancel()
	if s.IsLeader() {
		if err := s.transferLeadership(ctx); err != nil {
			return fmt.Errorf("raftstore: leave: %w", err)
		}
	}
	// The members' addresses, for the record below: a restarted node that has no leader has
	// not replayed the entries that carry them.
	members, _ := s.Members(ctx)
	// Already gone (a retried leave) is what leave asked for.
	if err := s.remove(ctx, s.cfg.NodeID); err != nil && !errors.Is(err, ErrUnknownMember) {
		return fmt.Errorf("raftstore: leave: %w", err)
	}
	// The configuration without this node may never reach its own log (the leader stops
	// replicating to it), so the leave is recorded beside the log for a restart to find.
	if err := s.writeLeftMarker(members); err != nil {
		s.log.Warn("could not record the leave in the data dir; a restart will not know it left", "err", err)
	}
	s.log.Info("left the cluster")
	return nil
}

// leftMarker, in the Raft directory, records that this node left the cluster and the members it
// left (leftRecord); a join removes it.
const leftMarker = "left.json"

type leftRecord struct {
	At      time.Time `json:"at"`
	Members []Member  `json:"members"` // the others, as they were
}

func (s *Store) leftPath() string { return filepath.Join(s.cfg.DataDir, "raft", leftMarker) }

func (s *Store) writeLeftMarker(members []Member) error {
	rec := leftRecord{At: time.Now().UTC()}
	for _, m := range members {
		if m.ID != s.cfg.NodeID {
			rec.Members = append(rec.Members, Member{ID: m.ID, RaftAddr: m.RaftAddr, APIAddr: m.APIAddr, Voter: m.Voter})
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(s.leftPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readLeftMarker returns the record of an earlier leave, if this data dir holds one.
func (s *Store) readLeftMarker() (leftRecord, bool) {
	b, err := os.ReadFile(s.leftPath())
	if err != nil {
		return leftRecord{}, false
	}
	var rec leftRecord
	_ = json.Unmarshal(b, &rec) // a torn record still says the node left
	return rec, true
}

// Removed reports whether this node is out of the cluster its data dir knew: it left (Leave
// ran to the end and no join followed) or the latest configuration it holds lists others but
// not it (another member removed it). Such a node serves nothing until it joins again; others
// are the members that configuration lists, to name one to join through.
func (s *Store) Removed(ctx context.Context) (removed bool, others []Member, err error) {
	ms, err := s.Members(ctx)
	if err != nil {
		return false, nil, err
	}
	rec, left := s.readLeftMarker()
	listed := false
	for _, m := range ms {
		if m.ID == s.cfg.NodeID {
			listed = true
			continue
		}
		// Until a leader brings this node's directory up to date, the member addresses are
		// the ones recorded when it left.
		for _, r := range rec.Members {
			if m.APIAddr == "" && r.ID == m.ID {
				m.APIAddr = r.APIAddr
			}
		}
		others = append(others, m)
	}
	if len(others) == 0 {
		others = rec.Members
	}
	return left || !listed && len(ms) > 0, others, nil
}

// transferLeadership hands leadership to another voter. It fails with ErrLastVoter if there is
// none.
func (s *Store) transferLeadership(ctx context.Context) error {
	servers, err := s.configuration(ctx)
	if err != nil {
		return err
	}
	others := 0
	for _, srv := range servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != s.cfg.NodeID {
			others++
		}
	}
	if others == 0 {
		return ErrLastVoter
	}
	s.log.Info("transferring leadership")
	if err := s.await(ctx, s.raft.LeadershipTransfer()); err != nil {
		return fmt.Errorf("leadership transfer: %w", err)
	}
	return nil
}

// Members lists the Raft configuration as this node sees it, with member metadata.
func (s *Store) Members(ctx context.Context) ([]Member, error) {
	servers, err := s.configuration(ctx)
	if err != nil {
		return nil, err
	}
	meta := s.fsm.metaCopy()
	_, leaderID := s.raft.LeaderWithID()
	leading := s.IsLeader()
	now := time.Now()
	s.mu.Lock()
	failing := make(map[raft.ServerID]time.Time, len(s.failing))
	for k, v := range s.failing {
		failing[k] = v
	}
	s.mu.Unlock()
	out := make([]Member, 0, len(servers))
	for _, srv := range servers {
		m := Member{
			ID:       string(srv.ID),
			RaftAddr: string(srv.Address),
			APIAddr:  meta[string(srv.ID)],
			Voter:    srv.Suffrage == raft.Voter,
			Leader:   srv.ID == leaderID,
		}
		switch {
		case string(srv.ID) == s.cfg.NodeID:
			m.LastContact = now
		case leading:
			if t, ok := failing[srv.ID]; ok {
				m.LastContact = t
			} else {
				m.LastContact = now
			}
		case m.Leader:
			m.LastContact = s.raft.LastContact()
		}
		out = append(out, m)
	}
	return out, nil
}

func (s *Store) configuration(ctx context.Context) ([]raft.Server, error) {
	f := s.raft.GetConfiguration()
	if err := s.await(ctx, f); err != nil {
		return nil, fmt.Errorf("raftstore: reading configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}

// Close shuts the node down gracefully: it transfers leadership if it is the leader and another
// voter exists, stops leader work, shuts Raft down and closes the stores. It does not remove the
// node from the group (that is Leave). Close is idempotent.
func (s *Store) Close(ctx context.Context) error {
	return s.shutdown(ctx, true)
}

func (s *Store) shutdown(ctx context.Context, graceful bool) error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if graceful && s.IsLeader() {
			tctx, cancel := ctx, context.CancelFunc(func() {})
			if s.Fault() != nil {
				// Raft's loop may be parked on the failed write and never answer.
				tctx, cancel = context.WithTimeout(ctx, 2*time.Second)
			}
			if err := s.transferLeadership(tctx); err != nil && !errors.Is(err, ErrLastVoter) {
				s.log.Warn("leadership transfer before shutdown failed", "err", err)
			}
			cancel()
		}
		// After the hand-over no follower forwards here; the peers' requests under way get
		// their answers before raft stops.
		s.stopPeers(ctx, graceful)
		s.baseCancel()
		s.notifyChange()
		s.raft.DeregisterObserver(s.observer)
		err := s.waitRaftShutdown(ctx)
		close(s.raftDone)
		if errors.Is(err, ErrShutdownStuck) {
			// Raft's goroutines may still use the stores: leave them (and the data dir lock)
			// to the process's exit, which a crash-safe log survives.
			s.closeErr = fmt.Errorf("raftstore: shutdown: %w", err)
			s.log.Error("raft did not stop; leaving it to the process exit", "err", err)
			return
		}
		// Shutdown closes the transport only the first time; raft may already have shut itself
		// down (a leader that removed itself), so close it here too (idempotent).
		if terr := s.trans.Close(); terr != nil && err == nil {
			err = terr
		}
		s.wg.Wait()
		if cerr := s.logs.Close(); cerr != nil && err == nil {
			err = cerr
		}
		_ = s.lock.Close() // releases the data dir for the next process
		if s.closeClient != nil {
			s.closeClient()
		}
		if s.peerClient != nil {
			s.peerClient.CloseIdleConnections()
		}
		if err != nil {
			s.closeErr = fmt.Errorf("raftstore: shutdown: %w", err)
		}
		s.log.Info("raft stopped")
	})
	return s.closeErr
}

// waitRaftShutdown shuts raft down and waits for it until ctx ends. Raft's Shutdown waits for
// every replication goroutine, and one blocked on a peer's connection waits for the transport's
// I/O deadline, or longer (seen in a test: heartbeats to a stopped peer went on for 20 s after
// Shutdown, and SIGTERM never ended the process). When ctx ends, closing the transport fails
// that I/O; if raft still has not stopped a moment later, ErrShutdownStuck.
func (s *Store) waitRaftShutdown(ctx context.Context) error {
	f := s.raft.Shutdown()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	s.log.Warn("raft shutdown is slow; closing its transport")
	_ = s.trans.Close()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return ErrShutdownStuck
	}
}

// onLeader runs local on the leader, or remote against the leader's API on a follower. It waits
// and retries while the attempt failed without starting (ErrNotLeader, ErrNoLeader), until ctx
// (or ApplyTimeout, if ctx has no deadline) ends. It never retries ErrOutcomeUnknown.
func (s *Store) onLeader(ctx context.Context, op string, local func(context.Context) error, remote func(context.Context, string) error) error {
	if s.closed.Load() {
		return fmt.Errorf("raftstore: %s: %w", op, ErrClosed)
	}
	if err := s.Fault(); err != nil {
		return fmt.Errorf("raftstore: %s: %w", op, err)
	}
	ctx, cancel := s.withDefaultTimeout(ctx)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		changed := s.changes()
		var err error
		if s.IsLeader() {
			err = local(ctx)
		} else if id, api := s.leaderBase(); id != "" && id != s.cfg.NodeID && api != "" {
			rctx, stop := s.whileLeader(ctx, id)
			err = remote(rctx, api)
			stop()
		} else {
			err = ErrNoLeader
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrOutcomeUnknown) || !(errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNoLeader)) {
			return err
		}
		if s.closed.Load() {
			return fmt.Errorf("raftstore: %s: %w", op, ErrClosed)
		}
		t := time.NewTimer(backoff)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("raftstore: %s: %w: %w", op, err, ctx.Err())
		}
		t.Stop()
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// applyLocal proposes data on this node, which must be the leader.
func (s *Store) applyLocal(ctx context.Context, data []byte) ([]byte, error) {
	f := s.raft.Apply(data, timeoutFrom(ctx, s.cfg.ApplyTimeout))
	if err := s.await(ctx, f); err != nil {
		return nil, fmt.Errorf("raftstore: apply: %w", err)
	}
	res, _ := f.Response().([]byte)
	return res, nil
}

// joinLocal adds the node on the leader. A join must name the membership fence: the index of
// the entry every removal commits before it removes a member (removeServer). One that names a
// lower fence was made before the latest removal and is refused (ErrStaleJoin), so a captured
// join sent again cannot undo a removal: its proof covers the fence it names. A new leader
// checks only after its leader loop's barrier: until then it may not have applied the latest
// fence entry (ErrNotLeader: the caller retries).
func (s *Store) joinLocal(ctx context.Context, req joinRequest) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	s.mu.Lock()
	ready := s.leaderCtx != nil
	s.mu.Unlock()
	if !ready {
		return fmt.Errorf("raftstore: join: %w: this new leader has not applied its predecessors' entries yet", ErrNotLeader)
	}
	if cur := s.fsm.membershipFence(); req.Fence < cur {
		return &staleJoinError{current: cur}
	}
	servers, err := s.configuration(ctx)
	if err != nil {
		return err
	}
	id, addr := raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr)
	voters := 0
	for _, srv := range servers {
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}
	for _, srv := range servers {
		switch {
		case srv.ID == id && srv.Address == addr:
			if srv.Suffrage != raft.Voter && voters < s.cfg.MaxVoters {
				if err := s.await(ctx, s.raft.AddVoter(id, addr, 0, timeoutFrom(ctx, s.cfg.ApplyTimeout))); err != nil {
					return fmt.Errorf("raftstore: promoting %s: %w", id, err)
				}
				s.log.Info("promoted member to voter", "member", id)
			}
			return s.setMetaLocal(ctx, req.ID, req.APIAddr)
		case srv.ID == id || srv.Address == addr:
			if string(srv.ID) == s.cfg.NodeID {
				return fmt.Errorf("%w: join of %s at %s conflicts with the leader %s at %s",
					ErrBadRequest, id, addr, srv.ID, srv.Address)
			}
			s.log.Info("removing stale member before join", "member", srv.ID, "raft_addr", srv.Address,
				"joining", id, "joining_raft_addr", addr)
			if err := s.removeServer(ctx, srv.ID); err != nil {
				return fmt.Errorf("raftstore: removing stale member %s: %w", srv.ID, err)
			}
			if srv.Suffrage == raft.Voter {
				voters--
			}
			if srv.ID != id {
				if _, err := s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaDelete, ID: string(srv.ID)})); err != nil {
					return err
				}
			}
		}
	}
	var f raft.IndexFuture
	voter := voters < s.cfg.MaxVoters
	if voter {
		f = s.raft.AddVoter(id, addr, 0, timeoutFrom(ctx, s.cfg.ApplyTimeout))
	} else {
		f = s.raft.AddNonvoter(id, addr, 0, timeoutFrom(ctx, s.cfg.ApplyTimeout))
	}
	if err := s.await(ctx, f); err != nil {
		return fmt.Errorf("raftstore: adding %s: %w", id, err)
	}
	s.log.Info("member joined", "member", id, "raft_addr", addr, "api_addr", req.APIAddr, "voter", voter)
	return s.setMetaLocal(ctx, req.ID, req.APIAddr)
}

func (s *Store) removeLocal(ctx context.Context, nodeID string) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	servers, err := s.configuration(ctx)
	if err != nil {
		return err
	}
	var found *raft.Server
	voters := 0
	for i, srv := range servers {
		if srv.Suffrage == raft.Voter {
			voters++
		}
		if string(srv.ID) == nodeID {
			found = &servers[i]
		}
	}
	delMeta := func() error {
		if s.fsm.apiAddr(nodeID) == "" {
			return nil
		}
		_, err := s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaDelete, ID: nodeID}))
		return err
	}
	if found == nil {
		if s.fsm.apiAddr(nodeID) == "" {
			return fmt.Errorf("%w: no member named %q (already removed, or never a member: see `pinnedd members`)", ErrUnknownMember, nodeID)
		}
		return delMeta()
	}
	if found.Suffrage == raft.Voter && voters == 1 {
		return fmt.Errorf("raftstore: removing %s: %w", nodeID, ErrLastVoter)
	}
	self := nodeID == s.cfg.NodeID
	if self {
		// The leader removing itself steps down once the change commits: record the metadata
		// removal while it still can.
		if err := delMeta(); err != nil {
			return err
		}
	}
	if err := s.removeServer(ctx, found.ID); err != nil {
		return fmt.Errorf("raftstore: removing %s: %w", nodeID, err)
	}
	s.log.Info("member removed", "member", nodeID)
	s.mu.Lock()
	delete(s.failing, found.ID)
	s.mu.Unlock()
	if self {
		return nil
	}
	return delMeta()
}

// removeServer removes id from the configuration on the leader, every removal's one way: it
// first commits a fence entry, whose index every later join must name (joinLocal), so no join
// made before this removal can add the node back.
func (s *Store) removeServer(ctx context.Context, id raft.ServerID) error {
	if _, err := s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaFence, ID: string(id)})); err != nil {
		return err
	}
	return s.await(ctx, s.raft.RemoveServer(id, 0, timeoutFrom(ctx, s.cfg.ApplyTimeout)))
}

// setMetaLocal records a member's API URL on the leader, if the member exists and the value
// changed.
func (s *Store) setMetaLocal(ctx context.Context, nodeID, apiAddr string) error {
	if apiAddr == "" || s.fsm.apiAddr(nodeID) == apiAddr {
		return nil
	}
	servers, err := s.configuration(ctx)
	if err != nil {
		return err
	}
	member := false
	for _, srv := range servers {
		member = member || string(srv.ID) == nodeID
	}
	if !member {
		return fmt.Errorf("raftstore: recording api address of %s: %w", nodeID, ErrUnknownMember)
	}
	_, err = s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaSet, ID: nodeID, APIAddr: apiAddr}))
	return err
}

func (s *Store) setMeta(ctx context.Context, nodeID, apiAddr string) error {
	req := metaRequest{ID: nodeID, APIAddr: apiAddr}
	return s.onLeader(ctx, "record api address",
		func(ctx context.Context) error { return s.setMetaLocal(ctx, nodeID, apiAddr) },
		func(ctx context.Context, api string) error { return s.callJSON(ctx, api, "meta", req, nil, true) })
}

// changes returns a channel closed at the next leader or metadata change.
func (s *Store) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Store) notifyChange() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *Store) metaChanged() {
	s.notifyChange()
	s.nudgeRegistrar()
	select {
	case s.certCh <- struct{}{}:
	default:
	}
}

func (s *Store) nudgeRegistrar() {
	select {
	case s.regCh <- struct{}{}:
	default:
	}
}

// observeLoop follows raft's observations: leader changes (wake waiters, re-check this node's
// metadata) and heartbeat failures (Members' last contact).
func (s *Store) observeLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case o := <-s.obsCh:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				s.mu.Lock()
				changed := d.LeaderID != s.lastLeader
				s.lastLeader = d.LeaderID
				if d.LeaderID != "" && string(d.LeaderID) != s.cfg.NodeID {
					s.pre.former = string(d.LeaderID)
				}
				s.mu.Unlock()
				if changed {
					s.log.Info("leader changed", "leader", d.LeaderID, "leader_raft_addr", d.LeaderAddr)
				}
				s.notifyChange()
				s.nudgeRegistrar()
			case raft.FailedHeartbeatObservation:
				// Raft's own lines about it are below INFO (raftLevels): one line
				// when contact is lost, one when it is back.
				s.mu.Lock()
				_, known := s.failing[d.PeerID]
				s.failing[d.PeerID] = d.LastContact
				s.mu.Unlock()
				if !known {
					s.log.Info("lost contact with a raft peer; retrying", "peer", d.PeerID, "last_contact", d.LastContact)
				}
			case raft.ResumedHeartbeatObservation:
				s.mu.Lock()
				_, known := s.failing[d.PeerID]
				delete(s.failing, d.PeerID)
				s.mu.Unlock()
				if known {
					s.log.Info("raft peer reachable again", "peer", d.PeerID)
				}
			case raft.PeerObservation:
				if d.Removed {
					s.mu.Lock()
					delete(s.failing, d.Peer.ID)
					s.mu.Unlock()
				}
			}
		}
	}
}

// registerLoop makes sure the replicated metadata holds this node's current API URL: after
// every leader change (and metadata change) it compares, and if needed asks the leader to record
// it, retrying with backoff while the node is a member but the leader is unreachable.
func (s *Store) registerLoop() {
	defer s.wg.Done()
	var logged string
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case <-s.regCh:
		}
		backoff := 50 * time.Millisecond
		for s.fsm.apiAddr(s.cfg.NodeID) != s.cfg.APIAddr {
			if id, _ := s.Leader(); id == "" {
				break // the next leader observation nudges again
			}
			ctx, cancel := context.WithTimeout(s.baseCtx, 5*time.Second)
			err := s.setMeta(ctx, s.cfg.NodeID, s.cfg.APIAddr)
			cancel()
			if err == nil {
				if logged != s.cfg.APIAddr {
					s.log.Info("recorded api address", "api_addr", s.cfg.APIAddr)
					logged = s.cfg.APIAddr
				}
				break
			}
			if errors.Is(err, ErrUnknownMember) || s.baseCtx.Err() != nil {
				break // not (yet) a member: a join records it
			}
			s.log.Debug("recording api address failed; retrying", "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-s.baseCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

func (s *Store) withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.ApplyTimeout)
}

// timeoutFrom turns ctx's deadline into the enqueue timeout raft's calls take.
func timeoutFrom(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d > 0 {
			return d
		}
		return time.Millisecond
	}
	return def
}

// await waits for a raft future until raft answers it, ctx ends, or Close has stopped raft,
// translating raft's errors into this package's sentinels.
//
// Raft does not answer every future it accepted: on shutdown its FSM goroutine returns without
// answering the committed entries still queued to it (hashicorp/raft v1.7, runFSM), and such a
// future's Error never returns. So no wait in raftstore is on a future alone: Close would wait
// behind it (the leader loop's barrier once hung a CI run for 20 minutes), and so would the
// callers of Apply. The goroutine parked on a dropped future stays until the process exits; it
// holds nothing but the future.
func (s *Store) await(ctx context.Context, f raft.Future) error {
	ch := make(chan error, 1)
	go func() { ch <- f.Error() }()
	select {
	case err := <-ch:
		return translate(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	case <-s.raftDone:
	}
	// Raft has stopped: it has answered whatever it was going to (the answer may still be on
	// its way to ch, in which case unknown is the honest outcome too).
	select {
	case err := <-ch:
		return translate(err)
	default:
		return fmt.Errorf("%w: %w: raft stopped without answering", ErrClosed, ErrOutcomeUnknown)
	}
}

func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		// Rejected before the entry entered the log.
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w: %w", ErrClosed, ErrOutcomeUnknown, err)
	default:
		return err
	}
}
