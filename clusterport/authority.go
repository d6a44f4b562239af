package clusterport

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// Errors of the cluster CA. The log's RPCs answer them with their statuses.
var (
	// ErrNoClusterCA means this member cannot issue a certificate: the cluster runs without
	// TLS, uses the operator's own PKI, or this member has not received its CA yet.
	ErrNoClusterCA = errors.New("no cluster CA to issue from")
	// ErrNoCAYet: this member has not received the cluster CA (it is joining itself). It
	// comes wrapped with ErrNoClusterCA.
	ErrNoCAYet = errors.New("this member has not received the cluster CA yet (is it a member? see `pinnedd members`); retry")
	// ErrRefused means a certificate was asked for in a current member's name by anyone but
	// that member.
	ErrRefused = errors.New("certificate refused")
	// ErrInvalid means a request the CA was asked to act on is malformed or does not apply.
	ErrInvalid = errors.New("invalid request")
	// ErrBadProof means a join proof matched none of this node's join tokens.
	ErrBadProof = errors.New("join proof refused")
)

// caWait bounds how long a CA or certificate request waits for this member to receive the CA.
const caWait = 10 * time.Second

// Log is what the cluster CA needs of the replicated log it records itself in.
type Log interface {
	// Record commits a CA entry, on the leader.
	Record(ctx context.Context, op CAOp, certPEM, keyPEM string) error
	// Servers is the leader's latest configuration (after its term's barrier).
	Servers(ctx context.Context) ([]Server, error)
	// Changes is closed at the next change of what the log records about its members or CAs.
	Changes() <-chan struct{}
	// Configuration is the latest configuration this node knows (appended, if not yet
	// committed), without waiting.
	Configuration() ([]Server, error)
}

// Server is one member of the log's configuration.
type Server struct {
	ID   string
	Addr string // its cluster port
}

// AuthorityConfig is what the cluster CA needs to know of this node.
type AuthorityConfig struct {
	NodeID string
	// Tokens are the tokens a join proof may be made with and the CA is pinned for, the
	// deployment token first (the values of a node key being rotated).
	Tokens []string
	// Sealer seals CA keys recorded from here (nil: they are recorded in clear).
	Sealer *clustertls.Sealer
	// Validity is how long the certificates the CA issues hold (0: the default).
	Validity time.Duration
	// Own: the operator's PKI (--tls-* files); the cluster runs no CA of its own.
	Own bool
	// Existing: the data dir held the log's state at start (so a CA this node created is one
	// the log may have superseded).
	Existing bool
	// Hosts are what this node's certificate names.
	Hosts  []string
	Logger *slog.Logger
}

// Authority is the cluster's own CA as this node takes part in it (see "Mutual TLS" and
// "Rotation" in DESIGN.md): it answers a joining node the CA and signs its certificate (the
// leader decides), records the CA it created, seals recorded keys, rotates and retires CAs (on
// the leader), and keeps this node's own certificate and trust current.
type Authority struct {
	cfg     AuthorityConfig
	ledger  *Ledger
	log     Log
	keys    Keys
	ident   *clustertls.Identity // nil: the cluster runs without TLS
	localCA *clustertls.CA       // the CA this node created (bootstrap), to record in the log
	port    *Port                // its connections are swept of peers no CA trusts any more
	slog    *slog.Logger
	changed chan struct{} // the recorded CAs changed: Renew looks again
	// rotating makes the leader's rotations and retirements one at a time: a retirement
	// judged against one issuer never lands after a rotation to the next, which would retire
	// the CA the members were just found to hold.
	rotating sync.Mutex
}

// NewAuthority is this node's part in the cluster CA. ident, localCA and keys are what
// LoadIdentity gave (ident nil: no TLS); port may be nil.
func NewAuthority(cfg AuthorityConfig, ledger *Ledger, log Log, keys Keys, ident *clustertls.Identity, localCA *clustertls.CA, port *Port) *Authority {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Tokens) == 0 {
		cfg.Tokens = []string{""}
	}
	return &Authority{cfg: cfg, ledger: ledger, log: log, keys: keys, ident: ident, localCA: localCA, port: port,
		slog: cfg.Logger, changed: make(chan struct{}, 1)}
}

// Ledger is the CAs the log records, as this node applied them.
func (a *Authority) Ledger() *Ledger { return a.ledger }

// Identity is this node's certificate and trust (nil without TLS).
func (a *Authority) Identity() *clustertls.Identity { return a.ident }

// runsCA: the cluster runs its own CA (TLS without the operator's files).
func (a *Authority) runsCA() bool { return a.ident != nil && !a.cfg.Own }

// Mode reports how this node's cluster port is secured: "mutual-tls" with the cluster's own
// CA, "mutual-tls (own PKI)", or "insecure".
func (a *Authority) Mode() string {
	switch {
	case a.ident == nil:
		return "insecure"
	case a.cfg.Own:
		return "mutual-tls (own PKI)"
	}
	return "mutual-tls"
}

// Changed tells the authority the recorded CAs may have changed (the log applied an entry).
func (a *Authority) Changed() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// KeyToSeal reports whether a cluster CA's key in the log is in clear or sealed under a token
// this node is rotating out: the leader records it again (Seal); until then the old token must
// stay listed.
func (a *Authority) KeyToSeal() bool { return a.ledger.KeyToSeal() != nil }

