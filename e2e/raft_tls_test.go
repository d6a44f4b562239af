package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// tlsDialer is a raft.StreamLayer that only dials, with cfg: hashicorp/raft's own transport
// driven by an attacker holding some certificate.
type tlsDialer struct{ cfg *tls.Config }

func (d tlsDialer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(addr), d.cfg)
}
func (tlsDialer) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (tlsDialer) Close() error              { return nil }
func (tlsDialer) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// forgeAppend sends the AppendEntries that once made a follower follow "evil" (a higher term,
// a log entry) to addr over trans, and returns raft's error (nil: it was answered).
func forgeAppend(trans raft.Transport, addr string, term uint64) error {
	var resp raft.AppendEntriesResponse
	return trans.AppendEntries("evil", raft.ServerAddress(addr), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte("127.0.0.1:1")},
		Term:      term + 1, PrevLogEntry: 1, PrevLogTerm: term,
		Entries: []*raft.Log{{Type: raft.LogCommand, Data: []byte{0x02, 'x'}}},
	}, &resp)
}

// certFrom is a client config presenting certPEM/keyPEM whatever CA the server asks for, and
// trusting any server: only the server's checks stand between it and raft.
func certFrom(t *testing.T, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }}
}

// readTLSFiles is n's certificate and key, as its join stored them (the key
// sealed: opened with the deployment token, as the node itself does).
func readTLSFiles(t *testing.T, n *node) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(n.dir, "tls", clustertls.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, testutil.OpenSealed(t, filepath.Join(n.dir, "tls", clustertls.KeyFile), clustertls.LabelNodeKey)
}

// keysAtRest lists what is wrong with n's data dir: a private key in clear
// (key files, the Raft log, snapshots), or a Raft log without the cluster
// CA's key and the cluster secret sealed. A process that reads the data
// dir but lacks the deployment token (a plugin running as pinnedd's user)
// must learn neither.
func keysAtRest(n *node) ([]string, error) {
	var problems []string
	var log []byte
	err := filepath.WalkDir(n.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("PRIVATE KEY-----")) {
			problems = append(problems, path+" holds a private key in clear")
		}
		if strings.Contains(path, string(filepath.Separator)+"raft"+string(filepath.Separator)) {
			log = append(log, b...)
		}
		return nil
	})
	for _, label := range []string{clustertls.LabelCAKey, clustertls.LabelClusterSecret} {
		if !bytes.Contains(log, []byte("Label: "+label)) {
			problems = append(problems, n.id+": the Raft log holds no sealed "+label)
		}
	}
	return problems, err
}

