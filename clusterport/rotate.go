package clusterport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// The CA's leader work and this node's renewals (see "Rotation" in DESIGN.md). A rotation
// records a new CA that issues from then on, trusted alongside the old ones; every member,
// applying it, renews its own certificate from the new CA; the leader retires the old CAs once
// every member presents a certificate from the new one. A node also renews its certificate
// once a third of its validity is left.

// renewCheck is how often (at most) a node looks at its certificate's expiry, besides every
// change of the recorded CAs.
const renewCheck = time.Minute

// retireCheck is how often a leader with CAs left to retire probes the members' certificates.
const retireCheck = 2 * time.Second

// Work is one piece of the CA's work while this node leads: run until ctx ends.
type Work struct {
	Name string
	Run  func(ctx context.Context)
}

// LeaderWork is the CA's work while this node leads: recording the CA this node created,
// sealing CA keys, retiring rotated-out CAs.
func (a *Authority) LeaderWork() []Work {
	var work []Work
	if a.localCA != nil {
		work = append(work, Work{"cluster-ca", a.propose})
	}
	if a.cfg.Sealer != nil && a.ident != nil {
		work = append(work, Work{"seal-cluster-ca", a.seal})
	}
	if a.runsCA() {
		work = append(work, Work{"retire-cluster-cas", a.retire})
	}
	return work
}

// propose records the CA this node created in the log (once; the first recorded CA stays), so
// that any later leader can issue certificates.
func (a *Authority) propose(ctx context.Context) {
	if a.localCA == nil || a.ledger.Issuer() != nil {
		return
	}
	a.record(ctx, OpCA, a.localCA.CertPEM(), a.localCA.KeyPEM(), func() bool { return a.ledger.Issuer() != nil },
		"recorded the cluster CA in the log: any leader can issue certificates to joining nodes")
}

// seal records again, with the key sealed under this leader's token, a CA recorded with its
// key in clear (by an older node) or sealed under a token being rotated out. The entries
// before stay until a snapshot compacts them away.
func (a *Authority) seal(ctx context.Context) {
	for ctx.Err() == nil {
		rec := a.ledger.KeyToSeal()
		if rec == nil {
			return
		}
		key := []byte(rec.Key)
		if clustertls.IsSealed(key) {
			plain, err := a.cfg.Sealer.Open(clustertls.LabelCAKey, key)
			if err != nil {
				return // KeyToSeal opened it a moment ago: a newer record replaced it
			}
			key = plain
		}
		a.record(ctx, OpCA, []byte(rec.Cert), key, func() bool {
			r := a.ledger.KeyToSeal()
			return r == nil || r.Cert != rec.Cert
		}, "recorded a cluster CA's key sealed under this node's token: the log's next snapshot holds it in clear, or under a previous token, no more")
	}
}

