package raftstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
// membership changes the group's members on the leader (joins, removals, leadership handed
// over before a leave), keeps the record of a leave beside the log, and records each member's
// API address (registerLoop).
type membership struct {
	s *Store
	// memberMu makes the leader's membership changes one at a time, so a join's fence check and
	// its add never interleave with a removal's fence and its remove.
	memberMu sync.Mutex
	regCh    chan struct{} // nudges registerLoop
}

func (s *Store) Join(ctx context.Context, nodeID, raftAddr, apiAddr string) error {
	if nodeID == "" || raftAddr == "" {
		return fmt.Errorf("%w: join needs a node id and a raft address", ErrBadRequest)
	}
	return joinFenced(s.fsm.membershipFence(), func(fence uint64) error {
		return s.members.join(ctx, joinRequest{ID: nodeID, RaftAddr: raftAddr, APIAddr: apiAddr, Fence: fence})
	})
}

// join runs req on the leader as it is, fence included.
func (mb *membership) join(ctx context.Context, req joinRequest) error {
	return mb.s.fwd.onLeader(ctx, "join",
		func(ctx context.Context) error { return mb.joinLocal(ctx, req) },
		func(ctx context.Context, api string) error {
			return mb.s.fwd.callJSON(ctx, api, "join", req, nil, true)
		})
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
	return s.members.remove(ctx, nodeID)
}