// CheckJoinProof admits a request by its join proof, made with one of this node's tokens over
// the request's method, path and body.
func (a *Authority) CheckJoinProof(proof, method, path string, body []byte) error {
	if a.cfg.Tokens[0] == "" {
		return fmt.Errorf("%w: this node has no token to check a join proof with", ErrBadProof)
	}
	var err error
	for _, token := range a.cfg.Tokens {
		if err = clustertls.CheckJoinProof(token, proof, method, path, body, time.Now()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: %w", ErrBadProof, err)
}

// Issuer is the CA this node issues from: the one recorded in the log, else the one it created
// (a bootstrap node before its CA entry commits).
func (a *Authority) Issuer() (*clustertls.CA, error) {
	switch {
	case a.ident == nil:
		return nil, fmt.Errorf("%w: this cluster runs Raft without TLS (--insecure-cluster); start the joining node with --insecure-cluster too", ErrNoClusterCA)
	case a.cfg.Own:
		return nil, fmt.Errorf("%w: this cluster uses its own PKI; give the joining node --tls-ca, --tls-cert and --tls-key", ErrNoClusterCA)
	}
	if ca := a.ledger.Issuer(); ca != nil {
		return ca, nil
	}
	// The CA this node created, before the log recorded any: never one the
	// log superseded (a restart replays the log before it knows).
	if _, n := a.ledger.Trusted(); a.localCA != nil && n == 0 && !a.cfg.Existing {
		return a.localCA, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrNoClusterCA, ErrNoCAYet)
}

// issuerWait is Issuer, waiting (up to ctx, at most caWait) for a member that has not yet
// replicated the cluster CA, as a join through a member that is itself still joining waits for
// its leader.
func (a *Authority) issuerWait(ctx context.Context) (*clustertls.CA, error) {
	ctx, cancel := context.WithTimeout(ctx, caWait)
	defer cancel()
	for {
		changed := a.log.Changes()
		ca, err := a.Issuer()
		if err == nil || !errors.Is(err, ErrNoCAYet) {
			return ca, err
		}
		// Every CA entry the log applies is a change: nothing else to poll.
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, err
		}
	}
}

// CA is what a joining node asks first: the CA and its pins under each token.
func (a *Authority) CA(ctx context.Context) (CAAnswer, error) {
	ca, err := a.issuerWait(ctx)
	if err != nil {
		return CAAnswer{}, err
	}
	ans := CAAnswer{CA: string(ca.CertPEM())}
	for _, token := range a.cfg.Tokens {
		pin, err := clustertls.Pin(token, ca.CertPEM())
		if err != nil {
			return CAAnswer{}, err
		}
		ans.Pins = append(ans.Pins, pin)
	}
	ans.Pin = ans.Pins[0]
	return ans, nil
}

// Issue signs req, on the leader, if req.ID is not a member of the latest configuration: a
// member's certificate goes only to that member, over its own certificate (Sign, a renewal).
func (a *Authority) Issue(ctx context.Context, req CertRequest) (CertAnswer, error) {
	servers, err := a.log.Servers(ctx)
	if err != nil {
		return CertAnswer{}, err
	}
	for _, srv := range servers {
		if srv.ID == req.ID {
			return CertAnswer{}, fmt.Errorf("%w: %q is a current member: a member's certificate is issued only to that member, over its own certificate (a renewal). A node rebuilt without its data dir must first be removed: `pinnedd remove %s`", ErrRefused, req.ID, req.ID)
		}
	}
	return a.Sign(ctx, req)
}

// Sign signs req's certificate request with the cluster CA, whoever asks: the caller has
// checked that it may.
func (a *Authority) Sign(ctx context.Context, req CertRequest) (CertAnswer, error) {
	if req.ID == "" || req.CSR == "" {
		return CertAnswer{}, fmt.Errorf("%w: certificate needs id and csr (a PEM CERTIFICATE REQUEST)", ErrInvalid)
	}
	ca, err := a.issuerWait(ctx)
	if err != nil {
		return CertAnswer{}, err
	}
	cert, err := ca.SignCSR([]byte(req.CSR), req.ID)
	if err != nil {
		return CertAnswer{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return CertAnswer{Cert: string(cert), CA: string(ca.CertPEM())}, nil
}

// NeedsCertificate: the cluster runs its own CA and this node has no certificate yet (it
// must join with FetchCertificate first).
func (a *Authority) NeedsCertificate() bool { return a.ident != nil && !a.ident.Ready() }

// FetchCertificate gets this node's certificate from member (FetchIdentity), pinned by the
// deployment token.
func (a *Authority) FetchCertificate(ctx context.Context, m Member) error {
	return FetchIdentity(ctx, a.keys, a.ident, a.cfg.NodeID, a.cfg.Hosts, a.cfg.Tokens[0], m)
}

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

// State reports the cluster CAs as this node's replica has them, and its own certificate.
func (a *Authority) State() TLSState {
	var st TLSState
	bundle, _ := a.ledger.Trusted()
	certs, _ := clustertls.ParseCerts(bundle)
	for i, c := range certs {
		if i == 0 {
			st.Issuer = Fingerprint(c)
		}
		st.Trusted = append(st.Trusted, Fingerprint(c))
	}
	if a.ident != nil {
		if leaf, _, _ := a.ident.Leaf(); leaf != nil {
			st.Node, st.NodeExpires = leaf.Subject.CommonName, leaf.NotAfter
			if i := slices.IndexFunc(certs, func(c *x509.Certificate) bool { return leaf.CheckSignatureFrom(c) == nil }); i >= 0 {
				st.NodeIssuer = Fingerprint(certs[i])
			}
		}
	}
	return st
}
