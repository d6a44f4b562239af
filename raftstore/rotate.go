package raftstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"
	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// CA rotation and certificate renewal, for the cluster's own CA (see "Rotation" in DESIGN.md).
// A rotation records a new CA that issues from then on, trusted alongside the old ones; every
// member, applying it, renews its own certificate from the new CA; the leader retires the old
// CAs once every member presents a certificate from the new one. A node also renews its
// certificate once a third of its validity is left.

// renewCheck is how often (at most) a node looks at its certificate's expiry, besides every
// change of the recorded CAs.
const renewCheck = time.Minute

// retireCheck is how often a leader with CAs left to retire probes the members' certificates.
const retireCheck = 2 * time.Second

// TLSState is what GET /_raft/tls answers: the issuing CA and every CA trusted (SHA-256
// fingerprints of their certificates, the issuer first), and this node's certificate.
type TLSState struct {
	Issuer      string    `json:"issuer"`
	Trusted     []string  `json:"trusted"`
	Node        string    `json:"node,omitempty"`
	NodeIssuer  string    `json:"nodeIssuer,omitempty"`
	NodeExpires time.Time `json:"nodeExpires,omitzero"`
}

// Fingerprint is the hex SHA-256 of a certificate.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// TLS reports the cluster CAs as this node's replica has them, and its own certificate.
func (s *Store) TLS() TLSState {
	var st TLSState
	bundle, _ := s.fsm.trusted()
	if certs, err := clustertls.ParseCerts(bundle); err == nil {
		st.Issuer = Fingerprint(certs[0])
		for _, c := range certs {
			st.Trusted = append(st.Trusted, Fingerprint(c))
		}
	}
	if s.ident != nil {
		if leaf, _, _ := s.ident.Leaf(); leaf != nil {
			st.Node, st.NodeExpires = leaf.Subject.CommonName, leaf.NotAfter
			for _, c := range mustParse(bundle) {
				if leaf.CheckSignatureFrom(c) == nil {
					st.NodeIssuer = Fingerprint(c)
				}
			}
		}
	}
	return st
}

func mustParse(bundle []byte) []*x509.Certificate {
	certs, _ := clustertls.ParseCerts(bundle)
	return certs
}

// RotateCA makes a new cluster CA and records it, on the leader (a follower forwards): it
// issues from then on, and the CAs before it are retired once every member holds a
// certificate from it. It answers the new CA's fingerprint.
func (s *Store) RotateCA(ctx context.Context) (string, error) {
	if s.ident == nil || s.cfg.TLS.own() {
		return "", fmt.Errorf("%w: only a cluster running its own CA rotates it (with --tls-* files, replace them)", ErrBadRequest)
	}
	var fp string
	err := s.onLeader(ctx, "tls/rotate",
		func(ctx context.Context) error {
			ca, err := clustertls.NewCA("pinnedd cluster CA " + time.Now().UTC().Format("2006-01-02T15:04:05Z"))
			if err != nil {
				return err
			}
			key := ca.KeyPEM()
			if s.cfg.Sealer != nil {
				key = s.cfg.Sealer.Seal(clustertls.LabelCAKey, key)
			}
			cmd := metaCommand{Op: metaCARotate, CACert: string(ca.CertPEM()), CAKey: string(key)}
			if _, err := s.applyLocal(ctx, encodeMeta(cmd)); err != nil {
				return err
			}
			fp = Fingerprint(ca.Cert)
			s.log.Warn("rotated the cluster CA: members renew their certificates from the new one; the old one is retired once all did", "ca", fp)
			return nil
		},
		func(ctx context.Context, api string) error {
			var ans struct {
				CA string `json:"ca"`
			}
			err := s.callJSON(ctx, api, "tls/rotate", struct{}{}, &ans, true)
			fp = ans.CA
			return err
		})
	return fp, err
}

// renewLoop keeps this node's certificate and trust current: at every change of the recorded
// CAs (certCh) and every renewCheck.
func (s *Store) renewLoop() {
	defer s.wg.Done()
	t := time.NewTicker(min(renewCheck, s.certValidity()/10))
	defer t.Stop()
	for {
		if err := s.refreshIdentity(); err != nil {
			s.log.Error("renewing this node's cluster certificate failed; retrying", "err", err)
		}
		select {
		case <-s.baseCtx.Done():
			return
		case <-s.certCh:
		case <-t.C:
		}
	}
}

// certValidity is how long the certificates the cluster's CA issues hold.
func (s *Store) certValidity() time.Duration {
	if s.cfg.CertValidity > 0 {
		return s.cfg.CertValidity
	}
	return clustertls.DefaultNodeValidity
}

