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

// setupTLS prepares this node's identity before the transport starts: the operator's files, or
// the cluster's own CA in <DataDir>/tls (created here when this node bootstraps a new cluster;
// otherwise the certificate a join stored, or none yet).
func (s *Store) setupTLS() error {
	c := s.cfg.TLS
	s.ident = &clustertls.Identity{}
	if c.own() {
		if c.CAFile == "" || c.CertFile == "" || c.KeyFile == "" {
			return fmt.Errorf("%w: TLS needs the CA, certificate and key files together (got ca %q, cert %q, key %q)", ErrInvalidConfig, c.CAFile, c.CertFile, c.KeyFile)
		}
		ca, cert, key, err := readAll(c.CAFile, c.CertFile, c.KeyFile)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if err := s.ident.Set(ca, cert, key); err != nil {
			return fmt.Errorf("%w: %s, %s: %w", ErrInvalidConfig, c.CertFile, c.CAFile, err)
		}
		if got := s.ident.NodeID(); got != s.cfg.NodeID {
			return fmt.Errorf("%w: %s is for node %q, this node is %q", ErrInvalidConfig, c.CertFile, got, s.cfg.NodeID)
		}
		return nil
	}
	s.tlsDir = filepath.Join(s.cfg.DataDir, "tls")
	caPEM, certPEM, _, err := readAll(
		filepath.Join(s.tlsDir, clustertls.CAFile), filepath.Join(s.tlsDir, clustertls.CertFile), filepath.Join(s.tlsDir, clustertls.KeyFile))
	var keyPEM []byte
	if err == nil {
		keyPEM, err = s.readKey(clustertls.KeyFile, clustertls.LabelNodeKey)
	}
	switch {
	case err == nil:
		if err := s.ident.Set(caPEM, certPEM, keyPEM); err != nil {
			return fmt.Errorf("raftstore: the certificate in %s: %w", s.tlsDir, err)
		}
		if got := s.ident.NodeID(); got != s.cfg.NodeID {
			return fmt.Errorf("%w: %s holds the certificate of node %q, this node is %q (a data dir of another node?)", ErrInvalidConfig, s.tlsDir, got, s.cfg.NodeID)
		}
		s.log.Info("cluster certificate loaded", "dir", s.tlsDir)
		if prev, err := os.ReadFile(filepath.Join(s.tlsDir, clustertls.PrevCertFile)); err == nil {
			_ = s.ident.SetPrevious(prev) // kept through a rotation under way; refreshIdentity drops it after
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("raftstore: %w", err)
	case s.cfg.Bootstrap && !s.existing:
		ca, err := clustertls.NewCA("pinnedd cluster CA " + s.cfg.NodeID)
		if err != nil {
			return err
		}
		ca.NodeValidity = s.cfg.CertValidity
		cert, key, err := ca.Issue(s.cfg.NodeID, s.hosts())
		if err != nil {
			return err
		}
		// The CA key first: a crash between the two leaves a CA to issue from again.
		if err := s.writeKey(clustertls.CAKeyFile, clustertls.LabelCAKey, ca.KeyPEM()); err != nil {
			return err
		}
		if err := s.writeKey(clustertls.KeyFile, clustertls.LabelNodeKey, key); err != nil {
			return err
		}
		for name, data := range map[string][]byte{clustertls.CAFile: ca.CertPEM(), clustertls.CertFile: cert} {
			if err := clustertls.WriteFile(filepath.Join(s.tlsDir, name), data, 0o600); err != nil {
				return err
			}
		}
		if err := s.ident.Set(ca.CertPEM(), cert, key); err != nil {
			return err
		}
		s.log.Info("created the cluster CA and this node's certificate", "dir", s.tlsDir)
	case s.existing:
		// Its id is (or was) a member's, and a member's id gets a certificate only over its own.
		return fmt.Errorf("%w: this data dir holds Raft state but %s holds no cluster certificate, and no member issues one for a member's id: remove this node (`pinnedd remove %s` on a member), move this data dir away and start it again with --join <member url> (or run the whole cluster with --insecure-cluster)", ErrInvalidConfig, s.tlsDir, s.cfg.NodeID)
	default:
		s.log.Info("no cluster certificate yet: a join gets one", "dir", s.tlsDir)
	}
	// The bootstrap node keeps the CA key; it proposes the CA into the log once it leads.
	switch keyPEM, err := s.readKey(clustertls.CAKeyFile, clustertls.LabelCAKey); {
	case err == nil:
		// After a rotation the trust bundle leads with the new CA, and once
		// the old one is retired it is not in it at all: the key file then
		// serves nothing (the log holds every CA's key).
		if s.localCA, err = clustertls.CAFromBundle(s.ident.CAPEM(), keyPEM); errors.Is(err, clustertls.ErrUntrusted) {
			s.log.Info("the CA key file is of a CA no longer trusted: ignored", "file", filepath.Join(s.tlsDir, clustertls.CAKeyFile))
		} else if err != nil {
			return fmt.Errorf("raftstore: the CA in %s: %w", s.tlsDir, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return nil
}

// readKey reads the key file name in the TLS directory: sealed (Config.Sealer opens it), or
// in clear, as an older version or a node without a sealer wrote it; a key found in clear,
// or sealed under a token being rotated out, is sealed in place under this node's token.
func (s *Store) readKey(name, label string) ([]byte, error) {
	path := filepath.Join(s.tlsDir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if clustertls.IsSealed(b) {
		if s.cfg.Sealer == nil {
			return nil, fmt.Errorf("%w: %s is sealed with the deployment token, and this node has none", ErrInvalidConfig, path)
		}
		plain, stale, err := s.cfg.Sealer.OpenStale(label, b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w (was this data dir made with another PINBOARD_TOKEN?)", ErrInvalidConfig, path, err)
		}
		if stale {
			if err := s.writeKey(name, label, plain); err != nil {
				return nil, fmt.Errorf("raftstore: sealing %s again: %w", path, err)
			}
			s.log.Info("sealed a key again under this node's token (it opened with a token being rotated out)", "file", path)
		}
		return plain, nil
	}
	if s.cfg.Sealer != nil {
		if err := s.writeKey(name, label, b); err != nil {
			return nil, fmt.Errorf("raftstore: sealing %s: %w", path, err)
		}
		s.log.Info("sealed a key kept in clear", "file", path)
	}
	return b, nil
}

// writeKey writes the key file name in the TLS directory, sealed when this node has a sealer.
func (s *Store) writeKey(name, label string, plain []byte) error {
	if s.cfg.Sealer != nil {
		plain = s.cfg.Sealer.Seal(label, plain)
	}
	return clustertls.WriteFile(filepath.Join(s.tlsDir, name), plain, 0o600)
}

func (s *Store) hosts() []string {
	var hs []string
	for _, a := range []string{s.cfg.AdvertiseRaftAddr, s.cfg.RaftAddr} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && !slicesContains(hs, h) {
			hs = append(hs, h)
		}
	}
	return hs
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func readAll(paths ...string) (caPEM, certPEM, keyPEM []byte, err error) {
	out := make([][]byte, len(paths))
	for i, p := range paths {
		if out[i], err = os.ReadFile(p); err != nil {
			return nil, nil, nil, err
		}
	}
	return out[0], out[1], out[2], nil
}

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

// checkPins: the CA is pinned under token, by its main pin or one of the others (a member
// whose node key is being rotated pins it under each value).
func checkPins(token string, ca caAnswer) error {
	err := clustertls.CheckPin(token, []byte(ca.CA), ca.Pin)
	for _, pin := range ca.Pins {
		if err == nil {
			break
		}
		err = clustertls.CheckPin(token, []byte(ca.CA), pin)
	}
	return err
}

func (s *Store) fetchCertificate(ctx context.Context, client *http.Client, memberURL string) error {
	if s.cfg.Token == "" {
		return fmt.Errorf("%w: joining with the cluster's own CA needs the deployment token (it pins the CA)", ErrInvalidConfig)
	}
	var ca caAnswer
	if err := callJSON(ctx, client, memberURL, rpcAuth{}, "ca", nil, &ca, false); err != nil {
		return fmt.Errorf("raftstore: fetching the cluster CA: %w", err)
	}
	if err := checkPins(s.cfg.Token, ca); err != nil {
		return fmt.Errorf("%w: the CA from %s is not vouched for by this node's PINBOARD_TOKEN (another cluster, another token, or someone in between): %w", ErrUntrustedCA, memberURL, err)
	}
	key, err := s.readKey(clustertls.KeyFile, clustertls.LabelNodeKey)
	if errors.Is(err, os.ErrNotExist) {
		if key, err = clustertls.NewKey(); err == nil {
			err = s.writeKey(clustertls.KeyFile, clustertls.LabelNodeKey, key)
		}
	}
	if err != nil {
		return fmt.Errorf("raftstore: node key: %w", err)
	}
	csr, err := clustertls.NewCSR(key, s.cfg.NodeID, s.hosts())
	if err != nil {
		return err
	}
	var ans certAnswer
	// The token proves itself without leaving this node (JoinProof): this request and the join
	// go to the member's public port, maybe in clear.
	if err := callJSON(ctx, client, memberURL, rpcAuth{token: s.cfg.Token, prove: true}, "certificate", certRequest{ID: s.cfg.NodeID, CSR: string(csr)}, &ans, false); err != nil {
		return fmt.Errorf("raftstore: getting this node's certificate: %w", err)
	}
	if ans.CA != ca.CA {
		return fmt.Errorf("%w: %s answered the certificate request with another CA than the pinned one", ErrUntrustedCA, memberURL)
	}
	// Set checks that the certificate chains to the pinned CA and fits this node's key.
	probe := &clustertls.Identity{}
	if err := probe.Set([]byte(ca.CA), []byte(ans.Cert), key); err != nil {
		return fmt.Errorf("%w: the certificate from %s: %w", ErrUntrustedCA, memberURL, err)
	}
	if probe.NodeID() != s.cfg.NodeID {
		return fmt.Errorf("%w: %s issued a certificate for %q", ErrUntrustedCA, memberURL, probe.NodeID())
	}
	if err := clustertls.WriteFile(filepath.Join(s.tlsDir, clustertls.CAFile), []byte(ca.CA), 0o600); err != nil {
		return err
	}
	if err := clustertls.WriteFile(filepath.Join(s.tlsDir, clustertls.CertFile), []byte(ans.Cert), 0o600); err != nil {
		return err
	}
	if err := s.ident.Set([]byte(ca.CA), []byte(ans.Cert), key); err != nil {
		return err
	}
	s.log.Info("got this node's cluster certificate", "via", memberURL, "dir", s.tlsDir)
	return nil
}
