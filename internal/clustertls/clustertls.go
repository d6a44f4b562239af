// Package clustertls is the cluster's PKI: it creates the cluster CA (ECDSA P-256), issues node
// certificates (directly, or from a node's certificate request), keeps them in a directory,
// pins a CA to the deployment token, and holds a node's live identity for its TLS
// configurations. A node's id is its certificate's CommonName.
//
// It never opens a connection and never decides who is a member: the Raft transport
// (raftstore) does that with the configurations built here.
package clustertls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinel errors; returned errors wrap them.
var (
	// ErrBadPEM means a file or field does not hold the PEM block expected.
	ErrBadPEM = errors.New("clustertls: bad PEM")
	// ErrBadCSR means a certificate request is malformed, badly signed or names another node.
	ErrBadCSR = errors.New("clustertls: bad certificate request")
	// ErrPinMismatch means a CA did not come with the pin the deployment token gives it.
	ErrPinMismatch = errors.New("clustertls: CA pin mismatch")
	// ErrUntrusted means a certificate does not chain to the cluster CA (or does not fit its key).
	ErrUntrusted = errors.New("clustertls: certificate not from the cluster CA")
	// ErrNoIdentity means the node has no certificate yet.
	ErrNoIdentity = errors.New("clustertls: this node has no cluster certificate yet")
)

// Validity of what this package issues. A CA is long-lived (it is replaced by a rotation, not
// by expiry); a node's certificate is short-lived by default and renewed automatically
// (raftstore), so a key that leaked, or a node that left, stops counting soon.
const (
	CAValidity          = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 30 * 24 * time.Hour
)

// File names in a node's TLS directory (<data-dir>/tls).
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem" // only where the CA was created (the bootstrap node, `pinnedd tls ca create`)
	CertFile  = "node.pem"
	// PrevCertFile is the certificate node.pem replaced, kept through a CA rotation.
	PrevCertFile = "node-prev.pem"
	KeyFile      = "node-key.pem"
)

// CA is a certificate authority: its certificate and private key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// NodeValidity is how long the certificates it issues hold (DefaultNodeValidity if 0), at
	// most until the CA itself expires. Set it before the CA is shared.
	NodeValidity time.Duration
	certPEM      []byte
	keyPEM       []byte
}

// NewCA creates a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("clustertls: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"pinnedd"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("clustertls: CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
}

// ParseCA reads a CA from its PEM certificate and PEM private key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrUntrusted, cert.Subject.CommonName)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: the CA key does not match the CA certificate", ErrUntrusted)
	}
	return &CA{Cert: cert, Key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// CAFromBundle is the CA of the bundle's certificates whose public key keyPEM's key is
// (a bundle holds the CAs trusted through a rotation), ErrUntrusted if none.
func CAFromBundle(bundle, keyPEM []byte) (*CA, error) {
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCerts(bundle)
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		if key.PublicKey.Equal(c.PublicKey) {
			return ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), keyPEM)
		}
	}
	return nil, fmt.Errorf("%w: no CA trusted has this key", ErrUntrusted)
}

// CertPEM is the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// KeyPEM is the CA private key, PEM-encoded.
func (ca *CA) KeyPEM() []byte { return ca.keyPEM }

// Issue makes a key and a certificate for nodeID (its CommonName), valid for client and server
// authentication, with hosts (IPs or DNS names) as SANs.
func (ca *CA) Issue(nodeID string, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("clustertls: node key: %w", err)
	}
	dns, ips := splitHosts(hosts)
	certPEM, err = ca.sign(nodeID, key.Public(), dns, ips)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	return certPEM, keyPEM, err
}

// SignCSR checks a PEM certificate request (its signature, and that it names nodeID) and issues
// the certificate for its key, keeping its DNS and IP SANs.
func (ca *CA) SignCSR(csrPEM []byte, nodeID string) ([]byte, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: want a PEM CERTIFICATE REQUEST", ErrBadCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if csr.Subject.CommonName != nodeID {
		return nil, fmt.Errorf("%w: it names node %q, the join names %q", ErrBadCSR, csr.Subject.CommonName, nodeID)
	}
	if _, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("%w: want an ECDSA key", ErrBadCSR)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses) > 16 {
		return nil, fmt.Errorf("%w: more than 16 names", ErrBadCSR)
	}
	return ca.sign(nodeID, csr.PublicKey, csr.DNSNames, csr.IPAddresses)
}

