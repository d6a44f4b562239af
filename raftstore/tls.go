package raftstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// TLSConfig turns on mutual TLS for the Raft transport (see "Mutual TLS" in DESIGN.md).
type TLSConfig struct {
	// ServerConn, if set, makes the server side of TLS over a connection the cluster port
	// accepted, in place of tls.Server (the agent's kept-alive loop supplies one whose
	// connections it can later serve itself). The handshake still runs here.
	ServerConn func(raw net.Conn, cfg *tls.Config) (*tls.Conn, error)
	// CAFile, CertFile and KeyFile bring the operator's own PKI: the CA this node trusts and
	// its certificate (CommonName = NodeID) and key, PEM. All three or none. With none, the
	// cluster runs its own CA: created by the bootstrap node, replicated in the log so any
	// leader can issue, and a joining node gets its certificate through JoinCluster; all of
	// it lives in <DataDir>/tls.
	CAFile, CertFile, KeyFile string
}

func (c *TLSConfig) own() bool {
	return c != nil && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "")
}

// departedGrace is how long a node that left the configuration is known as having just left.
const departedGrace = 30 * time.Second

// handshakeTimeout bounds a TLS handshake this node makes to a peer's cluster port.
const handshakeTimeout = 5 * time.Second

// setupTLS prepares this node's identity before the transport starts
// (clusterport.LoadIdentity): the operator's files, or the cluster's own CA
// in <DataDir>/tls (created here when this node bootstraps a new cluster;
// otherwise the certificate a join stored, or none yet).
func (s *Store) setupTLS() (clusterport.Keys, *clustertls.CA, error) {
	c := s.cfg.TLS
	keys := clusterport.Keys{Dir: filepath.Join(s.cfg.DataDir, "tls"), Sealer: s.cfg.Sealer, Logger: s.log}
	ident, localCA, err := clusterport.LoadIdentity(keys, clusterport.Setup{
		NodeID: s.cfg.NodeID, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Create: s.cfg.Bootstrap, Existing: s.existing, Hosts: s.hosts(), Validity: s.cfg.CertValidity,
	})
	switch {
	case errors.Is(err, clusterport.ErrConfig):
		return keys, nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	case err != nil:
		return keys, nil, fmt.Errorf("raftstore: %w", err)
	}
	s.ident = ident
	return keys, localCA, nil
}

// newAuthority is this node's part in the cluster CA (ident nil: none, the cluster runs
// without TLS).
func (s *Store) newAuthority(keys clusterport.Keys, localCA *clustertls.CA) *clusterport.Authority {
	return clusterport.NewAuthority(clusterport.AuthorityConfig{
		NodeID: s.cfg.NodeID, Tokens: joinTokens(s.cfg), Sealer: s.cfg.Sealer, Validity: s.cfg.CertValidity,
		Own: s.cfg.TLS.own(), Existing: s.existing, Hosts: s.hosts(), Logger: s.log,
	}, s.fsm.cas, caLog{s}, keys, s.ident, localCA, s.stream)
}

// hosts are what this node's certificate names.
func (s *Store) hosts() []string { return clusterport.Hosts(s.cfg.AdvertiseRaftAddr, s.cfg.RaftAddr) }

// allowPeer is the membership check on an authenticated inbound connection: the peer's node
// id must be in this node's latest Raft configuration. A node with no configuration yet (new,
// waiting to be joined) accepts any cluster certificate: the leader adding it must get through.
func (s *Store) allowPeer(nodeID string) error {
	select {
	case <-s.raftUp:
	case <-time.After(handshakeTimeout):
		return errors.New("raft is not running yet")
	}
	cfg := s.raft.GetConfiguration().Configuration()
	if len(cfg.Servers) == 0 {
		return nil
	}
	for _, srv := range cfg.Servers {
		if string(srv.ID) == nodeID {
			return nil
		}
	}
	// The cache learns of a removal appended but not yet committed here, as it would at
	// the commit: the refused node is then known to have just left.
	s.members.set(cfg)
	if s.members.leftWithin(nodeID, departedGrace) {
		return fmt.Errorf("node %q is %w", nodeID, clusterport.ErrLeft)
	}
	return fmt.Errorf("node %q is %w", nodeID, clusterport.ErrNotMember)
}

// configurationCommitted records the members, and sweeps connections from nodes the
// configuration no longer holds. The configuration is Raft's latest (appended, if not yet
// committed), not c: a restarted node's state machine replays every configuration of its
// log, and an old one (before a node joined) must neither drop current members from the
// checks nor cut their connections, the current leader's among them.
func (s *Store) configurationCommitted(c raft.Configuration) {
	select {
	case <-s.raftUp: // s.raft is set
		c = s.raft.GetConfiguration().Configuration() // no wait: raft keeps it at hand
	default:
	}
	s.members.set(c)
	if s.stream == nil || len(c.Servers) == 0 {
		return
	}
	ids := make(map[string]bool, len(c.Servers))
	for _, srv := range c.Servers {
		ids[string(srv.ID)] = true
	}
	s.stream.Sweep(func(id string) bool { return ids[id] })
}
