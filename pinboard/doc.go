// Package pinboard is pinnedd's control plane as one node sees it: the
// placement directory (a deterministic state machine in package directory,
// driven through an Applier: the Raft log, also on a one-node --dev
// cluster), this
// node's worker and its lease, and the HTTP front door that routes
// /<namespace>/<id>/<rest> to the instance's owner.
//
// It decides where an id lives; it never runs instance code (package
// supervisor does) and never touches Raft directly (package raftstore does,
// behind the Applier interface).
package pinboard
