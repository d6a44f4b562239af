// Package raftstore runs this node's member of the pinnedd Raft group.
//
// It owns everything between a deterministic [StateMachine] and hashicorp/raft: the on-disk log
// and stable store (raft-wal, or raft-boltdb for data dirs created with it), snapshots, the
// FSM adapter, membership (bootstrap, join, leave, remove, voters and nonvoters), the RPCs
// between nodes and forwarding of writes and membership changes from followers to the leader
// over HTTP (a forwarded write goes to the state machine owner's [ForwardedFunc], and never
// further), and the leader loop that runs leader-only work.
//
// Raft runs over the stream layer it is given: the cluster port (Config.Cluster, package
// clusterport, which also owns this node's identity and the cluster's own CA; raftstore applies
// the CA's log entries to its ledger, attaches the log to it and serves its RPCs), plain TCP, or a
// supplied [raft.StreamLayer].
//
// Two rules keep the deployment token from undoing membership (see "Mutual TLS" in
// clusterport/DESIGN.md):
//
//   - A certificate is signed only for an id that is not a member of the leader's latest
//     configuration, or for a member asking for itself over its own certificate on the cluster
//     port (a renewal). An issue or a refusal (403) is logged at WARN with the requester; a
//     request a member passed on is logged at INFO.
//   - Every removal first commits a fence entry, whose log index is the membership fence. A
//     join names the fence it was made against (its join proof covers it), and the leader,
//     after its term's barrier and one membership change at a time, refuses a lower one
//     (ErrStaleJoin, carrying the fence for the next attempt). A join captured before a
//     removal therefore never undoes it; the node itself joins again with a new proof.
//
// It knows nothing about placements, leases or workers: commands and snapshots are opaque bytes
// to it. It must never interpret a user command, never retry a command whose outcome is
// unknown, and never bootstrap a node that already has Raft state.
//
// See DESIGN.md in this directory for the rules and the reasoning behind the settings.
package raftstore