func (mb *membership) remove(ctx context.Context, nodeID string) error {
	req := removeRequest{ID: nodeID}
	return mb.s.fwd.onLeader(ctx, "remove",
		func(ctx context.Context) error { return mb.removeLocal(ctx, req.ID) },
		func(ctx context.Context, api string) error {
			return mb.s.fwd.callJSON(ctx, api, "remove", req, nil, true)
		})
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
	ctx, cancel := withDefault(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	if s.IsLeader() {
		if err := s.members.transferLeadership(ctx); err != nil {
			return fmt.Errorf("raftstore: leave: %w", err)
		}
	}
	// The members' addresses, for the record below: a restarted node that has no leader has
	// not replayed the entries that carry them.
	members, _ := s.Members(ctx)
	// Already gone (a retried leave) is what leave asked for.
	if err := s.members.remove(ctx, s.cfg.NodeID); err != nil && !errors.Is(err, ErrUnknownMember) {
		return fmt.Errorf("raftstore: leave: %w", err)
	}
	// The configuration without this node may never reach its own log (the leader stops
	// replicating to it), so the leave is recorded beside the log for a restart to find.
	if err := s.members.writeLeftMarker(members); err != nil {
		s.log.Warn("could not record the leave in the data dir; a restart will not know it left", "err", err)
	}
	s.log.Info("left the cluster")
	return nil
}

type leftRecord struct {
	At      time.Time `json:"at"`
	Members []Member  `json:"members"` // the others, as they were
}

func (mb *membership) leftPath() string { return filepath.Join(mb.s.cfg.DataDir, "raft", leftMarker) }

func (mb *membership) writeLeftMarker(members []Member) error {
	rec := leftRecord{At: time.Now().UTC()}
	for _, m := range members {
		if m.ID != mb.s.cfg.NodeID {
			rec.Members = append(rec.Members, Member{ID: m.ID, RaftAddr: m.RaftAddr, APIAddr: m.APIAddr, Voter: m.Voter})
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(mb.leftPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
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
func (mb *membership) readLeftMarker() (leftRecord, bool) {
	b, err := os.ReadFile(mb.leftPath())
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
	rec, left := s.members.readLeftMarker()
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
func (mb *membership) transferLeadership(ctx context.Context) error {
	servers, err := mb.configuration(ctx)
	if err != nil {
		return err
	}
	others := 0
	for _, srv := range servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != mb.s.cfg.NodeID {
			others++
		}
	}
	if others == 0 {
		return ErrLastVoter
	}
	mb.s.log.Info("transferring leadership")
	err = mb.s.await(ctx, mb.s.raft.LeadershipTransfer())
	if err != nil && ctx.Err() == nil {
		// The first RPC may go out on a pooled connection to a peer that
		// restarted since (EOF); the transport drops it, and a second
		// try dials afresh.
		mb.s.log.Info("leadership transfer failed; trying once more", "err", err)
		err = mb.s.await(ctx, mb.s.raft.LeadershipTransfer())
	}
	if err != nil {
		return fmt.Errorf("leadership transfer: %w", err)
	}
	return nil
}

// Members lists the Raft configuration as this node sees it, with member metadata.
func (s *Store) Members(ctx context.Context) ([]Member, error) {
	servers, err := s.members.configuration(ctx)
	if err != nil {
		return nil, err
	}
	meta := s.fsm.metaCopy()
	_, leaderID := s.raft.LeaderWithID()
	leading := s.IsLeader()
	now := time.Now()
	s.lead.mu.Lock()
	failing := make(map[raft.ServerID]time.Time, len(s.lead.failing))
	for k, v := range s.lead.failing {
		failing[k] = v
	}
	s.lead.mu.Unlock()
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

func (mb *membership) configuration(ctx context.Context) ([]raft.Server, error) {
	f := mb.s.raft.GetConfiguration()
	if err := mb.s.await(ctx, f); err != nil {
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
func (mb *membership) joinLocal(ctx context.Context, req joinRequest) error {
	mb.memberMu.Lock()
	defer mb.memberMu.Unlock()
	mb.s.lead.mu.Lock()
	ready := mb.s.lead.leaderCtx != nil
	mb.s.lead.mu.Unlock()
	if !ready {
		return fmt.Errorf("raftstore: join: %w: this new leader has not applied its predecessors' entries yet", ErrNotLeader)
	}
	if cur := mb.s.fsm.membershipFence(); req.Fence < cur {
		return &staleJoinError{current: cur}
	}
	servers, err := mb.configuration(ctx)
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
			if srv.Suffrage != raft.Voter && voters < mb.s.cfg.MaxVoters {
				if err := mb.s.await(ctx, mb.s.raft.AddVoter(id, addr, 0, timeoutFrom(ctx, mb.s.cfg.ApplyTimeout))); err != nil {
					return fmt.Errorf("raftstore: promoting %s: %w", id, err)
				}
				mb.s.log.Info("promoted member to voter", "member", id)
			}
			return mb.setMetaLocal(ctx, req.ID, req.APIAddr)
		case srv.ID == id || srv.Address == addr:
			if string(srv.ID) == mb.s.cfg.NodeID {
				return fmt.Errorf("%w: join of %s at %s conflicts with the leader %s at %s",
					ErrBadRequest, id, addr, srv.ID, srv.Address)
			}
			mb.s.log.Info("removing stale member before join", "member", srv.ID, "raft_addr", srv.Address,
				"joining", id, "joining_raft_addr", addr)
			if err := mb.removeServer(ctx, srv.ID); err != nil {
				return fmt.Errorf("raftstore: removing stale member %s: %w", srv.ID, err)
			}
			if srv.Suffrage == raft.Voter {
				voters--
			}
			if srv.ID != id {
				if _, err := mb.s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaDelete, ID: string(srv.ID)})); err != nil {
					return err
				}
			}
		}
	}
	var f raft.IndexFuture
	voter := voters < mb.s.cfg.MaxVoters
	if voter {
		f = mb.s.raft.AddVoter(id, addr, 0, timeoutFrom(ctx, mb.s.cfg.ApplyTimeout))
	} else {
		f = mb.s.raft.AddNonvoter(id, addr, 0, timeoutFrom(ctx, mb.s.cfg.ApplyTimeout))
	}
	if err := mb.s.await(ctx, f); err != nil {
		return fmt.Errorf("raftstore: adding %s: %w", id, err)
	}
	mb.s.log.Info("member joined", "member", id, "raft_addr", addr, "api_addr", req.APIAddr, "voter", voter)
	return mb.setMetaLocal(ctx, req.ID, req.APIAddr)
}

func (mb *membership) removeLocal(ctx context.Context, nodeID string) error {
	mb.memberMu.Lock()
	defer mb.memberMu.Unlock()
	servers, err := mb.configuration(ctx)
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
		if mb.s.fsm.apiAddr(nodeID) == "" {
			return nil
		}
		_, err := mb.s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaDelete, ID: nodeID}))
		return err
	}
	if found == nil {
		if mb.s.fsm.apiAddr(nodeID) == "" {
			return fmt.Errorf("%w: no member named %q (already removed, or never a member: see `pinnedd members`)", ErrUnknownMember, nodeID)
		}
		return delMeta()
	}
	if found.Suffrage == raft.Voter && voters == 1 {
		return fmt.Errorf("raftstore: removing %s: %w", nodeID, ErrLastVoter)
	}
	self := nodeID == mb.s.cfg.NodeID
	if self {
		// The leader removing itself steps down once the change commits: record the metadata
		// removal while it still can.
		if err := delMeta(); err != nil {
			return err
		}
	}
	if err := mb.removeServer(ctx, found.ID); err != nil {
		return fmt.Errorf("raftstore: removing %s: %w", nodeID, err)
	}
	mb.s.log.Info("member removed", "member", nodeID)
	mb.s.lead.mu.Lock()
	delete(mb.s.lead.failing, found.ID)
	mb.s.lead.mu.Unlock()
	if self {
		return nil
	}
	return delMeta()
}

