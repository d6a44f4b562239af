package raftstore

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// RunAsLeader registers leader-only work. Every time this node becomes leader, once a Barrier
// has confirmed that its state machine has applied everything earlier leaders committed, fn is
// started in its own goroutine with a context that is cancelled when leadership is lost or the
// store closes. If the node is already leading, fn starts at once. fn must return soon after
// its context is cancelled: the next term's work waits for it. fn runs once per term; it is not
// restarted if it returns early.
func (s *Store) RunAsLeader(name string, fn func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lf := leaderFn{name: name, fn: fn}
	s.leaderFns = append(s.leaderFns, lf)
	if s.leaderCtx != nil {
		s.startLeaderFnLocked(lf)
	}
}

func (s *Store) startLeaderFnLocked(lf leaderFn) {
	ctx, wg := s.leaderCtx, s.leaderRunning
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.log.Debug("leader work started", "work", lf.name)
		lf.fn(ctx)
		s.log.Debug("leader work stopped", "work", lf.name)
	}()
}

// leaderLoop is the one consumer of raft's NotifyCh. It starts leader work after a barrier
// when this node gains leadership and stops it (and waits for it) when leadership is lost.
func (s *Store) leaderLoop() {
	defer s.wg.Done()
	var cancel context.CancelFunc
	var running *sync.WaitGroup
	stop := func() {
		if cancel == nil {
			return
		}
		s.mu.Lock()
		s.leaderCtx, s.leaderRunning = nil, nil
		s.mu.Unlock()
		cancel()
		running.Wait()
		cancel, running = nil, nil
	}
	defer stop()
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case leader := <-s.notifyCh:
			if !leader {
				if cancel != nil {
					s.log.Info("lost leadership; leader work stopped")
				}
				stop()
				continue
			}
			if cancel != nil {
				continue // already leading
			}
			if !s.leaderBarrier() {
				continue
			}
			// The term's first command, before leader work judges anything (a failure is
			// retried by the first command applied through this node).
			pctx, pcancel := context.WithTimeout(s.baseCtx, s.cfg.ApplyTimeout)
			if err := s.awaitPreamble(pctx); err != nil && s.baseCtx.Err() == nil {
				s.log.Warn("leader preamble did not commit; the first command will retry it", "err", err)
			}
			pcancel()
			ctx, c := context.WithCancel(s.baseCtx)
			cancel, running = c, &sync.WaitGroup{}
			s.mu.Lock()
			s.leaderCtx, s.leaderRunning = ctx, running
			for _, lf := range s.leaderFns {
				s.startLeaderFnLocked(lf)
			}
			n := len(s.leaderFns)
			s.mu.Unlock()
			s.log.Info("became leader", "leader_work", n, "applied_index", s.raft.AppliedIndex())
		}
	}
}

// leaderBarrier waits until everything committed by earlier terms is applied here. It gives up
// (false) when leadership is lost or the store closes.
func (s *Store) leaderBarrier() bool {
	for {
		err := s.await(s.baseCtx, s.raft.Barrier(s.cfg.ApplyTimeout))
		if err == nil {
			return s.raft.State() == raft.Leader
		}
		if s.baseCtx.Err() != nil || s.raft.State() != raft.Leader {
			return false
		}
		s.log.Warn("leader barrier failed; retrying", "err", err)
		select {
		case <-s.baseCtx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