// refreshIdentity trusts the CAs the log trusts now and renews this node's certificate from
// the issuing CA when another CA issued it, or when a third of its validity is left. The
// key stays; the bundle is written before the certificate, so a crash between the two leaves
// a pair that still verifies. Connections from peers whose certificates chain to no CA
// trusted any more are closed.
func (s *Store) refreshIdentity() error {
	if s.ident == nil || s.cfg.TLS.own() || !s.ident.Ready() {
		return nil
	}
	bundle, _ := s.fsm.trusted()
	issuer := s.fsm.clusterCA()
	leaf, certPEM, keyPEM := s.ident.Leaf()
	if len(bundle) == 0 || leaf == nil {
		return nil // no CA recorded yet (the bootstrap node before it proposed it)
	}
	newCA := issuer != nil && leaf.CheckSignatureFrom(issuer.Cert) != nil
	// Near its end, unless it ends with its CA already (a new one would too: the CA needs
	// rotating, not the certificate renewing).
	renew := newCA || (issuer != nil && time.Until(leaf.NotAfter) < s.certValidity()/3 && leaf.NotAfter.Before(issuer.Cert.NotAfter))
	if !renew && bytes.Equal(bundle, s.ident.CAPEM()) {
		return nil
	}
	if renew {
		csr, err := clustertls.NewCSR(keyPEM, s.cfg.NodeID, s.hosts())
		if err != nil {
			return err
		}
		if certPEM, err = issuer.SignCSR(csr, s.cfg.NodeID); err != nil {
			return err
		}
	}
	probe := &clustertls.Identity{}
	if err := probe.Set(bundle, certPEM, keyPEM); err != nil {
		// Its CA was retired before it renewed (it could not open the new CA's key).
		return fmt.Errorf("this node's certificate chains to no CA the cluster trusts: %w", err)
	}
	if err := s.keys.WriteFile(clustertls.CAFile, bundle); err != nil {
		return err
	}
	// A certificate a new CA replaces is kept (before the new one is written, so a crash
	// between loses neither); Set carries one kept before over while its CA is trusted.
	var replaced []byte
	if newCA {
		_, replaced, _ = s.ident.Leaf()
		if err := s.keys.WriteFile(clustertls.PrevCertFile, replaced); err != nil {
			return err
		}
	}
	if renew {
		if err := s.keys.WriteFile(clustertls.CertFile, certPEM); err != nil {
			return err
		}
	}
	if err := s.ident.Set(bundle, certPEM, keyPEM); err != nil {
		return err
	}
	if replaced != nil {
		_ = s.ident.SetPrevious(replaced)
	}
	if s.ident.Previous() == nil {
		if err := os.Remove(s.keys.Path(clustertls.PrevCertFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if renew {
		nl, _, _ := s.ident.Leaf()
		s.log.Info("renewed this node's cluster certificate", "ca", Fingerprint(issuer.Cert), "expires", nl.NotAfter)
	}
	if s.stream != nil {
		s.stream.SweepUntrusted(s.ident.Trusts)
	}
	return nil
}

// retireCAs is leader work: while CAs other than the issuer are trusted, it probes every
// member's certificate over a fresh handshake, and retires them once all come from the
// issuer.
func (s *Store) retireCAs(ctx context.Context) {
	t := time.NewTicker(retireCheck)
	defer t.Stop()
	for {
		if _, n := s.fsm.trusted(); n > 1 {
			if err := s.retireIfRenewed(ctx); err != nil && ctx.Err() == nil {
				s.log.Debug("old cluster CAs not retired yet", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Store) retireIfRenewed(ctx context.Context) error {
	issuer := s.fsm.clusterCA()
	if issuer == nil {
		return nil
	}
	servers, err := s.configuration(ctx)
	if err != nil {
		return err
	}
	for _, srv := range servers {
		var leaf *x509.Certificate
		if string(srv.ID) == s.cfg.NodeID {
			leaf, _, _ = s.ident.Leaf()
		} else if leaf, err = s.peerCertificate(ctx, string(srv.Address)); err != nil {
			return fmt.Errorf("%s: %w", srv.ID, err)
		}
		if leaf == nil || leaf.CheckSignatureFrom(issuer.Cert) != nil {
			return fmt.Errorf("%s has no certificate from the issuing CA yet", srv.ID)
		}
	}
	for _, old := range s.fsm.retirable() {
		cmd := metaCommand{Op: metaCARetire, CACert: old}
		if _, err := s.applyLocal(ctx, encodeMeta(cmd)); err != nil {
			return err
		}
		fp := ""
		if c := mustParse([]byte(old)); len(c) > 0 {
			fp = Fingerprint(c[0])
		}
		s.log.Warn("retired a cluster CA: every member holds a certificate from its successor; certificates it issued are refused from now on", "ca", fp)
	}
	return nil
}

// peerCertificate is the certificate the member at addr presents on a fresh handshake (no
// resumed session: that would show the certificate of the session's first handshake).
func (s *Store) peerCertificate(ctx context.Context, addr string) (*x509.Certificate, error) {
	cfg := s.ident.ClientConfig(clusterport.ALPNHTTP)
	cfg.ClientSessionCache = nil
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	certs := c.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("no certificate")
	}
	return certs[0], nil
}
