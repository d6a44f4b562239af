package raftstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The Raft port carries two protocols under the cluster's mutual TLS, told apart by the
// application protocol the client asked for in its handshake (ALPN): Raft's own RPCs, and
// HTTP between nodes (ServePeers). A client that asks for none (a node of an earlier version
// dialing Raft, or a proxy that cannot set ALPN) is told apart by its first byte: Raft's RPCs
// start with a small type number, HTTP with a method's capital letter.
const (
	alpnRaft = "pinnedd-raft"
	alpnHTTP = "pinnedd-http"
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
	hosts memberHosts

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
	c.hosts.set(addrs)
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
	return s.members.hosts.has(ip)
}

// isMember: node may call this node's cluster port. As for Raft (allowPeer), a node with no
// configuration yet accepts any cluster certificate.
func (s *Store) isMember(node string) bool {
	_, ok, none := s.members.lookup(s, node)
	return ok || none
}

type peerNodeKey struct{}

// ServePeers serves HTTP between nodes on the cluster port, until Close: raftstore's own
// node-to-node RPCs under HandlerPrefix, and everything else with h. Only a member of the
// cluster reaches either: its certificate was checked in the handshake, and its membership is
// checked again on every request (a removed node's request is answered 403 and its connection
// closed). It does nothing on a cluster without mutual TLS.
//
// handBacks are more listeners of connections the cluster port accepted (a kept-alive loop
// that served some of their requests itself gives them back there); a connection from them is
// known by unwrapping NetConn() to the accepted one.
func (s *Store) ServePeers(h http.Handler, handBacks ...net.Listener) {
	if s.stream == nil {
		return
	}
	rpc := s.routes(true)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			node, _ := r.Context().Value(peerNodeKey{}).(string)
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
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			for c != nil {
				if pc, ok := c.(*peerConn); ok {
					return context.WithValue(ctx, peerNodeKey{}, pc.node)
				}
				w, ok := c.(interface{ NetConn() net.Conn })
				if !ok {
					break
				}
				c = w.NetConn()
			}
			return ctx
		},
		ConnState:         s.peerConns.Track,
		ReadHeaderTimeout: handshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.peerSrv.Store(srv)
	for _, ln := range append([]net.Listener{s.stream.httpListener()}, handBacks...) {
		if ln == nil {
			continue
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				s.log.Error("serving the cluster port's HTTP failed", "err", err)
			}
		}()
	}
}

// stopPeers stops the cluster port's HTTP: no new connection (the port closes those at once),
// idle ones closed, and those with a request under way closed once it is answered, until ctx
// ends (then they are cut). A request cut mid-way would leave its sender unsure whether it ran.
// Not graceful (a storage fault): everything is cut at once.
func (s *Store) stopPeers(ctx context.Context, graceful bool) {
	if s.stream != nil {
		s.stream.stopHTTP()
	}
	srv := s.peerSrv.Load()
	if srv != nil && !graceful {
		_ = srv.Close()
	} else if srv != nil {
		ctx, cancel := context.WithTimeout(ctx, peerShutdownBound)
		defer cancel()
		// A request on a connection accepted just before would reach net/http
		// after its Shutdown began, which drops it unanswered.
		s.peerConns.AwaitFirstRequests(ctx)
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn("requests on the cluster port still under way at the shutdown deadline; cut them off", "err", err)
			_ = srv.Close()
		}
	}
}

// peerIdlePerHost bounds the idle connections kept to each peer's cluster port.
const peerIdlePerHost = 512

// peerShutdownBound bounds the wait for the cluster port's requests under way at shutdown.
const peerShutdownBound = 5 * time.Second