// removeServer removes id from the configuration on the leader, every removal's one way: it
// first commits a fence entry, whose index every later join must name (joinLocal), so no join
// made before this removal can add the node back.
func (mb *membership) removeServer(ctx context.Context, id raft.ServerID) error {
	if _, err := mb.s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaFence, ID: string(id)})); err != nil {
		return err
	}
	return mb.s.await(ctx, mb.s.raft.RemoveServer(id, 0, timeoutFrom(ctx, mb.s.cfg.ApplyTimeout)))
}

// setMetaLocal records a member's API URL on the leader, if the member exists and the value
// changed.
func (mb *membership) setMetaLocal(ctx context.Context, nodeID, apiAddr string) error {
	if apiAddr == "" || mb.s.fsm.apiAddr(nodeID) == apiAddr {
		return nil
	}
	servers, err := mb.configuration(ctx)
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
	_, err = mb.s.applyLocal(ctx, encodeMeta(metaCommand{Op: metaSet, ID: nodeID, APIAddr: apiAddr}))
	return err
}

func (mb *membership) setMeta(ctx context.Context, nodeID, apiAddr string) error {
	req := metaRequest{ID: nodeID, APIAddr: apiAddr}
	return mb.s.fwd.onLeader(ctx, "record api address",
		func(ctx context.Context) error { return mb.setMetaLocal(ctx, nodeID, apiAddr) },
		func(ctx context.Context, api string) error {
			return mb.s.fwd.callJSON(ctx, api, "meta", req, nil, true)
		})
}

// registerLoop makes sure the replicated metadata holds this node's current API URL: after
// every leader change (and metadata change) it compares, and if needed asks the leader to record
// it, retrying with backoff while the node is a member but the leader is unreachable.
func (mb *membership) registerLoop() {
	defer mb.s.wg.Done()
	var logged string
	for {
		select {
		case <-mb.s.baseCtx.Done():
			return
		case <-mb.regCh:
		}
		backoff := 50 * time.Millisecond
		for mb.s.fsm.apiAddr(mb.s.cfg.NodeID) != mb.s.cfg.APIAddr {
			if id, _ := mb.s.Leader(); id == "" {
				break // the next leader observation nudges again
			}
			ctx, cancel := context.WithTimeout(mb.s.baseCtx, 5*time.Second)
			err := mb.setMeta(ctx, mb.s.cfg.NodeID, mb.s.cfg.APIAddr)
			cancel()
			if err == nil {
				if logged != mb.s.cfg.APIAddr {
					mb.s.log.Info("recorded api address", "api_addr", mb.s.cfg.APIAddr)
					logged = mb.s.cfg.APIAddr
				}
				break
			}
			if errors.Is(err, ErrUnknownMember) || mb.s.baseCtx.Err() != nil {
				break // not (yet) a member: a join records it
			}
			mb.s.log.Debug("recording api address failed; retrying", "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-mb.s.baseCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}
