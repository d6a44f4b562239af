package raftstore

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/clusterport"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/clustertls"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// clusterOpts are the cluster port settings a test node's mods asked for (tlsOn, sealedTLS,
// ...), by the Config they modify: startNodeSM builds the node's Cluster from them and the
// final Config (withCluster), as the agent does from its flags.
var clusterOpts sync.Map // *Config -> *clusterport.Config

// tlsOn runs the node on a cluster port with the cluster's own CA.
func tlsOn(c *Config) { tlsOpts(c) }

// tlsOpts are c's cluster port settings, turning the cluster port on.
func tlsOpts(c *Config) *clusterport.Config {
	v, _ := clusterOpts.LoadOrStore(c, &clusterport.Config{})
	return v.(*clusterport.Config)
}

// withCluster gives c the Cluster its mods asked for, if any.
func withCluster(c *Config) {
	v, ok := clusterOpts.LoadAndDelete(c)
	if !ok {
		return
	}
	cc := *v.(*clusterport.Config)
	cc.NodeID, cc.DataDir, cc.Addr, cc.Bootstrap = c.NodeID, c.DataDir, c.RaftAddr, c.Bootstrap
	cc.Tokens, cc.Logger = joinTokens(*c), c.Logger
	c.Cluster = clusterport.NewCluster(cc)
	builtFrom.Store(c.Cluster, cc)
}

// builtFrom is each test Cluster's settings, for reopen.
var builtFrom sync.Map // *clusterport.Cluster -> clusterport.Config

// reopen is c for another Open of its node: a cluster port opens once, so a new one with the
// same settings.
func reopen(c Config) Config {
	if v, ok := builtFrom.Load(c.Cluster); ok {
		c.Cluster = clusterport.NewCluster(v.(clusterport.Config))
	}
	return c
}

// joinTLS joins n through the member at url as the agent does: with the cluster's own CA, the
// node first gets its certificate (pinned by the token).
func joinTLS(t testing.TB, url string, n *testNode) {
	t.Helper()
	ctx := ctxTimeout(t, 20*time.Second)
	for {
		err := n.s.JoinCluster(ctx, nil, url)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrOutcomeUnknown) || ctx.Err() != nil {
			t.Fatalf("join %s via %s: %v", n.id, url, err)
		}
	}
}

// tlsCluster is size nodes over mutual TLS, formed by the common path: n1 bootstraps, the
// others join through it.
func tlsCluster(t *testing.T, size int) []*testNode { return tlsClusterWith(t, size, tlsOn) }

// tlsClusterWith is tlsCluster with mod (which turns TLS on) applied to every node.
func tlsClusterWith(t *testing.T, size int, mod func(*Config)) []*testNode {
	t.Helper()
	n1 := startNode(t, "n1", t.TempDir(), "", true, mod)
	waitLeader(t, n1)
	nodes := []*testNode{n1}
	for i := 2; i <= size; i++ {
		n := startNode(t, fmt.Sprintf("n%d", i), t.TempDir(), "", false, mod)
		joinTLS(t, n1.srv.URL, n)
		nodes = append(nodes, n)
	}
	return nodes
}

