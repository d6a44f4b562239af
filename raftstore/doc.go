// Package raftstore runs this node's member of the pinnedd Raft group.
//
// It owns everything between a deterministic [StateMachine] and hashicorp/raft: the on-disk log
// and stable store (raft-wal, or raft-boltdb for data dirs created with it), snapshots, the transport (mutual TLS under the cluster CA, plain
// TCP, or a supplied [raft.StreamLayer]) with the cluster CA and certificates it needs, membership (bootstrap, join, leave,
// remove, voters and nonvoters), forwarding of writes and membership changes from followers to
// the leader over HTTP (a forwarded write goes to the state machine owner's [ForwardedFunc], and
// never further), and the leader loop that runs leader-only work.
//
// It knows nothing about placements, leases or workers: commands and snapshots are opaque bytes
// to it. It must never interpret a user command, never retry a command whose outcome is
// unknown, and never bootstrap a node that already has Raft state.
//
// See DESIGN.md in this directory for the rules and the reasoning behind the settings.
package raftstore
