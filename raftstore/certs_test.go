package raftstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
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

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// logBuffer is a slog destination a test can read while the node writes to it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines are the JSON records that contain every one of subs.
func (b *logBuffer) lines(subs ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		all := l != ""
		for _, s := range subs {
			all = all && strings.Contains(l, s)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

func withLog(b *logBuffer) func(*Config) {
	return func(c *Config) {
		tlsOn(c)
		c.Logger = slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
}

// postCert sends a certificate request for id (a CSR for a new key) to baseURL with client,
// authorized by set, and returns the status and the certificate answered.
func postCert(t *testing.T, client *http.Client, baseURL, id string, set func(*http.Request, []byte)) (int, clusterport.CertAnswer) {
	t.Helper()
	key, err := clustertls.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := clustertls.NewCSR(key, id, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(clusterport.CertRequest{ID: id, CSR: string(csr)})
	req, _ := http.NewRequest(http.MethodPost, baseURL+HandlerPrefix+"certificate", bytes.NewReader(body))
	if set != nil {
		set(req, body)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans clusterport.CertAnswer
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, &ans); err != nil {
			t.Fatal(err)
		}
		probe := &clustertls.Identity{}
		if err := probe.Set([]byte(ans.CA), []byte(ans.Cert), key); err != nil || probe.NodeID() != id {
			t.Fatalf("the certificate for %s: %v (node %q)", id, err, probe.NodeID())
		}
	}
	return resp.StatusCode, ans
}

func bearerSecret(r *http.Request, _ []byte) { r.Header.Set("Authorization", "Bearer secret") }

func proved(r *http.Request, body []byte) {
	proof, _ := clustertls.JoinProof("secret", r.Method, r.URL.Path, body, time.Now())
	r.Header.Set(joinProofHeader, proof)
}

// A certificate in a live member's name is refused (403, logged at WARN with who asked),
// whether asked with the token or a join proof, from the leader or through a follower; a new
// id gets one; a member gets a new one for itself over its own certificate (a renewal), and
// not one for another member.
func TestTLSCertificateOnlyForNewNodes(t *testing.T) {
	var logs1, logs2 logBuffer
	n1 := startNode(t, "n1", t.TempDir(), "", true, withLog(&logs1))
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, withLog(&logs2))
	joinTLS(t, n1.srv.URL, n2)
	waitLeader(t, n2)

	for _, c := range []struct {
		name string
		via  *testNode
		logs *logBuffer
		set  func(*http.Request, []byte)
	}{
		{"token, leader", n1, &logs1, bearerSecret},
		{"join proof, leader", n1, &logs1, proved},
		{"token, follower", n2, &logs2, bearerSecret},
		{"join proof, follower", n2, &logs2, proved},
	} {
		for _, id := range []string{"n1", "n2"} {
			if code, _ := postCert(t, http.DefaultClient, c.via.srv.URL, id, c.set); code != http.StatusForbidden {
				t.Fatalf("%s: a certificate for the member %s: %d, want 403", c.name, id, code)
			}
			if got := c.logs.lines(`"level":"WARN"`, `"msg":"refused a cluster certificate"`, `"member":"`+id+`"`, `"remote":"127.0.0.1:`); len(got) == 0 {
				t.Fatalf("%s: the refusal of %s is not logged at WARN with the requester", c.name, id)
			}
		}
	}
	if code, _ := postCert(t, http.DefaultClient, n2.srv.URL, "n9", proved); code != http.StatusOK {
		t.Fatalf("a certificate for a new node: %d", code)
	}
	if got := logs2.lines(`"level":"WARN"`, `"msg":"issued a cluster certificate"`, `"member":"n9"`, `"auth":"join proof"`); len(got) != 1 {
		t.Fatalf("the issue is not logged at WARN once with the requester: %q", got)
	}

	// Renewal: n2 asks n1's cluster port over its own certificate, for itself.
	before, err := os.ReadFile(filepath.Join(n2.dir, "tls", clustertls.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	code, ans := postCert(t, n2.cfg.Cluster.PeerClient(), "https://"+n1.s.RaftAddr(), "n2", nil)
	if code != http.StatusOK || ans.Cert == string(before) {
		t.Fatalf("a renewal over the member's own certificate: %d", code)
	}
	if got := logs1.lines(`"level":"WARN"`, `"msg":"issued a cluster certificate"`, `"member":"n2"`, `"renewal":true`, `"auth":"cluster certificate of n2"`); len(got) != 1 {
		t.Fatalf("the renewal is not logged at WARN: %q", got)
	}
	if code, _ := postCert(t, n2.cfg.Cluster.PeerClient(), "https://"+n1.s.RaftAddr(), "n1", nil); code != http.StatusForbidden {
		t.Fatalf("a member asking for another member's certificate over its own: %d, want 403", code)
	}
}

// A join captured on the way and sent again after the node's removal is refused and changes
// nothing (the removal fenced it); the node itself joins again (JoinCluster takes the new
// fence), and a replay of that join after a second removal is refused too.
func TestTLSJoinReplayAfterRemovalIsRefused(t *testing.T) {
	n1 := startNode(t, "n1", t.TempDir(), "", true, tlsOn)
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, tlsOn)
	joinTLS(t, n1.srv.URL, n2)

	target, err := url.Parse(n1.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var joins []*http.Request
	var bodies [][]byte
	rp := httputil.NewSingleHostReverseProxy(target)
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == HandlerPrefix+"join" {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			joins, bodies = append(joins, r.Clone(r.Context())), append(bodies, body)
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	}))
	defer spy.Close()
	replayLast := func() (int, string) {
		mu.Lock()
		r, body := joins[len(joins)-1], bodies[len(bodies)-1]
		mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, n1.srv.URL+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	n3 := startNode(t, "n3", t.TempDir(), "", false, tlsOn)
	joinTLS(t, spy.URL, n3)
	for round := 1; round <= 2; round++ {
		if err := n1.s.Remove(ctxTimeout(t, 10*time.Second), "n3"); err != nil {
			t.Fatal(err)
		}
		code, body := replayLast()
		if code != http.StatusConflict || !strings.Contains(body, codeStaleJoin) {
			t.Fatalf("round %d: the replayed join: %d %s, want 409 stale_join", round, code, body)
		}
		if ms := membersByID(t, n1); ms["n3"].ID != "" {
			t.Fatalf("round %d: the replay made n3 a member again: %v", round, ms)
		}
		// The node itself joins again, through the spy: a first attempt refused as stale, then
		// one with the fence the refusal named.
		joinTLS(t, spy.URL, n3)
		if ms := membersByID(t, n1); ms["n3"].ID == "" {
			t.Fatalf("round %d: n3 did not join again: %v", round, ms)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(joins) < 3 {
		t.Fatalf("the spy saw %d joins", len(joins))
	}
}

// A member whose data dir lost its certificate cannot ask for one in its own name: it does not
// start, and says to remove it and join again with a fresh data dir.
func TestTLSMemberWithoutItsCertificateSaysWhatToDo(t *testing.T) {
	nodes := tlsCluster(t, 2)
	n2 := nodes[1]
	n2.close()
	if err := os.RemoveAll(filepath.Join(n2.dir, "tls")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), reopen(n2.cfg), &listSM{})
	if err == nil {
		_ = s.Close(context.Background())
		t.Fatal("a member without its certificate started")
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "pinnedd remove n2") {
		t.Fatalf("open: %v", err)
	}
	if code, _ := postCert(t, http.DefaultClient, nodes[0].srv.URL, "n2", proved); code != http.StatusForbidden {
		t.Fatalf("a certificate for the member n2: %d, want 403", code)
	}
}
