package pinboard

import (
	"context"
	"sync/atomic"
	"time"
)

// Self is this node as its replica of the directory shows it: its worker
// (nil on a node without hosts) and whether the replica has caught up with
// the leader since the process started. The front door routes by it and
// the API reports it (/readyz), so both hold the one Self the agent makes.
type Self struct {
	dir    *Directory
	worker *Worker
	// caught latches CaughtUp once it first holds.
	caught atomic.Bool
}

// NewSelf is this node's Self over dir, with worker (nil without hosts).
func NewSelf(dir *Directory, worker *Worker) *Self { return &Self{dir: dir, worker: worker} }

// Worker is this node's worker, nil on a node without hosts.
func (s *Self) Worker() *Worker { return s.worker }

// HostsInstances: this node has a worker.
func (s *Self) HostsInstances() bool { return s.worker != nil }

// ID is this node's worker's client id ("" without hosts, or before its
// first registration).
func (s *Self) ID() string {
	if s.worker == nil {
		return ""
	}
	return s.worker.ClientID()
}

// ReplicaHasSession: the replica has applied this worker's current session
// (true without a worker). The session was granted by the leader after this
// process started, so a replica holding it holds everything committed
// before it. One older than it (a re-registration after a partition, not
// applied here yet) may still show as ours an id the re-registration found
// placed elsewhere meanwhile (its duplicates), under the old generation.
func (s *Self) ReplicaHasSession() bool {
	if s.worker == nil {
		return true
	}
	sid := s.worker.SessionID()
	wk, ok := s.dir.Machine().Worker(s.ID())
	return sid != "" && ok && wk.SessionID == sid
}

// CaughtUp: this node's replica has caught up with the leader at least once
// since the process started (ReplicaHasSession first held). Until then it
// shows the directory as of the snapshot and log on disk: workers whose
// leases lapsed long ago, none of those that joined since, so an absent
// worker or namespace is no answer to give a client. A node without hosts
// has no session to measure with and counts as caught up.
func (s *Self) CaughtUp() bool {
	if s.caught.Load() {
		return true
	}
	if !s.ReplicaHasSession() {
		return false
	}
	s.caught.Store(true)
	return true
}

// AwaitCaughtUp waits (up to wait, or ctx) until CaughtUp holds, and
// reports whether it does.
func (s *Self) AwaitCaughtUp(ctx context.Context, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for !s.CaughtUp() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
