package raftstore

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// minted is a client of the cluster port presenting a certificate ca issued for node (trusting
// any server: only the server's checks stand between it and the port).
func minted(t *testing.T, ca *clustertls.CA, node string) *http.Client {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(node, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{clusterport.ALPNHTTP}, InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil },
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// A rotation records a new CA; every member renews its certificate from it, the leader then
// retires the old CA, and a certificate minted from the old CA's key in a member's name (what
// a removed node holding that key could make) is refused from then on. The group replicates
// throughout, and a restarted member comes back on its new certificate.
func TestTLSRotateCA(t *testing.T) {
	seal := sealedTLS("secret")
	nodes := tlsClusterWith(t, 3, seal)
	n1 := nodes[0]
	mustApply(t, n1, "a")
	converged(t, nodes, []string{"a"})
	old := n1.s.fsm.cas.Issuer()
	if old == nil {
		t.Fatal("no cluster CA recorded")
	}
	before := minted(t, old, "n2")
	port := "https://" + nodes[2].s.RaftAddr() + HandlerPrefix + "members"
	resp, err := before.Get(port)
	if err != nil {
		t.Fatalf("before the rotation, a certificate from the CA is refused: %v", err)
	}
	resp.Body.Close()

	// Through a follower: it forwards to the leader.
	fp, err := RotateCAVia(ctxTimeout(t, 10*time.Second), nil, nodes[1].srv.URL, "secret")
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	testutil.WaitForErr(t, 20*time.Second, "every member on the new CA alone", func() error {
		for _, n := range nodes {
			st := n.s.ca.State()
			if st.Issuer != fp || !slices.Equal(st.Trusted, []string{fp}) || st.NodeIssuer != fp {
				return fmt.Errorf("%s: %+v", n.id, st)
			}
		}
		return nil
	})
	mustApply(t, leaderOf(t, nodes), "b")
	converged(t, nodes, []string{"a", "b"})
	if _, err := minted(t, old, "n2").Get(port); err == nil {
		t.Fatal("after the rotation, a certificate minted from the old CA's key is accepted")
	}
	// The retired CA's key is gone from the state, and so from the snapshots.
	for _, n := range nodes {
		recs, _ := n.s.fsm.cas.Records()
		for _, r := range recs {
			if r.Retired && r.Key != "" {
				t.Errorf("%s keeps the retired CA's key", n.id)
			}
		}
	}

	// A member restarted comes back with its renewed certificate and the new trust; so does
	// the node that created the retired CA (its key file names a CA no longer trusted).
	for i, want := range [][]string{{"a", "b", "c"}, {"a", "b", "c", "d"}} {
		n := nodes[2-2*i]
		addr := n.s.RaftAddr()
		n.close()
		nodes[2-2*i] = startNode(t, n.id, n.dir, addr, false, seal)
		mustApply(t, leaderOf(t, nodes), want[len(want)-1])
		converged(t, nodes, want)
	}
}

// A certificate nearing its end is renewed by its node, from the same CA, well before it
// expires.
func TestTLSCertificateRenewsBeforeItExpires(t *testing.T) {
	short := func(c *Config) {
		sealedTLS("secret")(c)
		tlsOpts(c).Validity = 3 * time.Second
	}
	n1 := startNode(t, "n1", t.TempDir(), "", true, short)
	waitLeader(t, n1)
	first, _, _ := n1.s.ca.Identity().Leaf()
	testutil.WaitFor(t, 10*time.Second, "a renewed certificate", func() bool {
		now, _, _ := n1.s.ca.Identity().Leaf()
		return now.NotAfter.After(first.NotAfter)
	})
	mustApply(t, n1, "a")
}

// A member down while the CA rotates catches up when it comes back: it still holds only the
// old CA and its old certificate, the others present the new one; the old CA stays trusted
// (not retired) until it too renewed.
func TestTLSRotateCAWithAMemberDown(t *testing.T) {
	seal := sealedTLS("secret")
	nodes := tlsClusterWith(t, 3, seal)
	n1 := nodes[0]
	mustApply(t, n1, "a")
	converged(t, nodes, []string{"a"})
	down := nodes[2]
	addr := down.s.RaftAddr()
	down.close()

	fp, err := RotateCAVia(ctxTimeout(t, 10*time.Second), nil, n1.srv.URL, "secret")
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	testutil.WaitForErr(t, 10*time.Second, "the members up renewed", func() error {
		for _, n := range nodes[:2] {
			if st := n.s.ca.State(); st.NodeIssuer != fp {
				return fmt.Errorf("%s: %+v", n.id, st)
			}
		}
		return nil
	})
	if st := n1.s.ca.State(); len(st.Trusted) != 2 {
		t.Fatalf("the old CA was retired with a member still on it: %+v", st)
	}
	mustApply(t, leaderOf(t, nodes[:2]), "b")

	nodes[2] = startNode(t, "n3", down.dir, addr, false, seal)
	converged(t, nodes, []string{"a", "b"})
	testutil.WaitForErr(t, 20*time.Second, "every member on the new CA alone", func() error {
		for _, n := range nodes {
			st := n.s.ca.State()
			if !slices.Equal(st.Trusted, []string{fp}) || st.NodeIssuer != fp {
				return fmt.Errorf("%s: %+v", n.id, st)
			}
		}
		return nil
	})
}
