package raftstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/pinnedd/pinnedd/clusterport"
)

// PeerTLS is the client side of node-to-node HTTP: this node's certificate, the cluster CA,
// ALPN for the cluster port's HTTP. nil on a cluster without mutual TLS (peers are then called
// on their public ports). One config for the process's life: it reads the identity at every
// handshake and keeps sessions to resume.
func (s *Store) PeerTLS() *tls.Config { return s.peerTLS }

// PeerAddr is the cluster address (host:port of the Raft port, over mutual TLS) of node id, if
// it is a member of this node's latest Raft configuration. A miss re-reads the configuration at
// most once a second, so a node no configuration holds (an outside worker) costs a map lookup.
func (s *Store) PeerAddr(id string) (string, bool) {
	addr, ok, _ := s.members.lookup(s, id)
	return addr, ok
}

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

// memberCache is the latest configuration's members (id -> Raft address) for the per-request
// checks of the cluster port and PeerAddr: replaced on every committed configuration, and read
// again from Raft on a miss, at most once a second.
type memberCache struct {
	cur    atomic.Pointer[map[string]string]
	mu     sync.Mutex
	readAt time.Time
	// hosts are the members' addresses' IPs, for the cluster port's admission (handshakeSlots).
	hosts clusterport.MemberHosts

	leftMu sync.Mutex
	left   map[string]time.Time // nodes a configuration dropped, and when (for departedGrace)
}

// lookup is id's Raft address, re-reading the configuration on a miss (reread); none says
// the configuration read holds no server at all (a node waiting to be joined).
func (c *memberCache) lookup(s *Store, id string) (addr string, ok, none bool) {
	if m := c.cur.Load(); m != nil {
		if addr, ok = (*m)[id]; ok {
			return addr, true, false
		}
	}
	m := c.reread(s)
	addr, ok = m[id]
	return addr, ok, m != nil && len(m) == 0
}

// reread reads the configuration from Raft, unless that was done less than a second ago.
func (c *memberCache) reread(s *Store) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.cur.Load(); m != nil && time.Since(c.readAt) < time.Second {
		return *m
	}
	c.readAt = time.Now()
	select {
	case <-s.raftUp:
	default:
		return nil
	}
	fut := s.raft.GetConfiguration()
	if fut.Error() != nil {
		return nil
	}
	c.set(fut.Configuration())
	return *c.cur.Load()
}

// set records cfg's members, and when a node the previous members held left.
func (c *memberCache) set(cfg raft.Configuration) {
	m := make(map[string]string, len(cfg.Servers))
	addrs := make([]string, 0, len(cfg.Servers))
	for _, srv := range cfg.Servers {
		m[string(srv.ID)] = string(srv.Address)
		addrs = append(addrs, string(srv.Address))
	}
	if prev := c.cur.Load(); prev != nil && maps.Equal(*prev, m) {
		return // the same members (a refused peer's check re-reads them): nothing left, nothing to resolve
	}
	c.hosts.Set(addrs)
	c.leftMu.Lock()
	defer c.leftMu.Unlock()
	now := time.Now()
	for id, at := range c.left {
		if now.Sub(at) > departedGrace {
			delete(c.left, id)
		}
	}
	if prev := c.cur.Swap(&m); prev != nil && len(m) > 0 {
		for id := range *prev {
			if _, still := m[id]; !still {
				if c.left == nil {
					c.left = map[string]time.Time{}
				}
				c.left[id] = now
			}
		}
	}
}

// leftWithin: a configuration dropped node less than d ago.
func (c *memberCache) leftWithin(node string, d time.Duration) bool {
	c.leftMu.Lock()
	defer c.leftMu.Unlock()
	at, ok := c.left[node]
	return ok && time.Since(at) < d
}

// memberHost: ip is the address of one of the latest configuration's members (reading the
// configuration if it was never read).
func (s *Store) memberHost(ip string) bool {
	if s.members.cur.Load() == nil {
		s.members.reread(s)
	}
	return s.members.hosts.Has(ip)
}

// isMember: node may call this node's cluster port. As for Raft (allowPeer), a node with no
// configuration yet accepts any cluster certificate.
func (s *Store) isMember(node string) bool {
	_, ok, none := s.members.lookup(s, node)
	return ok || none
}

// ServePeers serves HTTP between nodes on the cluster port, until Close: raftstore's own
// node-to-node RPCs under HandlerPrefix, and everything else with h. Only a member of the
// cluster reaches either: its certificate was checked in the handshake, and its membership is
// checked again on every request (a removed node's request is answered 403 and its connection
// closed). It does nothing on a cluster without mutual TLS.
//
// handBacks are more listeners of connections the cluster port accepted (clusterport.Port.Serve).
func (s *Store) ServePeers(h http.Handler, handBacks ...net.Listener) {
	if s.stream == nil {
		return
	}
	rpc := s.routes(true)
	s.stream.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node := clusterport.NodeFrom(r.Context())
		if !s.isMember(node) {
			w.Header().Set("Connection", "close")
			writeError(w, fmt.Errorf("%w: node %q is not a member of the cluster", ErrForbidden, node))
			return
		}
		if strings.HasPrefix(r.URL.Path, HandlerPrefix) {
			rpc.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}), handBacks...)
}

// stopPeers stops the cluster port's HTTP (clusterport.Port.StopHTTP).
func (s *Store) stopPeers(ctx context.Context, graceful bool) {
	if s.stream != nil {
		s.stream.StopHTTP(ctx, graceful)
	}
}

// peerIdlePerHost bounds the idle connections kept to each peer's cluster port.
const peerIdlePerHost = 512
