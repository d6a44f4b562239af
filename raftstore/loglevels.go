package raftstore

import (
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/pinnedd/pinnedd/internal/hclogslog"
)

// raftLevels is the level each of hashicorp/raft's routine WARN and ERROR lines is logged at.
// Raft logs a peer that restarts (a rolling restart, a leave), a follower catching up (a join)
// and its own transport's shutdown as WARN or ERROR; none of them is a fault, and each is
// retried by raft until it passes. They become hclog INFO or DEBUG (both slog DEBUG: see
// hclogslog): this node logs a peer's loss and return of contact once each at INFO itself
// (observeLoop), and a peer out of contact for long is what pinned_raft_peer_last_contact_seconds
// and the alert rules in monitoring/ are for. What raft logs about its storage, snapshots,
// quorum and configuration stays WARN or ERROR.
var raftLevels = hclogslog.Levels{
	// A peer that is down or restarting: replication and heartbeats retry with backoff.
	"failed to appendEntries to":              hclogslog.Always(hclog.Info),
	"failed to heartbeat to":                  hclogslog.Always(hclog.Info),
	"failed to pipeline appendEntries":        hclogslog.Always(hclog.Info),
	"failed to start pipeline replication to": hclogslog.Always(hclog.Info),
	"failed to contact":                       hclogslog.Always(hclog.Info),
	"failed to make requestVote RPC":          hclogslog.Always(hclog.Info),
	// An inbound connection that broke mid-command: its peer went away (only members pass the
	// TLS handshake), or this node's transport is shutting down.
	"failed to decode incoming command": hclogslog.Always(hclog.Info),
	"failed to flush response":          hclogslog.Always(hclog.Info),
	// A follower behind the leader (just joined, or back from a restart): the leader walks its
	// next index back until the logs match, the follower drops what a new leader overrode.
	"appendEntries rejected, sending older logs": hclogslog.Always(hclog.Debug),
	"failed to get previous log":                 hclogslog.Always(hclog.Debug),
	"previous log term mis-match":                hclogslog.Always(hclog.Info),
	"clearing log suffix":                        hclogslog.Always(hclog.Info),
	// Leadership moving on: a transfer (every graceful stop of a leader), or a restarted node
	// asking for votes before the leader reached it (the leader's heartbeats to it were in
	// backoff while it was down), with a log behind the others'.
	"peer has newer term, stopping replication":                  hclogslog.Always(hclog.Info),
	"new leader elected, stepping down":                          hclogslog.Always(hclog.Info),
	"rejecting vote request since we have a leader":              hclogslog.Always(hclog.Info),
	"rejecting pre-vote request since we have a leader":          hclogslog.Always(hclog.Info),
	"rejecting vote request since our last term is greater":      hclogslog.Always(hclog.Info),
	"rejecting vote request since our last index is greater":     hclogslog.Always(hclog.Info),
	"rejecting pre-vote request since our last term is greater":  hclogslog.Always(hclog.Info),
	"rejecting pre-vote request since our last index is greater": hclogslog.Always(hclog.Info),
	// A node waiting to be joined (no configuration yet) or a nonvoter: it never elects.
	"no known peers, aborting election": hclogslog.Always(hclog.Info),
	"heartbeat timeout reached, not part of a stable configuration or a non-voter, not triggering a leader election": hclogslog.Always(hclog.Info),
	// A node that never had a leader (a cluster's first election) is not missing one; losing
	// a leader stays a WARN.
	"heartbeat timeout reached, starting election": func(args []any) hclog.Level {
		if id := hclogslog.Arg(args, "last-leader-id"); id == nil || fmt.Sprint(id) == "" {
			return hclog.Info
		}
		return hclog.Warn
	},
}
