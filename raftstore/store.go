package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/clusterport"
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
	rpc       *rpcServer
	ca        *clusterport.Authority // this node's part in the cluster's own CA (with or without TLS)
	raftUp    chan struct{}          // closed once s.raft is set
	advertise string
	existing  bool
	fwd       *forwarder

	lead    *leadership
	members *membership

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

	// A storage fault: set once, by the first failed log or stable store write.
	fault     atomic.Pointer[error]
	fatalCh   chan error
	faultOnce sync.Once
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
		s.lead.notifyChange()
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
	err := s.fwd.onLeader(ctx, "apply",
		func(ctx context.Context) (err error) {
			res, err = s.pre.applyUser(ctx, cmd)
			return err
		},
		func(ctx context.Context, api string) (err error) {
			res, err = s.fwd.call(ctx, api, "apply", cmd, true)
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
	ctx, cancel := withDefault(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	res, err := s.pre.applyUser(ctx, cmd)
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
func (rs *rpcServer) applyForwarded(ctx context.Context, cmd []byte) ([]byte, error) {
	if fn := rs.s.forwarded.Load(); fn != nil {
		var res []byte
		err := rs.localOnly(func() (err error) {
			res, err = (*fn)(ctx, cmd)
			return err
		})
		return res, err
	}
	return rs.s.ApplyLocal(ctx, cmd)
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
		changed := s.lead.changes()
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
			if err := s.members.transferLeadership(tctx); err != nil && !errors.Is(err, ErrLastVoter) {
				s.log.Warn("leadership transfer before shutdown failed", "err", err)
			}
			cancel()
		}
		// After the hand-over no follower forwards here; the peers' requests under way get
		// their answers before raft stops.
		if s.cfg.Cluster != nil {
			s.cfg.Cluster.StopHTTP(ctx, graceful)
		}
		s.baseCancel()
		s.lead.notifyChange()
		s.raft.DeregisterObserver(s.lead.observer)
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
		if s.fwd.closeClient != nil {
			s.fwd.closeClient()
		}
		if s.cfg.Cluster != nil {
			s.cfg.Cluster.CloseClients()
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

// applyLocal proposes data on this node, which must be the leader.
func (s *Store) applyLocal(ctx context.Context, data []byte) ([]byte, error) {
	f := s.raft.Apply(data, timeoutFrom(ctx, s.cfg.ApplyTimeout))
	if err := s.await(ctx, f); err != nil {
		return nil, fmt.Errorf("raftstore: apply: %w", err)
	}
	res, _ := f.Response().([]byte)
	return res, nil
}

// changes returns a channel closed at the next leader or metadata change.
func (ld *leadership) changes() <-chan struct{} {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.changed
}

func (ld *leadership) notifyChange() {
	ld.mu.Lock()
	close(ld.changed)
	ld.changed = make(chan struct{})
	ld.mu.Unlock()
}

func (s *Store) metaChanged() {
	s.lead.notifyChange()
	s.members.nudgeRegistrar()
	s.ca.Changed()
}

func (mb *membership) nudgeRegistrar() {
	select {
	case mb.regCh <- struct{}{}:
	default:
	}
}

// observeLoop follows raft's observations: leader changes (wake waiters, re-check this node's
// metadata) and heartbeat failures (Members' last contact).
func (ld *leadership) observeLoop() {
	defer ld.s.wg.Done()
	for {
		select {
		case <-ld.s.baseCtx.Done():
			return
		case o := <-ld.obsCh:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				ld.mu.Lock()
				changed := d.LeaderID != ld.lastLeader
				ld.lastLeader = d.LeaderID
				if d.LeaderID != "" && string(d.LeaderID) != ld.s.cfg.NodeID {
					ld.s.pre.former = string(d.LeaderID)
				}
				ld.mu.Unlock()
				if changed {
					ld.s.log.Info("leader changed", "leader", d.LeaderID, "leader_raft_addr", d.LeaderAddr)
				}
				ld.notifyChange()
				ld.s.members.nudgeRegistrar()
			case raft.FailedHeartbeatObservation:
				// Raft's own lines about it are below INFO (raftLevels): one line
				// when contact is lost, one when it is back.
				ld.mu.Lock()
				_, known := ld.failing[d.PeerID]
				ld.failing[d.PeerID] = d.LastContact
				ld.mu.Unlock()
				if !known {
					ld.s.log.Info("lost contact with a raft peer; retrying", "peer", d.PeerID, "last_contact", d.LastContact)
				}
			case raft.ResumedHeartbeatObservation:
				ld.mu.Lock()
				_, known := ld.failing[d.PeerID]
				delete(ld.failing, d.PeerID)
				ld.mu.Unlock()
				if known {
					ld.s.log.Info("raft peer reachable again", "peer", d.PeerID)
				}
			case raft.PeerObservation:
				if d.Removed {
					ld.mu.Lock()
					delete(ld.failing, d.Peer.ID)
					ld.mu.Unlock()
				}
			}
		}
	}
}

// withDefault is ctx, bounded by d if it has no deadline.
func withDefault(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
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
