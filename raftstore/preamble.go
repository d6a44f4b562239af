package raftstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// LeaderPreamble returns the command a new leader commits before any other command of its
// term. formerLeader is the node id of the last leader this node saw other than itself, ""
// if none.
type LeaderPreamble func(formerLeader string) []byte

// preamble holds the state machine owner's LeaderPreamble and which term has committed it.
type preamble struct {
	s *Store
	// mu guards fn, term and running, and is held while a command is handed to raft (an
	// enqueue), so none enters a term's log before that term's preamble: read-locked by
	// commands (they enqueue side by side), write-locked by the preamble's own. It is never
	// held while a commit is awaited: a command waiting for its term's preamble waits on
	// running, within its own context.
	mu      sync.RWMutex
	fn      LeaderPreamble
	term    uint64 // the term whose preamble committed; 0 before any
	running *preambleRun
	// former is the last leader observed other than this node (observeLoop); leadership.mu
	// guards it.
	former string
}

// preambleRun is a preamble commit under way: done closes when it ends, with err.
type preambleRun struct {
	done chan struct{}
	err  error
}

// SetLeaderPreamble makes every new leader commit fn's command before any other command of its
// term: at once after its barrier, and before the first command anyone applies through it, so
// the state machine can settle what the leaderless gap left behind (the directory renews the
// leases no leader could) before any command is judged against it. Set it before Apply is
// first called; nil removes it.
func (s *Store) SetLeaderPreamble(fn LeaderPreamble) {
	s.pre.mu.Lock()
	s.pre.fn = fn
	s.pre.term = 0
	s.pre.mu.Unlock()
}

// applyUser commits a state machine command on this node, the leader, after its term's
// preamble.
func (p *preamble) applyUser(ctx context.Context, cmd []byte) ([]byte, error) {
	for {
		p.mu.RLock()
		if p.fn == nil || p.term == p.s.raft.CurrentTerm() {
			f := p.s.raft.Apply(encodeUser(cmd), timeoutFrom(ctx, p.s.cfg.ApplyTimeout))
			p.mu.RUnlock()
			if err := p.s.await(ctx, f); err != nil {
				return nil, fmt.Errorf("raftstore: apply: %w", err)
			}
			res, _ := f.Response().([]byte)
			return res, nil
		}
		p.mu.RUnlock()
		if err := p.awaitPreamble(ctx); err != nil {
			// cmd itself was not started: the caller may try again (with the next leader).
			return nil, fmt.Errorf("raftstore: apply: %w: the term's preamble did not commit: %w", ErrNotLeader, err)
		}
	}
}

// awaitPreamble waits, within ctx, until the current term's preamble committed, starting its
// commit unless one is under way.
func (p *preamble) awaitPreamble(ctx context.Context) error {
	p.mu.Lock()
	if p.fn == nil || p.term == p.s.raft.CurrentTerm() {
		p.mu.Unlock()
		return nil
	}
	run := p.running
	if run == nil {
		run = &preambleRun{done: make(chan struct{})}
		p.running = run
		go p.commitPreamble(run)
	}
	p.mu.Unlock()
	select {
	case <-run.done:
		return run.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// commitPreamble commits the preamble of the current term unless it already did, and ends
// run. It runs on its own (bounded by ApplyTimeout and the store's life), so a caller that
// gives up waiting leaves it to the next one.
func (p *preamble) commitPreamble(run *preambleRun) {
	run.err = p.commitPreambleOnce()
	p.mu.Lock()
	p.running = nil
	p.mu.Unlock()
	close(run.done)
}

func (p *preamble) commitPreambleOnce() error {
	p.mu.Lock()
	term := p.s.raft.CurrentTerm()
	if p.fn == nil || p.term == term {
		p.mu.Unlock()
		return nil
	}
	if p.s.raft.State() != raft.Leader {
		p.mu.Unlock()
		return ErrNotLeader
	}
	p.s.lead.mu.Lock()
	former := p.former
	p.s.lead.mu.Unlock()
	f := p.s.raft.Apply(encodeUser(p.fn(former)), p.s.cfg.ApplyTimeout)
	p.mu.Unlock()
	if err := p.s.await(p.s.baseCtx, f); err != nil {
		return err
	}
	// Had leadership changed since term was read, the entry went into a later term, whose
	// first command then finds its preamble missing and commits another: a repeat the
	// preamble must tolerate, and far rarer than an election.
	p.mu.Lock()
	p.term = max(p.term, term)
	p.mu.Unlock()
	p.s.log.Debug("leader preamble committed", "term", term, "former_leader", former, "index", f.Index())
	return nil
}