// clusterGet is an HTTP GET on a node's cluster port with cfg, and its status.
func clusterGet(cfg *tls.Config, addr, path string) (int, error) {
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + addr + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// raftLeader is the leader and term via's /registry/health reports.
func raftLeader(t *testing.T, via *node) (string, uint64) {
	t.Helper()
	h := health(t, via)
	id, _ := h["leader"].(string)
	term, _ := strconv.ParseUint(fmt.Sprint(h["term"]), 10, 64)
	return id, term
}

// The Raft port refuses strangers: a fleet formed by the common path (bootstrap + join, no
// manual PKI) runs Raft over mutual TLS; a forged AppendEntries with hashicorp/raft's own
// transport and no certificate, or with a certificate from another CA, is refused and the
// fleet serves on under the same leader; a removed node's certificate is refused; a restart
// reuses the stored certificate.
func TestRaftMutualTLS(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFor(t, 15*time.Second, "3 voters", func() bool {
		s := memberSummary(members(t, n1))
		return strings.Count(s, "n") == 3 && strings.Count(s, "*") == 1 && !strings.Contains(s, "nonvoter")
	})
	// The leader's housekeeping draws the cluster secret as it starts.
	for _, n := range []*node{n1, n2, n3} {
		testutil.WaitForErr(t, 10*time.Second, n.id+"'s keys at rest sealed", func() error {
			problems, err := keysAtRest(n)
			if err != nil || len(problems) > 0 {
				return fmt.Errorf("%v %v", problems, err)
			}
			return nil
		})
	}
	var st struct {
		ClusterTLS      string `json:"clusterTLS"`
		InsecureCluster bool   `json:"insecureCluster"`
	}
	n2.a.MustDo("GET", "/_pinned/status", "").JSON(t, &st)
	if !strings.Contains(n1.a.Logs(), "created the cluster CA") {
		t.Fatal("the bootstrap node did not create the cluster CA")
	}
	if st.ClusterTLS != "mutual-tls" || st.InsecureCluster {
		t.Fatalf("status: %+v", st)
	}
	for _, n := range []*node{n1, n2, n3} {
		if _, err := os.Stat(filepath.Join(n.dir, "tls", clustertls.CertFile)); err != nil {
			t.Fatalf("%s has no stored certificate: %v", n.id, err)
		}
	}
	byID := map[string]*node{"n1": n1, "n2": n2, "n3": n3}
	var leader string
	var term uint64
	testutil.WaitFor(t, 10*time.Second, "one leader for all", func() bool {
		leader, term = raftLeader(t, n1)
		for _, n := range byID {
			if l, tm := raftLeader(t, n); l != leader || tm != term {
				return false
			}
		}
		return byID[leader] != nil
	})
	// The forgeries go to a follower, and the removal takes another.
	var follower, gone *node
	for _, id := range []string{"n1", "n2", "n3"} {
		switch {
		case id == leader:
		case follower == nil:
			follower = byID[id]
		default:
			gone = byID[id]
		}
	}

	plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 3*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	evilCA, err := clustertls.NewCA("evil")
	if err != nil {
		t.Fatal(err)
	}
	evilCert, evilKey, err := evilCA.Issue("n1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	otherCA := raft.NewNetworkTransport(tlsDialer{certFrom(t, evilCert, evilKey)}, 1, 3*time.Second, io.Discard)
	defer otherCA.Close()
	for name, trans := range map[string]raft.Transport{"no certificate": plain, "another CA's certificate": otherCA} {
		if err := forgeAppend(trans, follower.raft, term); err == nil {
			t.Fatalf("%s: the forged AppendEntries was answered", name)
		} else {
			t.Logf("%s: refused: %v", name, err)
		}
	}
	// The fleet serves on, under the same leader, and the follower never followed a stranger.
	testutil.WaitFor(t, 20*time.Second, "the fleet serves", func() bool {
		r, err := testutil.Do(context.Background(), "POST", follower.url()+"/counters/tls/increment", "", nil)
		return err == nil && r.Code == 200
	})
	if l, tm := raftLeader(t, follower); l != leader || tm != term {
		t.Fatalf("after the forgeries: leader %q term %v, want %s term %v", l, tm, leader, term)
	}
	if strings.Contains(follower.a.Logs(), `"leader":"evil"`) {
		t.Fatal("the follower logged evil as its leader")
	}
	if _, err := follower.a.WaitLog(5*time.Second, "refused a cluster connection"); err != nil {
		t.Fatalf("the follower does not log the refusals: %v", err)
	}

	// The cluster port's HTTP: a member's certificate reaches it; none, or another CA's, does not.
	n1Cert, n1Key := readTLSFiles(t, n1)
	if code, err := clusterGet(certFrom(t, n1Cert, n1Key), follower.raft, "/registry/health"); err != nil || code != 200 {
		t.Fatalf("a member's GET on the cluster port: %d %v", code, err)
	}
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	for name, cfg := range map[string]*tls.Config{"no certificate": noCert, "another CA's certificate": certFrom(t, evilCert, evilKey)} {
		if code, err := clusterGet(cfg, follower.raft, "/registry/health"); err == nil {
			t.Fatalf("%s: the cluster port answered HTTP %d", name, code)
		}
	}
	// The front door refuses the node-to-node routes, token or not.
	for _, rq := range [][2]string{{"GET", "/_pinned/i/counters/tls/value"}, {"POST", "/_pinned/wake/counters/tls"}, {"POST", "/_raft/apply"}, {"GET", "/_pinned/stats"}} {
		if r := follower.a.MustDo(rq[0], rq[1], "x"); r.Code != 403 {
			t.Fatalf("%s %s on the front door with the token: %d %s", rq[0], rq[1], r.Code, r.Body)
		}
	}
	// Also on a kept-alive connection the fast path took after an instance request.
	conn, err := net.DialTimeout("tcp", follower.http, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(conn)
	for _, path := range []string{"/counters/tls/value", "/counters/tls/value", "/_pinned/i/counters/tls/value"} {
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, testutil.Token)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s on a kept-alive connection: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := map[bool]int{true: 403, false: 200}[strings.HasPrefix(path, "/_pinned/")]; resp.StatusCode != want {
			t.Fatalf("GET %s on a kept-alive connection: %d, want %d", path, resp.StatusCode, want)
		}
	}

	// A node leaves; its certificate (from the cluster CA, still valid) opens nothing.
	if out, err := testutil.CLI(t, "leave", "--addr", gone.url(), "--deadline", "0"); err != nil {
		t.Fatalf("pinnedd leave: %v\n%s", err, out)
	}
	if code, err := gone.a.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("%s exit %d: %v", gone.id, code, err)
	}
	testutil.WaitFor(t, 10*time.Second, gone.id+" gone", func() bool {
		return !strings.Contains(memberSummary(members(t, follower)), gone.id)
	})
	certG, keyG := readTLSFiles(t, gone)
	removed := raft.NewNetworkTransport(tlsDialer{certFrom(t, certG, keyG)}, 1, 3*time.Second, io.Discard)
	defer removed.Close()
	for _, n := range []*node{byID[leader], follower} {
		if err := forgeAppend(removed, n.raft, term); err == nil {
			t.Fatalf("%s answered the removed node %s", n.id, gone.id)
		}
		if _, err := n.a.WaitLog(5*time.Second, "refused a cluster connection", `is not a member`, `"node":"`+gone.id+`"`); err != nil {
			t.Fatalf("%s does not say why it refused %s: %v", n.id, gone.id, err)
		}
		if code, err := clusterGet(certFrom(t, certG, keyG), n.raft, "/registry/health"); err == nil {
			t.Fatalf("%s's cluster port answered the removed node %s: %d", n.id, gone.id, code)
		}
	}

	// A restart reuses the stored certificate (and the fleet takes it back).
	certPath := filepath.Join(follower.dir, "tls", clustertls.CertFile)
	before, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	follower.a.Signal(syscall.SIGTERM)
	if _, err := follower.a.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	follower.start(t, true)
	if _, err := follower.a.WaitLog(5*time.Second, "cluster certificate loaded"); err != nil {
		t.Fatalf("follower did not load its certificate: %v", err)
	}
	after, err := os.ReadFile(certPath)
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("follower's certificate changed on restart (%v)", err)
	}
	testutil.WaitFor(t, 15*time.Second, "the restarted node follows a leader again", func() bool {
		l, _ := raftLeader(t, follower)
		return l != "" && byID[l] != nil && l != gone.id
	})
}

