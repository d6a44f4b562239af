package raftstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
)

// Membership: joins, removals and leaves (on the leader, forwarded from followers), the
// record of a leave, and this node's own metadata (its API address) in the configuration.

// leftMarker, in the Raft directory, records that this node left the cluster and the members it
// left (leftRecord); a join removes it.
const leftMarker = "left.json"

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
	err = s.await(ctx, s.raft.LeadershipTransfer())
	if err != nil && ctx.Err() == nil {
		// The first RPC may go out on a pooled connection to a peer that
		// restarted since (EOF); the transport drops it, and a second
		// try dials afresh.
		s.log.Info("leadership transfer failed; trying once more", "err", err)
		err = s.await(ctx, s.raft.LeadershipTransfer())
	}
	if err != nil {
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
