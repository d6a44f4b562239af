// Package pinboard is pinnedd's control plane as one node sees it: the
// placement directory (a deterministic state machine in package directory,
// driven through an Applier: the Raft log, also on a one-node --dev
// cluster), this node's worker and its lease, and the HTTP front door that
// routes /<namespace>/<id>/<rest> to the instance's owner.
//
// It decides where an id lives; it never runs instance code (package
// supervisor does) and never touches Raft directly (package raftstore does,
// behind the Applier interface).
//
// Three parts run only on the Raft leader, started by the agent through
// raftstore's RunAsLeader: Housekeeping (the cluster secret, directory GC),
// MarkedScanner (wakes instances with marked durable work whose owner is
// gone) and FenceCollector (drops the state store's fences of ids that
// never wrote; on a node with a store of its own, every node runs it).
// Before them, and before any other command of its term, a new leader
// commits LeasePreamble (raftstore's SetLeaderPreamble), renewing the
// leases no leader could renew during the election.
//
// Requests take one of two paths through the front door. net/http's
// handlers decide everything (placement, claims, activation, refusals,
// attestation failures). A connection that carried a plain request to a
// forwarded or local id then moves to the kept-alive loop (routeLoop,
// internal/relay.Conns), which repeats only the decided case without
// net/http: forward to a live remote owner, or carry it to an instance
// live here (supervisor.Open); anything else goes back, unread. DESIGN.md
// describes the front door's parts (router, resolver, owner side,
// forwarder, api) and the rules each keeps.
package pinboard