func (ca *CA) sign(nodeID string, pub crypto.PublicKey, dns []string, ips []net.IP) ([]byte, error) {
	if nodeID == "" {
		return nil, fmt.Errorf("%w: empty node id", ErrBadCSR)
	}
	now := time.Now()
	validity := ca.NodeValidity
	if validity <= 0 {
		validity = DefaultNodeValidity
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: nodeID, Organization: []string{"pinnedd"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("clustertls: signing %s: %w", nodeID, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// NewKey makes a node's private key, PEM-encoded.
func NewKey() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("clustertls: node key: %w", err)
	}
	return encodeKey(key)
}

// NewCSR makes a PEM certificate request for nodeID with the PEM key.
func NewCSR(keyPEM []byte, nodeID string, hosts []string) ([]byte, error) {
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	dns, ips := splitHosts(hosts)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: nodeID}, DNSNames: dns, IPAddresses: ips,
	}, key)
	if err != nil {
		return nil, fmt.Errorf("clustertls: certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// Pin is what the deployment token says about a CA: hex HMAC-SHA256 over the CA certificate,
// keyed by the token stretched with PBKDF2 (PinKey). A joining node that holds the token checks
// it before it trusts a CA, so a CA that someone in between substituted is refused without the
// token ever being sent.
//
// The pin is public (GET /_raft/ca answers it to anyone, since a joining node must check the
// CA before it sends the token), so it is also a way to test guesses of the token offline; the
// stretching makes each guess cost PinIterations rounds of HMAC-SHA256 instead of one.
//
// caPEM may be a bundle (the CAs trusted during a rotation): the pin covers every certificate
// in it, in order.
func Pin(token string, caPEM []byte) (string, error) {
	certs, err := ParseCerts(caPEM)
	if err != nil {
		return "", err
	}
	key, err := PinKey(token)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("pinnedd cluster CA\x00"))
	for _, c := range certs {
		m.Write(c.Raw)
	}
	return hex.EncodeToString(m.Sum(nil)), nil
}

// PinIterations is PBKDF2's work for PinKey: about 50-100 ms once per process and token on
// one core.
const PinIterations = 200_000

// pinKeys caches PinKey by token: a member answers GET /_raft/ca to anyone, and must not
// spend the stretching on each request.
var pinKeys sync.Map

// PinKey is the token stretched for Pin: PBKDF2-HMAC-SHA256 with PinIterations rounds.
func PinKey(token string) ([]byte, error) {
	if k, ok := pinKeys.Load(token); ok {
		return k.([]byte), nil
	}
	k, err := pbkdf2.Key(sha256.New, token, []byte("pinnedd cluster CA pin"), PinIterations, sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("clustertls: pin key: %w", err)
	}
	pinKeys.Store(token, k)
	return k, nil
}

// CheckPin verifies pin against token and caPEM.
func CheckPin(token string, caPEM []byte, pin string) error {
	want, err := Pin(token, caPEM)
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(want), []byte(pin)) {
		return ErrPinMismatch
	}
	return nil
}

// ParseCert reads the first PEM CERTIFICATE block.
func ParseCert(certPEM []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: want a PEM CERTIFICATE", ErrBadPEM)
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPEM, err)
	}
	return cert, nil
}

// ParseCerts reads every PEM CERTIFICATE block of a bundle (at least one).
func ParseCerts(bundle []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPEM, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no CERTIFICATE block", ErrBadPEM)
	}
	return out, nil
}

// ParseKey reads a PEM ECDSA private key (SEC 1 "EC PRIVATE KEY" or PKCS #8).
func ParseKey(keyPEM []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, fmt.Errorf("%w: want a PEM private key", ErrBadPEM)
	}
	switch b.Type {
	case "EC PRIVATE KEY":
		k, err := x509.ParseECPrivateKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPEM, err)
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPEM, err)
		}
		if ek, ok := k.(*ecdsa.PrivateKey); ok {
			return ek, nil
		}
		return nil, fmt.Errorf("%w: want an ECDSA key, got %T", ErrBadPEM, k)
	}
	return nil, fmt.Errorf("%w: unexpected PEM block %q", ErrBadPEM, b.Type)
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("clustertls: encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func splitHosts(hosts []string) (dns []string, ips []net.IP) {
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	return dns, ips
}

// WriteFile writes data to path atomically (a temporary file renamed over it) with mode.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("clustertls: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("clustertls: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("clustertls: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("clustertls: writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("clustertls: writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("clustertls: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("clustertls: %w", err)
	}
	return nil
}

// Identity is a node's live TLS identity: the cluster CA it trusts and its own certificate. It
// may start empty (a node waiting for its certificate from a join) and be set later; TLS
// configurations built from it read the current value at every handshake.
type Identity struct {
	cur atomic.Pointer[material]
}

type material struct {
	cert            tls.Certificate
	leaf            *x509.Certificate
	pool            *x509.CertPool
	caPEM           []byte
	certPEM, keyPEM []byte
	nodeID          string
	// prev is the certificate this one replaced, for its key, while a CA trusted issued it:
	// presented to a peer that trusts only that CA (one that was down through a rotation, so
	// that it can catch up).
	prev    *tls.Certificate
	prevPEM []byte
}

