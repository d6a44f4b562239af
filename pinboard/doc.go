// Package pinboard is pinnedd's control plane as one node sees it: the
// placement directory (a deterministic state machine in package directory,
// driven through an Applier: the Raft log, also on a one-node --dev
// cluster), the registry of workers and its HTTP API, this node's worker
// and its lease (Self), placement policy, drains, the tokens that
// authorise every call, and the attestation keys owners check (OwnerGate).
//
// It decides where an id lives; it never carries a request to an instance
// (package frontdoor does, and mounts this package's API on its mux),
// never runs instance code (package supervisor does) and never touches
// Raft directly (package raftstore does, behind the Applier interface).
//
// Three parts run only on the Raft leader, started by the agent through
// raftstore's RunAsLeader: Housekeeping (the cluster secret, directory GC),
// MarkedScanner (wakes instances with marked durable work whose owner is
// gone) and FenceCollector (drops the state store's fences of ids that
// never wrote; on a node with a store of its own, every node runs it).
// Before them, and before any other command of its term, a new leader
// commits LeasePreamble (raftstore's SetLeaderPreamble), renewing the
// leases no leader could renew during the election.
package pinboard