// --insecure-cluster is the explicit way out of mutual TLS, and the node says so everywhere an
// operator looks (its log, status, /readyz); the fleet still forwards, through the front doors.
func TestInsecureClusterSaysSo(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap", "--insecure-cluster").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url(), "--insecure-cluster").start(t, true)
	for _, n := range []*node{n1, n2} {
		if _, err := n.a.WaitLog(5*time.Second, "INSECURE CLUSTER"); err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		var st struct {
			ClusterTLS string `json:"clusterTLS"`
		}
		n.a.MustDo("GET", "/_pinned/status", "").JSON(t, &st)
		var rd struct {
			Cluster string `json:"cluster"`
		}
		n.a.MustDo("GET", "/readyz", "").JSON(t, &rd)
		if st.ClusterTLS != "insecure" || rd.Cluster != "insecure" {
			t.Fatalf("%s: status clusterTLS %q, readyz cluster %q", n.id, st.ClusterTLS, rd.Cluster)
		}
	}
	// Ids land on both nodes; each is served through both, so half the requests are forwarded.
	testutil.WaitFor(t, 20*time.Second, "the fleet serves", func() bool {
		r, err := testutil.Do(context.Background(), "POST", n1.url()+"/counters/plain0/increment", "", nil)
		return err == nil && r.Code == 200
	})
	for i := 0; i < 6; i++ {
		id := "/counters/plain" + strconv.Itoa(i)
		for _, n := range []*node{n1, n2} {
			r, err := testutil.Do(context.Background(), "GET", n.url()+id+"/value", "", nil)
			if err != nil || r.Code != 200 {
				t.Fatalf("GET %s via %s: %v %d %s", id, n.id, err, r.Code, r.Body)
			}
		}
	}
	if fwd := n1.a.Metric(`pinboard_placement_resolutions_total{outcome="forwarded"}`) + n2.a.Metric(`pinboard_placement_resolutions_total{outcome="forwarded"}`); fwd == 0 {
		t.Fatal("no request was forwarded")
	}
}

// `pinnedd tls rotate` replaces the cluster CA of a running fleet: every
// member renews its certificate, the old CA is retired, and a certificate
// minted from the old CA's key in a member's name (what a removed node,
// which kept that key, could make) is refused by every cluster port; the
// fleet serves throughout.
func TestTLSRotateRetiresTheOldCA(t *testing.T) {
	t.Parallel()
	nodes := startFleet(t)
	n1 := nodes[0]
	caPEM, err := os.ReadFile(filepath.Join(n1.dir, "tls", clustertls.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := testutil.OpenSealed(t, filepath.Join(n1.dir, "tls", clustertls.CAKeyFile), clustertls.LabelCAKey)
	oldCA, err := clustertls.ParseCA(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	mintedCert, mintedKey, err := oldCA.Issue("n2", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	forged := certFrom(t, mintedCert, mintedKey)
	if code, err := clusterGet(forged, nodes[2].raft, "/registry/health"); err != nil || code != 200 {
		t.Fatalf("before the rotation, a certificate from the cluster CA: %d, %v", code, err)
	}

	out, err := testutil.CLI(t, "tls", "rotate", "--addr", nodes[1].url(), "--wait", "60s")
	if err != nil || !strings.Contains(out, "the old CA is retired") {
		t.Fatalf("pinnedd tls rotate: %v\n%s", err, out)
	}
	for _, n := range nodes {
		if code, err := clusterGet(forged, n.raft, "/registry/health"); err == nil {
			t.Fatalf("%s: a certificate minted from the retired CA's key got %d", n.id, code)
		}
		if r := n.a.MustDo("POST", "/counters/rotated-"+n.id+"/increment", ""); r.Code != 200 {
			t.Fatalf("%s after the rotation: %d %s", n.id, r.Code, r.Body)
		}
	}
}
