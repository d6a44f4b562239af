package raftstore

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// leadership follows who leads: it runs leader-only work while this node leads (the one
// consumer of raft's NotifyCh), follows raft's observations (leader changes, peers' heartbeats)
// and wakes whoever waits for a change.
type leadership struct {
	s        *Store
	notifyCh chan bool
	obsCh    chan raft.Observation
	observer *raft.Observer

	mu            sync.Mutex
	changed       chan struct{} // closed and replaced on every leader or metadata change
	leaderFns     []leaderFn
	leaderCtx     context.Context // non-nil while leading (after the barrier)
	leaderRunning *sync.WaitGroup
	failing       map[raft.ServerID]time.Time // peers failing heartbeats, since when
	lastLeader    raft.ServerID
}

type leaderFn struct {
	name string
	fn   func(ctx context.Context)
}

func newLeadership(s *Store) *leadership {
	return &leadership{
		s: s, notifyCh: make(chan bool, 16), obsCh: make(chan raft.Observation, 64),
		changed: make(chan struct{}), failing: map[raft.ServerID]time.Time{},
	}
}

// RunAsLeader registers leader-only work. Every time this node becomes leader, once a Barrier
// has confirmed that its state machine has applied everything earlier leaders committed, fn is
// started in its own goroutine with a context that is cancelled when leadership is lost or the
// store closes. If the node is already leading, fn starts at once. fn must return soon after
// its context is cancelled: the next term's work waits for it. fn runs once per term; it is not
// restarted if it returns early.
func (s *Store) RunAsLeader(name string, fn func(ctx context.Context)) {
	s.lead.add(leaderFn{name: name, fn: fn})
}

func (ld *leadership) add(lf leaderFn) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.leaderFns = append(ld.leaderFns, lf)
	if ld.leaderCtx != nil {
		ld.startLeaderFnLocked(lf)
	}
}

func (ld *leadership) startLeaderFnLocked(lf leaderFn) {
	ctx, wg := ld.leaderCtx, ld.leaderRunning
	wg.Add(1)
	go func() {
		defer wg.Done()
		ld.s.log.Debug("leader work started", "work", lf.name)
		lf.fn(ctx)
		ld.s.log.Debug("leader work stopped", "work", lf.name)
	}()
}

// leaderLoop is the one consumer of raft's NotifyCh. It starts leader work after a barrier
// when this node gains leadership and stops it (and waits for it) when leadership is lost.
func (ld *leadership) leaderLoop() {
	defer ld.s.wg.Done()
	var cancel context.CancelFunc
	var running *sync.WaitGroup
	stop := func() {
		if cancel == nil {
			return
		}
		ld.mu.Lock()
		ld.leaderCtx, ld.leaderRunning = nil, nil
		ld.mu.Unlock()
		cancel()
		running.Wait()
		cancel, running = nil, nil
	}
	defer stop()
	for {
		select {
		case <-ld.s.baseCtx.Done():
			return
		case leader := <-ld.notifyCh:
			if !leader {
				if cancel != nil {
					ld.s.log.Info("lost leadership; leader work stopped")
				}
				stop()
				continue
			}
			if cancel != nil {
				continue // already leading
			}
			if !ld.leaderBarrier() {
				continue
			}
			// The term's first command, before leader work judges anything (a failure is
			// retried by the first command applied through this node).
			pctx, pcancel := context.WithTimeout(ld.s.baseCtx, ld.s.cfg.ApplyTimeout)
			if err := ld.s.pre.awaitPreamble(pctx); err != nil && ld.s.baseCtx.Err() == nil {
				ld.s.log.Warn("leader preamble did not commit; the first command will retry it", "err", err)
			}
			pcancel()
			ctx, c := context.WithCancel(ld.s.baseCtx)
			cancel, running = c, &sync.WaitGroup{}
			ld.mu.Lock()
			ld.leaderCtx, ld.leaderRunning = ctx, running
			for _, lf := range ld.leaderFns {
				ld.startLeaderFnLocked(lf)
			}
			n := len(ld.leaderFns)
			ld.mu.Unlock()
			ld.s.log.Info("became leader", "leader_work", n, "applied_index", ld.s.raft.AppliedIndex())
		}
	}
}

// leaderBarrier waits until everything committed by earlier terms is applied here. It gives up
// (false) when leadership is lost or the store closes.
func (ld *leadership) leaderBarrier() bool {
	for {
		err := ld.s.await(ld.s.baseCtx, ld.s.raft.Barrier(ld.s.cfg.ApplyTimeout))
		if err == nil {
			return ld.s.raft.State() == raft.Leader
		}
		if ld.s.baseCtx.Err() != nil || ld.s.raft.State() != raft.Leader {
			return false
		}
		ld.s.log.Warn("leader barrier failed; retrying", "err", err)
		select {
		case <-ld.s.baseCtx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
