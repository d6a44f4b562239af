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
	// mu's write side is held while a preamble commits; its read side while a command is
	// handed to raft, so none enters a term's log before that term's preamble.
	mu   sync.RWMutex
	fn   LeaderPreamble
	term uint64 // the term whose preamble committed; 0 before any
	// former is the last leader observed other than this node (observeLoop); Store.mu
	// guards it.
	former string
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
func (s *Store) applyUser(ctx context.Context, cmd []byte) ([]byte, error) {
	for {
		s.pre.mu.RLock()
		if s.pre.fn == nil || s.pre.term == s.raft.CurrentTerm() {
			f := s.raft.Apply(encodeUser(cmd), timeoutFrom(ctx, s.cfg.ApplyTimeout))
			s.pre.mu.RUnlock()
			if err := s.await(ctx, f); err != nil {
				return nil, fmt.Errorf("raftstore: apply: %w", err)
			}
			res, _ := f.Response().([]byte)
			return res, nil
		}
		s.pre.mu.RUnlock()
		if err := s.commitPreamble(ctx); err != nil {
			// cmd itself was not started: the caller may try again (with the next leader).
			return nil, fmt.Errorf("raftstore: apply: %w: the term's preamble did not commit: %w", ErrNotLeader, err)
		}
	}
}

// commitPreamble commits the preamble of the current term unless it already did.
func (s *Store) commitPreamble(ctx context.Context) error {
	s.pre.mu.Lock()
	defer s.pre.mu.Unlock()
	term := s.raft.CurrentTerm()
	if s.pre.fn == nil || s.pre.term == term {
		return nil
	}
	if s.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	s.mu.Lock()
	former := s.pre.former
	s.mu.Unlock()
	f := s.raft.Apply(encodeUser(s.pre.fn(former)), timeoutFrom(ctx, s.cfg.ApplyTimeout))
	if err := s.await(ctx, f); err != nil {
		return err
	}
	// Had leadership changed since term was read, the entry went into a later term, whose
	// first command then finds its preamble missing and commits another: a repeat the
	// preamble must tolerate, and far rarer than an election.
	s.pre.term = term
	s.log.Debug("leader preamble committed", "term", term, "former_leader", former, "index", f.Index())
	return nil
}
