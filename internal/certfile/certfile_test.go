package certfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

func issue(t *testing.T, ca *clustertls.CA, dir, name string) (certPath, keyPath string) {
	t.Helper()
	cert, key, err := ca.Issue(name, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "front.pem"), filepath.Join(dir, "front-key.pem")
	if err := os.WriteFile(certPath, cert, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// newCA is a CA and a pair it issued for "first", in dir.
func newCA(t *testing.T) (ca *clustertls.CA, dir, certPath, keyPath string) {
	t.Helper()
	dir = t.TempDir()
	ca, err := clustertls.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = issue(t, ca, dir, "first")
	return ca, dir, certPath, keyPath
}

func served(t *testing.T, p *Pair) string {
	t.Helper()
	c, err := p.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.Subject.CommonName
}

// A renewed pair is served once its files change, without a restart; a
// half-written renewal (a new certificate, the old key) keeps the working
// pair until the key follows.
func TestReloadsWhenTheFilesChange(t *testing.T) {
	ca, _, certPath, keyPath := newCA(t)
	p, err := Load(certPath, keyPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := served(t, p); got != "first" {
		t.Fatalf("serves %q", got)
	}

	newCert, newKey, err := ca.Issue("second", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, newCert, 0o644); err != nil {
		t.Fatal(err)
	}
	// The next handshake looks: the mismatched pair is seen and refused.
	p.mu.Lock()
	p.checked = time.Time{}
	p.mu.Unlock()
	if got := served(t, p); got != "first" {
		t.Fatalf("a certificate without its key: serves %q, want the previous pair", got)
	}
	if err := os.WriteFile(keyPath, newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the renewed pair served", func() bool { return served(t, p) == "second" })
}

// Reload reads the files now; a broken pair is refused and the working one
// kept.
func TestReload(t *testing.T) {
	ca, dir, certPath, keyPath := newCA(t)
	p, err := Load(certPath, keyPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(); err == nil {
		t.Fatal("a broken certificate reloaded")
	}
	if got := served(t, p); got != "first" {
		t.Fatalf("after a failed reload serves %q", got)
	}
	// An expired pair is refused on reload as at start.
	oldCert, oldKey := expired(t, t.TempDir())
	for src, dst := range map[string]string{oldCert: certPath, oldKey: keyPath} {
		b, _ := os.ReadFile(src)
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Reload(); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("reload of an expired pair: %v", err)
	}
	if got := served(t, p); got != "first" {
		t.Fatalf("after an expired reload serves %q", got)
	}
	issue(t, ca, dir, "third")
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := served(t, p); got != "third" {
		t.Fatalf("after reload serves %q", got)
	}
}

func TestLoadRefuses(t *testing.T) {
	ca, dir, certPath, keyPath := newCA(t)
	_, otherKey, _ := ca.Issue("other", nil)
	mismatched := filepath.Join(dir, "other-key.pem")
	_ = os.WriteFile(mismatched, otherKey, 0o600)
	expiredCert, expiredKey := expired(t, dir)
	for _, tc := range []struct {
		name, cert, key, want string
	}{
		{"missing cert", filepath.Join(dir, "nope.pem"), keyPath, "no such file"},
		{"missing key", certPath, filepath.Join(dir, "nope.pem"), "no such file"},
		{"not a pair", certPath, mismatched, "does not match"},
		{"expired", expiredCert, expiredKey, "expired at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.cert, tc.key, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func expired(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "old"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "old.pem"), filepath.Join(dir, "old-key.pem")
	_ = os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	_ = os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
	return certPath, keyPath
}
