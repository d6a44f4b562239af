package raftstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
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
func (s *Store) setupTLS() error {
	c := s.cfg.TLS
	s.keys = clusterport.Keys{Dir: filepath.Join(s.cfg.DataDir, "tls"), Sealer: s.cfg.Sealer, Logger: s.log}
	ident, localCA, err := clusterport.LoadIdentity(s.keys, clusterport.Setup{
		NodeID: s.cfg.NodeID, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Create: s.cfg.Bootstrap, Existing: s.existing, Hosts: s.hosts(), Validity: s.cfg.CertValidity,
	})
	switch {
	case errors.Is(err, clusterport.ErrConfig):
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	case err != nil:
		return fmt.Errorf("raftstore: %w", err)
	}
	s.ident, s.localCA = ident, localCA
	return nil
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

// proposeCA is leader work on the node that created the cluster CA: it records the CA in the
// log (once; the first recorded CA stays) so that any later leader can issue certificates.
func (s *Store) proposeCA(ctx context.Context) {
	if s.localCA == nil || s.fsm.clusterCA() != nil {
		return
	}
	s.recordCA(ctx, metaCA, s.localCA.CertPEM(), s.localCA.KeyPEM(), func() bool { return s.fsm.clusterCA() != nil },
		"recorded the cluster CA in the log: any leader can issue certificates to joining nodes")
}

// CAKeyToSeal reports whether a cluster CA's key in the log is in clear or sealed under a
// token this node is rotating out: the leader records it again (sealCA); until then the old
// token must stay listed.
func (s *Store) CAKeyToSeal() bool { return s.fsm.caKeyToSeal() != nil }

// sealCA is leader work: a CA recorded with its key in clear (by an older node), or sealed
// under a token this leader is rotating out, is recorded again with the key sealed under
// this leader's token. The entries before stay until a snapshot compacts them away.
func (s *Store) sealCA(ctx context.Context) {
	for ctx.Err() == nil {
		rec := s.fsm.caKeyToSeal()
		if rec == nil {
			return
		}
		key := []byte(rec.Key)
		if clustertls.IsSealed(key) {
			plain, err := s.cfg.Sealer.Open(clustertls.LabelCAKey, key)
			if err != nil {
				return // caKeyToSeal opened it a moment ago: a newer record replaced it
			}
			key = plain
		}
		s.recordCA(ctx, metaCA, []byte(rec.Cert), key, func() bool {
			r := s.fsm.caKeyToSeal()
			return r == nil || r.Cert != rec.Cert
		}, "recorded a cluster CA's key sealed under this node's token: the log's next snapshot holds it in clear, or under a previous token, no more")
	}
}

// recordCA proposes op for the CA certPEM/keyPEM (the key sealed when this node has a sealer)
// until done holds.
func (s *Store) recordCA(ctx context.Context, op string, certPEM, keyPEM []byte, done func() bool, msg string) {
	if s.cfg.Sealer != nil && !clustertls.IsSealed(keyPEM) {
		keyPEM = s.cfg.Sealer.Seal(clustertls.LabelCAKey, keyPEM)
	}
	cmd := metaCommand{Op: op, CACert: string(certPEM), CAKey: string(keyPEM)}
	for delay := 50 * time.Millisecond; ctx.Err() == nil && !done(); delay = min(2*delay, 2*time.Second) {
		if _, err := s.applyLocal(ctx, encodeMeta(cmd)); err == nil {
			s.log.Info(msg)
			return
		} else if ctx.Err() == nil {
			s.log.Warn("recording the cluster CA failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// ClusterTLS reports how this node's Raft transport is secured: "mutual-tls" with the
// cluster's own CA, "mutual-tls (own PKI)", or "insecure".
func (s *Store) ClusterTLS() string {
	switch {
	case s.ident == nil:
		return "insecure"
	case s.cfg.TLS.own():
		return "mutual-tls (own PKI)"
	}
	return "mutual-tls"
}

// JoinCluster asks the member at memberURL (any member) to add this node, as JoinVia does, and
// first, when the transport runs the cluster's own CA and this node has no certificate yet,
// gets one: it fetches the CA, checks its pin against Config.Token (so a CA substituted by
// someone in between is refused before the token is sent), sends a certificate request for a
// key it made, checks the certificate it gets, and stores all of it in <DataDir>/tls.
func (s *Store) JoinCluster(ctx context.Context, client *http.Client, memberURL string) error {
	if s.ident != nil && !s.ident.Ready() {
		if err := s.fetchCertificate(ctx, client, memberURL); err != nil {
			return err
		}
	}
	if err := JoinVia(ctx, client, memberURL, s.cfg.Token, s.cfg.NodeID, s.advertise, s.cfg.APIAddr); err != nil {
		return err
	}
	// A member again: a leave recorded before no longer holds.
	if err := os.Remove(s.leftPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("could not clear the record of an earlier leave", "err", err)
	}
	return nil
}

// fetchCertificate gets this node's certificate from the member at memberURL
// (clusterport.FetchIdentity), over raftstore's RPCs.
func (s *Store) fetchCertificate(ctx context.Context, client *http.Client, memberURL string) error {
	if s.cfg.Token == "" {
		return fmt.Errorf("%w: joining with the cluster's own CA needs the deployment token (it pins the CA)", ErrInvalidConfig)
	}
	m := joinMember{client: client, url: memberURL, token: s.cfg.Token}
	if err := clusterport.FetchIdentity(ctx, s.keys, s.ident, s.cfg.NodeID, s.hosts(), s.cfg.Token, m); err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	return nil
}

// joinMember is a member's side of the certificate exchange, over its
// public port: the token proves itself without leaving this node
// (JoinProof), as this request and the join may go in clear.
type joinMember struct {
	client     *http.Client
	url, token string
}

func (m joinMember) CA(ctx context.Context) (clusterport.CAAnswer, error) {
	var ca clusterport.CAAnswer
	err := callJSON(ctx, m.client, m.url, rpcAuth{}, "ca", nil, &ca, false)
	return ca, err
}

func (m joinMember) Certificate(ctx context.Context, req clusterport.CertRequest) (clusterport.CertAnswer, error) {
	var ans clusterport.CertAnswer
	err := callJSON(ctx, m.client, m.url, rpcAuth{token: m.token, prove: true}, "certificate", req, &ans, false)
	return ans, err
}

func (m joinMember) String() string { return m.url }
