// Package certfile owns a TLS certificate pair kept in files (the front
// door's --http-tls-cert and --http-tls-key): loaded at startup, reloaded
// when the files change or on demand (SIGHUP), so a renewed certificate
// needs no restart. A reload that fails keeps the pair that works.
package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// checkEvery bounds how often a handshake looks at the files: a stat of
// two files once a second, whatever the handshake rate.
const checkEvery = time.Second

// Pair is a certificate and its key, read from two files.
type Pair struct {
	certPath, keyPath string
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   stamp     // of the files cur was read from
	checked time.Time // the files' last look
	failed  stamp     // a pair that did not load, not retried until it changes
}

// stamp identifies a version of the two files.
type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// Load reads the pair, or says why it cannot serve (unreadable, not a
// matching pair, expired: what a reload refuses too).
func Load(certPath, keyPath string, log *slog.Logger) (*Pair, error) {
	if log == nil {
		log = slog.Default()
	}
	p := &Pair{certPath: certPath, keyPath: keyPath, log: log}
	st, err := p.stat()
	if err != nil {
		return nil, err
	}
	c, err := p.read()
	if err != nil {
		return nil, err
	}
	p.cur, p.stamp, p.checked = c, st, time.Now()
	return p, nil
}

// GetCertificate is tls.Config's: the current pair, reloaded first if its
// files changed since the last look (at most once per checkEvery).
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.checked) >= checkEvery {
		p.checked = now
		if st, err := p.stat(); err == nil && st != p.stamp && st != p.failed {
			p.reloadLocked(st, "the files changed")
		}
	}
	return p.cur, nil
}

// Reload reads the files again now (SIGHUP), whether or not they changed.
func (p *Pair) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, err := p.stat()
	if err != nil {
		p.log.Error("front door certificate not reloaded; serving the previous one", "err", err)
		return err
	}
	return p.reloadLocked(st, "reload asked")
}

func (p *Pair) reloadLocked(st stamp, why string) error {
	c, err := p.read()
	if err != nil {
		// A renewal caught between writing the certificate and its key
		// fails here; the next change (the key written) loads.
		p.failed = st
		p.log.Error("front door certificate not reloaded; serving the previous one", "why", why, "err", err)
		return err
	}
	p.cur, p.stamp, p.failed = c, st, stamp{}
	p.log.Info("front door certificate loaded", "why", why, "cert", p.certPath,
		"subject", c.Leaf.Subject.String(), "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// NotAfter is when the certificate served now expires.
func (p *Pair) NotAfter() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur.Leaf.NotAfter
}

// ServerConfig is a server tls.Config serving the pair, with HTTP/2 and
// HTTP/1.1 offered by ALPN.
func (p *Pair) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: p.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

func (p *Pair) read() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(p.certPath, p.keyPath)
	if err != nil {
		return nil, fmt.Errorf("load %s and %s: %w", p.certPath, p.keyPath, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse %s: %w", p.certPath, err)
		}
	}
	if c.Leaf.NotAfter.Before(time.Now()) { // at start and on every reload
		return nil, fmt.Errorf("certificate %s expired at %s", p.certPath, c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return &c, nil
}

func (p *Pair) stat() (stamp, error) {
	ci, err1 := os.Stat(p.certPath)
	ki, err2 := os.Stat(p.keyPath)
	if err := errors.Join(err1, err2); err != nil {
		return stamp{}, err
	}
	return stamp{certMod: ci.ModTime(), keyMod: ki.ModTime(), certSize: ci.Size(), keySize: ki.Size()}, nil
}

// Roots is the pool that verifies a server: the system roots and the CA
// certificates in file (a private CA, as `pinnedd tls ca create` makes),
// and those certificates as read; nil, nil, meaning the system roots
// alone, if file is "".
func Roots(file string) (*x509.CertPool, []byte, error) {
	if file == "" {
		return nil, nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, nil, fmt.Errorf("%s: no PEM certificate in it", file)
	}
	return pool, data, nil
}

// Verify checks that the certificate served now is valid for host under
// roots (nil: the system roots), with the intermediates its file holds.
func (p *Pair) Verify(roots *x509.CertPool, host string) error {
	p.mu.Lock()
	c := p.cur
	p.mu.Unlock()
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	_, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host})
	return err
}
