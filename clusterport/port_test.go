package clusterport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"

	"github.com/hashicorp/raft"
)

func testLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The stream layer hands raft only connections with a certificate from the cluster CA whose
// node passes the membership check: a peer without TLS, without a client certificate, with a
// certificate from another CA or of a non-member is closed before raft reads a byte.
func TestTLSStreamAcceptsOnlyClusterMembers(t *testing.T) {
	ca := testutil.NewCA(t, "cluster")
	server := testutil.Identity(t, ca, "server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	member := func(id string) error {
		if id == "member" {
			return nil
		}
		return fmt.Errorf("node %q is not a member", id)
	}
	st := New(ln, ln.Addr(), server, Options{Admit: member, MemberHost: func(string) bool { return true }, Logger: testLogger()})
	defer st.Close()
	addr := ln.Addr().String()

	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := st.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	// A member's name from another CA; it trusts any server, so only the server can refuse.
	evilCert, evilKey, err := testutil.NewCA(t, "evil").Issue("member", nil)
	if err != nil {
		t.Fatal(err)
	}
	evilPair, err := tls.X509KeyPair(evilCert, evilKey)
	if err != nil {
		t.Fatal(err)
	}
	otherCA := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		// Sent whatever CAs the server asks for (Go's client would otherwise send none).
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &evilPair, nil }}
	removed := testutil.Identity(t, ca, "removed").ClientConfig(ALPNRaft)
	for name, cfg := range map[string]*tls.Config{"plain tcp": nil, "no certificate": noCert, "another CA": otherCA, "a non-member": removed} {
		err := testutil.Refused(t, addr, cfg)
		t.Logf("%s: refused: %v", name, err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("raft was handed a refused connection from %s", c.RemoteAddr())
	default:
	}

	// A member's certificate gets through, both ways verified (Dial checks the server's).
	memberID := testutil.Identity(t, ca, "member")
	good := &Port{id: memberID, dialCfg: memberID.ClientConfig(ALPNRaft)}
	c, err := good.Dial(raft.ServerAddress(addr), 2*time.Second)
	if err != nil {
		t.Fatalf("member dial: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	var in net.Conn
	select {
	case in = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the member's connection was not accepted")
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(in, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}

	// The server's side too: a dialer refuses a server whose certificate is from another CA.
	evilLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	evil := New(evilLn, evilLn.Addr(), testutil.Identity(t, testutil.NewCA(t, "evil"), "evil"), Options{Admit: func(string) error { return nil }, MemberHost: func(string) bool { return true }, Logger: testLogger()})
	defer evil.Close()
	if c, err := good.Dial(raft.ServerAddress(evilLn.Addr().String()), 2*time.Second); err == nil {
		c.Close()
		t.Fatal("dialed a server with a certificate from another CA")
	}

	// A membership change closes what a removed node opened before.
	st.Sweep(func(id string) bool { return id != "member" })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("the swept connection is still open: %v", err)
	}
}
