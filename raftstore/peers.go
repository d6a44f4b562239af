package raftstore

import (
	"context"
	"net/http"
)

// clientFor is the client and bearer token for a call to another node: over mutual TLS to its
// cluster port, with no token (the certificate speaks for this node), or to its public port
// with the deployment token.
func (s *Store) clientFor() (*http.Client, string) {
	if s.peerClient != nil {
		return s.peerClient, ""
	}
	return s.client, s.cfg.Token
}

// leaderBase is the current leader's id and the base URL its node-to-node RPCs take: its
// cluster port over TLS, else its public API. "" when no leader is known (or, without TLS,
// it has not recorded its API address).
func (s *Store) leaderBase() (id, base string) {
	addr, lid := s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	if s.peerClient != nil {
		return string(lid), "https://" + string(addr)
	}
	return string(lid), s.fsm.apiAddr(string(lid))
}

// PeerHandler serves raftstore's RPCs on the cluster port (clusterport.Cluster.Serve, which
// checks the caller's membership), node-to-node ones included, under HandlerPrefix.
func (s *Store) PeerHandler() http.Handler { return s.routes(true) }

// stopPeers stops the cluster port's HTTP (clusterport.Port.StopHTTP).
func (s *Store) stopPeers(ctx context.Context, graceful bool) {
	if s.cfg.Cluster != nil {
		s.cfg.Cluster.StopHTTP(ctx, graceful)
	}
}