// The common path: the bootstrap node creates the CA, joining nodes get certificates through
// the join, the group replicates over mutual TLS; a forged AppendEntries from raft's own TCP
// transport is refused and changes no leader; a removed node's certificate is refused; a
// restarted node reuses its stored certificate.
func TestTLSClusterBootstrapJoinRefuse(t *testing.T) {
	nodes := tlsCluster(t, 3)
	n1 := nodes[0]
	for _, n := range nodes {
		waitLeader(t, n)
		if got := n.s.ca.Mode(); got != "mutual-tls" {
			t.Fatalf("%s: ClusterTLS %q", n.id, got)
		}
	}
	mustApply(t, n1, "a")
	converged(t, nodes, []string{"a"})
	for _, n := range nodes {
		testutil.WaitForErr(t, 5*time.Second, n.id+" holds the cluster CA", func() error {
			if ca := n.s.fsm.cas.Issuer(); ca == nil || !bytes.Equal(ca.CertPEM(), n1.s.ca.Identity().CAPEM()) {
				return errors.New("not recorded")
			}
			return nil
		})
	}
	if _, err := os.Stat(filepath.Join(nodes[1].dir, "tls", clustertls.CAKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a joined node has the CA key file: %v", err)
	}

	leader := leaderOf(t, nodes)
	follower := followerOf(nodes, leader)
	term := leader.s.raft.CurrentTerm()

	// hashicorp/raft's own transport, no certificate: the AppendEntries that once made a
	// follower follow "evil".
	forger, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	var resp raft.AppendEntriesResponse
	err = forger.AppendEntries("evil", raft.ServerAddress(follower.s.RaftAddr()), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte(forger.LocalAddr())},
		Term:      term + 1, PrevLogEntry: follower.s.AppliedIndex(), PrevLogTerm: term,
		Entries: []*raft.Log{{Type: raft.LogCommand, Data: []byte{kindUser, 'x'}}},
	}, &resp)
	if err == nil {
		t.Fatalf("the forged AppendEntries was answered: %+v", resp)
	}
	mustApply(t, leader, "b")
	converged(t, nodes, []string{"a", "b"})
	if id, _ := follower.s.Leader(); id != leader.id || leader.s.raft.CurrentTerm() != term {
		t.Fatalf("after the forgery: %s follows %q at term %d, want %s at %d", follower.id, id, leader.s.raft.CurrentTerm(), leader.id, term)
	}

	// A removed node's certificate no longer opens a connection.
	gone := nodes[2]
	if gone == leader {
		gone = nodes[1]
	}
	goneCfg := gone.s.ca.Identity().ClientConfig(clusterport.ALPNRaft)
	if err := leader.s.Remove(ctxTimeout(t, 10*time.Second), gone.id); err != nil {
		t.Fatal(err)
	}
	gone.close()
	if err := testutil.Refused(t, leader.s.RaftAddr(), goneCfg); err == nil {
		t.Fatal("no error")
	}

	// A restart reuses the stored certificate.
	var restart *testNode
	for _, n := range nodes {
		if n != leader && n != gone {
			restart = n
		}
	}
	certPath := filepath.Join(restart.dir, "tls", clustertls.CertFile)
	before, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	addr := restart.s.RaftAddr()
	restart.close()
	back := startNode(t, restart.id, restart.dir, addr, false, tlsOn)
	mustApply(t, leader, "c")
	converged(t, []*testNode{leader, back}, []string{"a", "b", "c"})
	after, err := os.ReadFile(certPath)
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the certificate changed on restart (%v)", err)
	}
}

// A joining node refuses a CA its token does not vouch for, before it sends the token.
func TestTLSJoinRefusesACAOfAnotherToken(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, tlsOn)
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, func(c *Config) { tlsOn(c); c.Token = "another" })
	err := n2.s.JoinCluster(ctxTimeout(t, 10*time.Second), nil, n1.srv.URL)
	if !errors.Is(err, ErrUntrustedCA) {
		t.Fatalf("join with another token: %v, want ErrUntrustedCA", err)
	}
	if n2.s.ca.Identity().Ready() {
		t.Fatal("n2 installed a certificate")
	}
	if ms := membersByID(t, n1); len(ms) != 1 {
		t.Fatalf("members %v", ms)
	}
}

// During a rotation of the node key, a member listing both values admits a node that joins
// with the new one (its proof checks, its CA pin matches), while a member that knows only the
// old one still refuses it.
func TestTLSJoinWithARotatedToken(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, func(c *Config) { tlsOn(c); c.JoinTokens = []string{"secret", "next-secret"} })
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, func(c *Config) { tlsOn(c); c.Token = "next-secret" })
	joinTLS(t, n1.srv.URL, n2)
	if ms := membersByID(t, n1); len(ms) != 2 {
		t.Fatalf("members %v", ms)
	}

	old := startNode(t, "n3", t.TempDir(), "", true, tlsOn) // knows "secret" alone
	waitLeader(t, old)
	n4 := startNode(t, "n4", t.TempDir(), "", false, func(c *Config) { tlsOn(c); c.Token = "next-secret" })
	if err := n4.s.JoinCluster(ctxTimeout(t, 10*time.Second), nil, old.srv.URL); !errors.Is(err, ErrUntrustedCA) {
		t.Fatalf("join with a token the member does not list: %v, want ErrUntrustedCA", err)
	}
}