// record proposes op for the CA certPEM/keyPEM (the key sealed when this node has a sealer)
// until done holds.
func (a *Authority) record(ctx context.Context, op CAOp, certPEM, keyPEM []byte, done func() bool, msg string) {
	if a.cfg.Sealer != nil && !clustertls.IsSealed(keyPEM) {
		keyPEM = a.cfg.Sealer.Seal(clustertls.LabelCAKey, keyPEM)
	}
	for delay := 50 * time.Millisecond; ctx.Err() == nil && !done(); delay = min(2*delay, 2*time.Second) {
		if err := a.log.Record(ctx, op, string(certPEM), string(keyPEM)); err == nil {
			a.slog.Info(msg)
			return
		} else if ctx.Err() == nil {
			a.slog.Warn("recording the cluster CA failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// Rotate makes a new cluster CA and records it, on the leader: it issues from then on, and the
// CAs before it are retired once every member holds a certificate from it. It answers the new
// CA's fingerprint.
func (a *Authority) Rotate(ctx context.Context) (string, error) {
	if !a.runsCA() {
		return "", fmt.Errorf("%w: only a cluster running its own CA rotates it (with --tls-* files, replace them)", ErrInvalid)
	}
	a.rotating.Lock()
	defer a.rotating.Unlock()
	ca, err := clustertls.NewCA("pinnedd cluster CA " + time.Now().UTC().Format("2006-01-02T15:04:05Z"))
	if err != nil {
		return "", err
	}
	key := ca.KeyPEM()
	if a.cfg.Sealer != nil {
		key = a.cfg.Sealer.Seal(clustertls.LabelCAKey, key)
	}
	if err := a.log.Record(ctx, OpCARotate, string(ca.CertPEM()), string(key)); err != nil {
		return "", err
	}
	fp := Fingerprint(ca.Cert)
	a.slog.Warn("rotated the cluster CA: members renew their certificates from the new one; the old one is retired once all did", "ca", fp)
	return fp, nil
}

// Renew keeps this node's certificate and trust current until ctx ends: at every change of the
// recorded CAs (Changed) and every renewCheck. It returns at once for a cluster without a CA
// of its own.
func (a *Authority) Renew(ctx context.Context) {
	if !a.runsCA() {
		return
	}
	t := time.NewTicker(min(renewCheck, a.validity()/10))
	defer t.Stop()
	for {
		if err := a.refresh(); err != nil {
			a.slog.Error("renewing this node's cluster certificate failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-a.changed:
		case <-t.C:
		}
	}
}

// validity is how long the certificates the cluster's CA issues hold.
func (a *Authority) validity() time.Duration {
	if a.cfg.Validity > 0 {
		return a.cfg.Validity
	}
	return clustertls.DefaultNodeValidity
}

// refresh trusts the CAs the log trusts now and renews this node's certificate from the
// issuing CA when another CA issued it, or when a third of its validity is left. The key
// stays; the bundle is written before the certificate, so a crash between the two leaves a
// pair that still verifies. Connections from peers whose certificates chain to no CA trusted
// any more are closed.
func (a *Authority) refresh() error {
	if !a.runsCA() || !a.ident.Ready() {
		return nil
	}
	bundle, _ := a.ledger.Trusted()
	issuer := a.ledger.Issuer()
	leaf, certPEM, keyPEM := a.ident.Leaf()
	if len(bundle) == 0 || leaf == nil {
		return nil // no CA recorded yet (the bootstrap node before it proposed it)
	}
	newCA := issuer != nil && leaf.CheckSignatureFrom(issuer.Cert) != nil
	// Near its end, unless it ends with its CA already (a new one would too: the CA needs
	// rotating, not the certificate renewing).
	renew := newCA || (issuer != nil && time.Until(leaf.NotAfter) < a.validity()/3 && leaf.NotAfter.Before(issuer.Cert.NotAfter))
	if !renew && bytes.Equal(bundle, a.ident.CAPEM()) {
		return nil
	}
	if renew {
		csr, err := clustertls.NewCSR(keyPEM, a.cfg.NodeID, a.cfg.Hosts)
		if err != nil {
			return err
		}
		if certPEM, err = issuer.SignCSR(csr, a.cfg.NodeID); err != nil {
			return err
		}
	}
	if err := a.store(bundle, certPEM, keyPEM, newCA, renew); err != nil {
		return err
	}
	if renew {
		nl, _, _ := a.ident.Leaf()
		a.slog.Info("renewed this node's cluster certificate", "ca", Fingerprint(issuer.Cert), "expires", nl.NotAfter)
	}
	if a.port != nil {
		a.port.SweepUntrusted(a.ident.Trusts)
	}
	return nil
}

// store writes the trusted bundle (and this node's certificate, when renewed) to disk and takes
// them up, the certificate a new CA replaces kept beside them.
func (a *Authority) store(bundle, certPEM, keyPEM []byte, newCA, renewed bool) error {
	probe := &clustertls.Identity{}
	if err := probe.Set(bundle, certPEM, keyPEM); err != nil {
		// Its CA was retired before it renewed (it could not open the new CA's key).
		return fmt.Errorf("this node's certificate chains to no CA the cluster trusts: %w", err)
	}
	if err := a.keys.WriteFile(clustertls.CAFile, bundle); err != nil {
		return err
	}
	// A certificate a new CA replaces is kept (before the new one is written, so a crash
	// between loses neither); Set carries one kept before over while its CA is trusted.
	var replaced []byte
	if newCA {
		_, replaced, _ = a.ident.Leaf()
		if err := a.keys.WriteFile(clustertls.PrevCertFile, replaced); err != nil {
			return err
		}
	}
	if renewed {
		if err := a.keys.WriteFile(clustertls.CertFile, certPEM); err != nil {
			return err
		}
	}
	if err := a.ident.Set(bundle, certPEM, keyPEM); err != nil {
		return err
	}
	if replaced != nil {
		_ = a.ident.SetPrevious(replaced)
	}
	if a.ident.Previous() == nil {
		if err := os.Remove(a.keys.Path(clustertls.PrevCertFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// retire is leader work: while CAs other than the issuer are trusted, it probes every member's
// certificate over a fresh handshake, and retires them once all come from the issuer.
func (a *Authority) retire(ctx context.Context) {
	t := time.NewTicker(retireCheck)
	defer t.Stop()
	for {
		if _, n := a.ledger.Trusted(); n > 1 {
			if err := a.retireIfRenewed(ctx); err != nil && ctx.Err() == nil {
				a.slog.Debug("old cluster CAs not retired yet", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Authority) retireIfRenewed(ctx context.Context) error {
	a.rotating.Lock()
	defer a.rotating.Unlock()
	issuer := a.ledger.Issuer()
	if issuer == nil {
		return nil
	}
	servers, err := a.log.Servers(ctx)
	if err != nil {
		return err
	}
	for _, srv := range servers {
		var leaf *x509.Certificate
		if srv.ID == a.cfg.NodeID {
			leaf, _, _ = a.ident.Leaf()
		} else if leaf, err = a.peerCertificate(ctx, srv.Addr); err != nil {
			return fmt.Errorf("%s: %w", srv.ID, err)
		}
		if leaf == nil || leaf.CheckSignatureFrom(issuer.Cert) != nil {
			return fmt.Errorf("%s has no certificate from the issuing CA yet", srv.ID)
		}
	}
	for _, old := range a.ledger.Retirable() {
		if err := a.log.Record(ctx, OpCARetire, old, ""); err != nil {
			return err
		}
		fp := ""
		if c, _ := clustertls.ParseCerts([]byte(old)); len(c) > 0 {
			fp = Fingerprint(c[0])
		}
		a.slog.Warn("retired a cluster CA: every member holds a certificate from its successor; certificates it issued are refused from now on", "ca", fp)
	}
	return nil
}

// peerCertificate is the certificate the member at addr presents on a fresh handshake (no
// resumed session: that would show the certificate of the session's first handshake).
func (a *Authority) peerCertificate(ctx context.Context, addr string) (*x509.Certificate, error) {
	cfg := a.ident.ClientConfig(ALPNHTTP)
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
