package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// certRequest posts a certificate request for id (a CSR for keyPEM, or a new key) to base with
// client and headers, and returns the status and body.
func certRequest(t *testing.T, client *http.Client, base, id string, keyPEM []byte, headers map[string]string) (int, string) {
	t.Helper()
	if keyPEM == nil {
		var err error
		if keyPEM, err = clustertls.NewKey(); err != nil {
			t.Fatal(err)
		}
	}
	csr, err := clustertls.NewCSR(keyPEM, id, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"id": id, "csr": string(csr)})
	req, _ := http.NewRequest(http.MethodPost, base+"/_raft/certificate", bytes.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// With real processes: the deployment token buys no certificate
// in a live member's name (403, logged at WARN with the requester), while a member renews its
// own over its certificate on the cluster port. A join captured on the way (n3's, through a
// recording proxy) and sent again after `pinnedd remove n3` is refused and n3 stays out; n3
// restarted with its own command line joins again.
func TestCertificatesAndJoinReplay(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)

	target, err := url.Parse(n1.url())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var joinHeader http.Header
	var joinBody []byte
	rp := httputil.NewSingleHostReverseProxy(target)
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_raft/join" {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			joinHeader, joinBody = r.Header.Clone(), body
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	}))
	defer spy.Close()
	n3 := newNode(t, "n3", "--join", spy.URL).start(t, true)
	testutil.WaitFor(t, 15*time.Second, "3 members", func() bool {
		return len(strings.Fields(memberSummary(members(t, n1)))) == 3
	})

	// The deployment token asks n1 (the bootstrap node) and n2 for a member's certificate.
	auth := map[string]string{"Authorization": "Bearer " + testutil.Token}
	for _, via := range []*node{n1, n2} {
		code, body := certRequest(t, http.DefaultClient, via.url(), "n3", nil, auth)
		if code != http.StatusForbidden {
			t.Fatalf("a certificate for the member n3 via %s: %d %s", via.id, code, body)
		}
		if _, err := via.a.WaitLog(5*time.Second, `"level":"WARN"`, "refused a cluster certificate", `"member":"n3"`, `"remote":"127.0.0.1:`, `"auth":"bearer token"`); err != nil {
			t.Fatalf("%s does not log the refusal at WARN: %v", via.id, err)
		}
	}
	// n2 renews its own over its certificate on n1's cluster port.
	cert2, key2 := readTLSFiles(t, n2)
	tr := &http.Transport{TLSClientConfig: certFrom(t, cert2, key2)}
	defer tr.CloseIdleConnections()
	peer := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	if code, body := certRequest(t, peer, "https://"+n1.raft, "n2", key2, nil); code != http.StatusOK {
		t.Fatalf("n2's renewal over its own certificate: %d %s", code, body)
	}
	if _, err := n1.a.WaitLog(5*time.Second, `"level":"WARN"`, "issued a cluster certificate", `"member":"n2"`, `"renewal":true`); err != nil {
		t.Fatalf("n1 does not log the renewal at WARN: %v", err)
	}
	if code, body := certRequest(t, peer, "https://"+n1.raft, "n3", nil, nil); code != http.StatusForbidden {
		t.Fatalf("n2 asking for n3's certificate over its own: %d %s", code, body)
	}

	// n3 rebuilt with an empty data dir, while the old n3 is still listed, gets no certificate
	// and says to remove the old member first.
	rebuilt := newNode(t, "n3", "--join", n1.url()).start(t, false)
	if _, err := rebuilt.a.WaitLog(20*time.Second, "join refused", "pinnedd remove"); err != nil {
		t.Fatalf("a rebuilt n3 does not say why it cannot join: %v", err)
	}
	rebuilt.a.Signal(syscall.SIGKILL)
	if _, err := rebuilt.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	// n3 dies and is removed; its captured join, sent again, is refused.
	n3.a.Signal(syscall.SIGKILL)
	if _, err := n3.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := testutil.CLI(t, "remove", "--addr", n1.url(), "n3"); err != nil {
		t.Fatalf("pinnedd remove n3: %v\n%s", err, out)
	}
	mu.Lock()
	hdr, body := joinHeader, joinBody
	mu.Unlock()
	if hdr.Get("X-Pinnedd-Join-Proof") == "" {
		t.Fatalf("the spy caught no join proof: %v", hdr)
	}
	for _, via := range []*node{n1, n2} {
		req, _ := http.NewRequest(http.MethodPost, via.url()+"/_raft/join", bytes.NewReader(body))
		req.Header = hdr.Clone()
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusConflict || !strings.Contains(string(b), "stale_join") {
			t.Fatalf("n3's join replayed to %s after its removal: %d %s, want 409 stale_join", via.id, r.StatusCode, b)
		}
	}
	if s := memberSummary(members(t, n1)); strings.Contains(s, "n3") {
		t.Fatalf("the replay made n3 a member again: %s", s)
	}

	// n3 itself, restarted with its command line, joins again.
	n3.start(t, true)
	testutil.WaitFor(t, 20*time.Second, "n3 a member again", func() bool {
		return strings.Contains(memberSummary(members(t, n1)), "n3")
	})
	testutil.WaitFor(t, 20*time.Second, "n3 serves", func() bool {
		r, err := testutil.Do(context.Background(), "POST", n3.url()+"/counters/replay/increment", "", nil)
		return err == nil && r.Code == 200
	})
}