// Bring-your-own PKI: nodes given the CA, certificate and key files form a group over mutual
// TLS without the cluster's own CA (none is recorded, none issued); a certificate that names
// another node is refused at Open.
func TestTLSOwnPKI(t *testing.T) {
	ca := testutil.NewCA(t, "own")
	files := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(files, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.CertPEM())
	own := func(node string) func(*Config) {
		cert, key, err := ca.Issue(node, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, k := write(node+".pem", cert), write(node+"-key.pem", key)
		return func(cfg *Config) {
			o := tlsOpts(cfg)
			o.CAFile, o.CertFile, o.KeyFile = caFile, c, k
		}
	}
	n1 := startNode(t, "n1", t.TempDir(), "", true, own("n1"))
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, own("n2"))
	joinTLS(t, n1.srv.URL, n2)
	mustApply(t, n1, "a")
	converged(t, []*testNode{n1, n2}, []string{"a"})
	if n1.s.fsm.cas.Issuer() != nil || n1.s.ca.Mode() != "mutual-tls (own PKI)" {
		t.Fatalf("own PKI recorded a CA (%v) or reports %q", n1.s.fsm.cas.Issuer() != nil, n1.s.ca.Mode())
	}
	if _, err := os.Stat(filepath.Join(n1.dir, "tls")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("own PKI made %s/tls: %v", n1.dir, err)
	}
	wrong := own("n9")
	cfg := fastConfig(Config{NodeID: "n3", RaftAddr: "127.0.0.1:0", APIAddr: "http://127.0.0.1:1", DataDir: t.TempDir()})
	wrong(&cfg)
	withCluster(&cfg)
	if s, err := Open(t.Context(), cfg, &listSM{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `"n9"`) {
		if s != nil {
			_ = s.Close(t.Context())
		}
		t.Fatalf("a certificate of another node: %v", err)
	}
}

// A join through a member that is still joining itself waits for that member to receive the
// CA (as its forward waits for a leader), as the README's `pinnedd join` through n2 does.
func TestTLSJoinThroughAJoiningMember(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, tlsOn)
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, tlsOn)
	n3 := startNode(t, "n3", t.TempDir(), "", false, tlsOn)
	done := make(chan error, 1)
	go func() { done <- n3.s.JoinCluster(ctxTimeout(t, 20*time.Second), nil, n2.srv.URL) }()
	joinTLS(t, n1.srv.URL, n2)
	if err := <-done; err != nil {
		t.Fatalf("join through n2: %v", err)
	}
	mustApply(t, n1, "a")
	converged(t, []*testNode{n1, n2, n3}, []string{"a"})
}

