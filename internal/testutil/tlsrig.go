package testutil

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// NewCA is a cluster CA named name.
func NewCA(t testing.TB, name string) *clustertls.CA {
	t.Helper()
	ca, err := clustertls.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Identity is node's identity under ca, for 127.0.0.1.
func Identity(t testing.TB, ca *clustertls.CA, node string) *clustertls.Identity {
	t.Helper()
	cert, key, err := ca.Issue(node, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	id := &clustertls.Identity{}
	if err := id.Set(ca.CertPEM(), cert, key); err != nil {
		t.Fatal(err)
	}
	return id
}

// Refused dials addr with cfg (nil: plain TCP), writes, and expects the server to close the
// connection without answering: the handshake fails, or the first read does.
func Refused(t testing.TB, addr string, cfg *tls.Config) error {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	var c net.Conn = raw
	if cfg != nil {
		tc := tls.Client(raw, cfg)
		if err := tc.Handshake(); err != nil {
			return err
		}
		c = tc
	}
	if _, err := c.Write([]byte("\x00forged append entries")); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 1))
	if err == nil {
		t.Fatalf("%s answered a peer it should have refused", addr)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s kept the connection open: %v", addr, err)
	}
	return err
}