// Set installs the CAs trusted (a PEM bundle: one CA, or the old and the new during a
// rotation) and this node's certificate and key (PEM), after checking that the certificate
// chains to one of the CAs and fits the key.
func (id *Identity) Set(caPEM, certPEM, keyPEM []byte) error {
	cas, err := ParseCerts(caPEM)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("%w: %w", ErrBadPEM, err)
		}
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	if leaf.Subject.CommonName == "" {
		return fmt.Errorf("%w: the certificate names no node (empty CommonName)", ErrUntrusted)
	}
	m := &material{cert: pair, leaf: leaf, pool: pool, caPEM: caPEM, certPEM: certPEM, keyPEM: keyPEM, nodeID: leaf.Subject.CommonName}
	if old := id.cur.Load(); old != nil && old.prevPEM != nil {
		_ = m.setPrevious(old.prevPEM) // kept while it fits the key and a CA trusted
	}
	id.cur.Store(m)
	return nil
}

// SetPrevious keeps certPEM, the certificate this node's current one replaced (for the same
// key, from a CA still trusted), to present to a peer that trusts only the CA that issued it;
// nil drops it. It is dropped by Set once its CA is no longer trusted.
func (id *Identity) SetPrevious(certPEM []byte) error {
	cur := id.cur.Load()
	if cur == nil {
		return ErrNoIdentity
	}
	m := *cur
	m.prev, m.prevPEM = nil, nil
	if certPEM != nil {
		if err := m.setPrevious(certPEM); err != nil {
			return err
		}
	}
	id.cur.Store(&m)
	return nil
}

// Previous is the previous certificate's PEM kept (SetPrevious), or nil.
func (id *Identity) Previous() []byte {
	if m := id.cur.Load(); m != nil {
		return m.prevPEM
	}
	return nil
}

func (m *material) setPrevious(certPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, m.keyPEM)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: m.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	m.prev, m.prevPEM = &pair, certPEM
	return nil
}

// Leaf is the installed certificate, its PEM and its key's PEM; nil if none.
func (id *Identity) Leaf() (leaf *x509.Certificate, certPEM, keyPEM []byte) {
	if m := id.cur.Load(); m != nil {
		return m.leaf, m.certPEM, m.keyPEM
	}
	return nil, nil, nil
}

// Trusts reports whether c chains to a CA the identity trusts now.
func (id *Identity) Trusts(c *x509.Certificate) bool {
	m := id.cur.Load()
	if m == nil || c == nil {
		return false
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: m.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}})
	return err == nil
}

// Ready reports whether a certificate is installed.
func (id *Identity) Ready() bool { return id.cur.Load() != nil }

// NodeID is the installed certificate's node id, or "".
func (id *Identity) NodeID() string {
	if m := id.cur.Load(); m != nil {
		return m.nodeID
	}
	return ""
}

// CAPEM is the installed CA bundle, or nil.
func (id *Identity) CAPEM() []byte {
	if m := id.cur.Load(); m != nil {
		return m.caPEM
	}
	return nil
}

// ServerConfig accepts only TLS 1.3 clients that present a certificate from the cluster CA,
// offering the application protocols protos (ALPN) in order of preference. Until a certificate
// is installed every handshake fails.
func (id *Identity) ServerConfig(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := id.cur.Load()
			if m == nil {
				return nil, ErrNoIdentity
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				NextProtos:   protos,
				Certificates: []tls.Certificate{m.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.pool,
			}, nil
		},
	}
}

// ClientConfig presents this node's certificate and accepts only a server certificate from the
// cluster CA, asking for the application protocol proto (ALPN; "" none). It reads the identity
// at every handshake, so one config serves for the process's life (a joining node gets its
// certificate later; its session cache lets reconnects skip the full handshake). Node
// addresses come from the Raft configuration, not from names, so no host name is checked: the
// CA is the trust, the certificate's CommonName the node.
func (id *Identity) ClientConfig(proto string) *tls.Config {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyConnection: the chain, not the name
		ClientSessionCache: tls.NewLRUClientSessionCache(64),
		GetClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m := id.cur.Load()
			if m == nil {
				return nil, ErrNoIdentity
			}
			if m.prev != nil && cri.SupportsCertificate(&m.cert) != nil && cri.SupportsCertificate(m.prev) == nil {
				return m.prev, nil // a peer that trusts only the CA before a rotation
			}
			return &m.cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			m := id.cur.Load()
			if m == nil {
				return ErrNoIdentity
			}
			return verifyChain(cs, m.pool, x509.ExtKeyUsageServerAuth)
		},
	}
	if proto != "" {
		cfg.NextProtos = []string{proto}
	}
	return cfg
}

func verifyChain(cs tls.ConnectionState, pool *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: the peer sent no certificate", ErrUntrusted)
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	return nil
}

// PeerNodeID is the node id of a verified TLS peer (its certificate's CommonName).
func PeerNodeID(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}