// The cluster port's HTTP: a member reaches Cluster.Serve's handler and raftstore's node-to-node
// RPCs, asking for it by ALPN or not (a proxy that cannot); a follower's Apply travels there;
// the public port refuses node-to-node RPCs whatever token they carry; a removed node's
// connection is closed and a new one refused.
func TestTLSClusterPortHTTP(t *testing.T) {
	nodes := tlsCluster(t, 3)
	leader := leaderOf(t, nodes)
	follower := followerOf(nodes, leader)
	if got := mustApply(t, follower, "via-peer"); got == "" {
		t.Fatal("no result")
	}
	converged(t, nodes, []string{"via-peer"})

	get := func(cfg *tls.Config, addr, path string) (int, string, error) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + addr + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	withALPN := follower.cfg.Cluster.PeerTLS()
	noALPN := withALPN.Clone()
	noALPN.NextProtos = nil
	for name, cfg := range map[string]*tls.Config{"alpn": withALPN, "no alpn": noALPN} {
		code, body, err := get(cfg, leader.s.RaftAddr(), "/x/y")
		if err != nil || code != 200 || body != "peer /x/y" {
			t.Fatalf("%s: %d %q %v", name, code, body, err)
		}
		code, body, err = get(cfg, leader.s.RaftAddr(), HandlerPrefix+"members")
		if err != nil || code != 200 || !strings.Contains(body, `"n3"`) {
			t.Fatalf("%s: members: %d %q %v", name, code, body, err)
		}
	}
	if addr, ok := follower.cfg.Cluster.PeerAddr(leader.id); !ok || addr != leader.s.RaftAddr() {
		t.Fatalf("PeerAddr(%s) = %q %v, want %s", leader.id, addr, ok, leader.s.RaftAddr())
	}
	if _, ok := follower.cfg.Cluster.PeerAddr("nobody"); ok {
		t.Fatal("PeerAddr of a non-member")
	}

	// The public port: apply, meta and a forwarded join are node-to-node, refused with the token.
	for _, op := range []string{"apply", "meta"} {
		_, err := doRPC(t.Context(), nil, leader.srv.URL, bearer("secret"), http.MethodPost, op, "application/json", []byte(`{}`), false)
		if !errors.Is(err, ErrForbidden) {
			t.Fatalf("%s on the public port: %v, want ErrForbidden", op, err)
		}
	}
	err := callJSON(t.Context(), nil, leader.srv.URL, bearer("secret"), "join", joinRequest{ID: "evil", RaftAddr: "127.0.0.1:1"}, nil, true)
	if !errors.Is(err, ErrForbidden) {
		t.Fatalf("a forwarded join on the public port: %v, want ErrForbidden", err)
	}

	// Removed: a request on its open connection is refused (and the connection closed), a new
	// connection is refused in the handshake.
	gone := nodes[2]
	if gone == leader {
		gone = nodes[1]
	}
	goneCfg := gone.cfg.Cluster.PeerTLS()
	tr := &http.Transport{TLSClientConfig: goneCfg}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + leader.s.RaftAddr() + "/before")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := leader.s.Remove(ctxTimeout(t, 10*time.Second), gone.id); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForErr(t, 5*time.Second, "the removed node refused", func() error {
		resp, err := c.Get("https://" + leader.s.RaftAddr() + "/after")
		if err != nil {
			return nil
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusForbidden && resp.Close {
			return nil
		}
		return fmt.Errorf("answered %d", resp.StatusCode)
	})
	if _, _, err := get(goneCfg, leader.s.RaftAddr(), "/new"); err == nil {
		t.Fatal("a removed node's new connection was served")
	}
}

// A joining node proves it holds the token instead of sending it: everything it sends to the
// member's public port (recorded here by a proxy) is free of the token, the join succeeds, and
// a proof moved onto another request, or a request without one, is refused.
func TestTLSJoinKeepsTheTokenHome(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, tlsOn)
	waitLeader(t, n1)
	target, err := url.Parse(n1.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	rp := httputil.NewSingleHostReverseProxy(target)
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dump, err := httputil.DumpRequest(r, true)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		seen = append(seen, string(dump))
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	defer spy.Close()

	n2 := startNode(t, "n2", t.TempDir(), "", false, tlsOn)
	joinTLS(t, spy.URL, n2)
	mustApply(t, n1, "a")
	converged(t, []*testNode{n1, n2}, []string{"a"})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 3 {
		t.Fatalf("the spy saw %d requests, want the CA, certificate and join", len(seen))
	}
	for _, req := range seen {
		if strings.Contains(req, "secret") {
			t.Fatalf("the join sent the token:\n%s", req)
		}
	}

	// A proof is good for its own request only.
	body, _ := json.Marshal(joinRequest{ID: "n2", RaftAddr: n2.s.RaftAddr()})
	proof, err := clustertls.JoinProof("secret", http.MethodPost, HandlerPrefix+"join", body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	evil, _ := json.Marshal(joinRequest{ID: "evil", RaftAddr: "127.0.0.1:1"})
	for name, hdr := range map[string]string{"a moved proof": proof, "a proof of another token": "1.00"} {
		req, _ := http.NewRequest(http.MethodPost, n1.srv.URL+HandlerPrefix+"join", bytes.NewReader(evil))
		req.Header.Set(joinProofHeader, hdr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: %d, want 401", name, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, n1.srv.URL+HandlerPrefix+"remove", strings.NewReader(`{"id":"n2"}`))
	req.Header.Set(joinProofHeader, proof)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a join proof on remove: %d, want 401", resp.StatusCode)
	}
	if ms := membersByID(t, n1); len(ms) != 2 || ms["evil"].ID != "" {
		t.Fatalf("members %v", ms)
	}
}
