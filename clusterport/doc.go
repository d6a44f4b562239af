// Package clusterport owns the cluster port: one TCP listener under the
// cluster's mutual TLS that carries both Raft's RPCs and node-to-node HTTP,
// told apart by ALPN (or, from a peer that sets none, by the first byte).
// It admits handshakes by source address (members' addresses get a pool
// of their own, strangers a small shared one), checks every peer's
// certificate and membership before a byte reaches Raft, hands Raft its
// connections (Port is a raft.StreamLayer) and serves the HTTP ones
// (Serve), and closes what a removed node or a retired CA left open
// (Sweep, SweepUntrusted). It also keeps this node's identity on disk
// (Keys, LoadIdentity: the trusted bundle, the node's certificate and its
// key sealed at rest, and the CA a bootstrap node creates), and gets a
// joining node its certificate from a member (FetchIdentity).
//
// Whom the cluster trusts is not decided here: package raftstore runs the
// cluster's CA in the Raft log (issuing, rotation, retirement), and
// membership comes from its Raft configuration (Options).
package clusterport
