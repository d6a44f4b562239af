package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// The front door over HTTPS, as the README sets it up: a CA and a
// certificate made with `pinnedd tls`, HTTP/2 and HTTP/1.1 on the same
// address, /readyz and `pinnedd status` saying so, the CLI verifying it
// with --ca (and failing without), an instance's cluster call through it,
// a plain-HTTP request to the TLS port
// answered 400, and a renewed certificate served without a restart.
func TestFrontDoorHTTPS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cli := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(testutil.Bin(t, "pinnedd"), args...)
		cmd.Env = append(append(os.Environ(), "PINBOARD_TOKEN="+testutil.Token), env...)
		cmd.Dir = dir // as the README runs them: the CA's files where the certificates are made
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, args := range [][]string{
		{"tls", "ca", "create"},
		{"tls", "cert", "create", "--node", "front", "--host", "127.0.0.1"},
	} {
		if out, err := cli(nil, args...); err != nil {
			t.Fatalf("pinnedd %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	caFile, certFile, keyFile := filepath.Join(dir, "pinnedd-ca.pem"), filepath.Join(dir, "front.pem"), filepath.Join(dir, "front-key.pem")
	a := testutil.LaunchAgent(t, nil, "--bootstrap", "--local-state", "--data-dir", t.TempDir(),
		"--raft-addr", testutil.FreeAddr(t), "--lease-ttl", "3s", "--heartbeat-interval", "500ms", "--raft-timeout", "300ms",
		"--plugin", "/counters="+testutil.Bin(t, "counter"), "--plugin", "/misc="+testutil.Bin(t, "testhost"),
		"--http-tls-cert", certFile, "--http-tls-key", keyFile, "--http-tls-ca", caFile)
	if !strings.HasPrefix(a.URL, "https://") {
		t.Fatalf("front door at %s, want https", a.URL)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	t.Cleanup(h2.CloseIdleConnections)
	t.Cleanup(h1.CloseIdleConnections)
	a.Client = h2
	if err := a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("not ready over https: %v\n%s", err, a.Logs())
	}

	testutil.WaitFor(t, 15*time.Second, "the cold-start quarantine over", func() bool {
		r, err := a.Do("GET", "/counters/tls/value", "")
		return err == nil && r.Code == 200
	})
	ready := a.MustDo("GET", "/readyz", "")
	var rz map[string]any
	ready.JSON(t, &rz)
	if rz["frontDoor"] != "https" {
		t.Errorf("/readyz %v: want frontDoor https", rz)
	}
	for _, c := range []struct {
		client *http.Client
		proto  string
	}{{h2, "HTTP/2.0"}, {h1, "HTTP/1.1"}} {
		for range 2 { // a second request on the kept-alive connection
			r, err := testutil.DoWith(context.Background(), c.client, "POST", a.URL+"/counters/tls/increment", "", nil)
			if err != nil || r.Code != 200 || r.Proto != c.proto {
				t.Fatalf("POST over %s: %v %+v", c.proto, err, r)
			}
		}
	}
	if r, err := testutil.DoWith(context.Background(), h1, "GET", a.URL+"/counters/tls/value", "", nil); err != nil || !strings.Contains(r.Body, `"value":4`) {
		t.Fatalf("value after 4 increments over https: %v %+v", err, r)
	}

	// An instance's cluster call reaches the front door over HTTPS,
	// verified with the CA pinnedd hands its plugin.
	if r := a.MustDo("GET", "/misc/caller/call?method=GET&target=/counters/tls/value", ""); r.Code != 200 || !strings.Contains(r.Body, `"value":4`) {
		t.Fatalf("cluster call over https: %+v", r)
	}

	// Plain HTTP to the TLS port: a clear 400, not a hang.
	plain := "http://" + strings.TrimPrefix(a.URL, "https://")
	if r, err := testutil.Do(context.Background(), "GET", plain+"/healthz", "", nil); err != nil || r.Code != 400 {
		t.Errorf("plain HTTP to the HTTPS port: %v %+v, want 400", err, r)
	}

	// The CLI: verified with --ca, refused without it.
	out, err := cli([]string{"PINNEDD_CA=" + caFile}, "status", "--addr", a.URL)
	if err != nil || !regexp.MustCompile(`front door\s+https \(certificate valid until`).MatchString(out) {
		t.Errorf("pinnedd status over https with PINNEDD_CA: %v\n%s", err, out)
	}
	if out, err := cli(nil, "status", "--addr", a.URL); err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("pinnedd status over https without --ca: %v\n%s", err, out)
	}

	// A renewed certificate (new files moved over the old) is served
	// without a restart.
	renewed := t.TempDir()
	if out, err := cli(nil, "tls", "cert", "create", "--node", "front", "--host", "127.0.0.1", "--dir", renewed); err != nil {
		t.Fatalf("renew: %v\n%s", err, out)
	}
	first := servedSerial(t, a.URL, roots)
	for _, f := range []string{"front-key.pem", "front.pem"} {
		if err := os.Rename(filepath.Join(renewed, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the renewed certificate served", func() bool { return servedSerial(t, a.URL, roots) != first })
	if _, err := a.WaitLog(5*time.Second, `"msg":"front door certificate loaded"`); err != nil {
		t.Errorf("no log line for the reload: %v", err)
	}
	var st map[string]any
	a.MustDo("GET", "/_pinned/status", "").JSON(t, &st)
	if st["frontDoor"] != "https" || st["frontDoorCertNotAfter"] == nil {
		t.Errorf("status %v: want frontDoor https and the certificate's expiry", st)
	}
}

// servedSerial is the serial of the certificate the front door at base
// presents to a new connection.
func servedSerial(t *testing.T, base string, roots *x509.CertPool) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", strings.TrimPrefix(base, "https://"), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("dial %s: %v", base, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// A bearer key is not sent in clear off this machine: the CLI refuses
// before it connects, and names the flag that would send it anyway.
func TestCLIRefusesKeyOverPlainHTTP(t *testing.T) {
	t.Parallel()
	out, err := testutil.CLI(t, "status", "--addr", "http://192.0.2.1:8080", "--timeout", "2s")
	if err == nil || !strings.Contains(out, "refusing to send the token in clear to http://192.0.2.1:8080") || !strings.Contains(out, "--insecure") {
		t.Fatalf("plain http off-machine with a token: %v\n%s", err, out)
	}
	// --insecure sends it: the call then fails on the network (nothing
	// answers at that address), not on the refusal.
	out, err = testutil.CLI(t, "status", "--addr", "http://192.0.2.1:8080", "--timeout", "1s", "--insecure")
	if err == nil || strings.Contains(out, "refusing") || !strings.Contains(out, "the agent at http://192.0.2.1:8080") {
		t.Fatalf("--insecure: %v\n%s, want a failure to reach the agent", err, out)
	}
}

// A fleet whose front doors all serve HTTPS: the second node joins through
// the first's https URL, verified with --http-tls-ca, registers (the
// registry's probe of its https advertise URL verifies too), and serves
// an id the first runs, forwarded. Without the CA the join is refused.
func TestFleetJoinsOverHTTPS(t *testing.T) {
	t.Parallel()
	fleetOverHTTPS(t)
}

// With --insecure-cluster the nodes call each other's front doors: over
// HTTPS here, verified with --http-tls-ca, a forward reaches its owner.
func TestInsecureClusterForwardsOverHTTPS(t *testing.T) {
	t.Parallel()
	fleetOverHTTPS(t, "--insecure-cluster")
}

// fleetOverHTTPS is a two-node fleet whose front doors serve HTTPS under a
// private CA (--http-tls-ca), with extra flags on both nodes; it checks the
// join, the registrations and a forward, then that a node without the CA
// cannot join.
func fleetOverHTTPS(t *testing.T, extra ...string) {
	dir := t.TempDir()
	cli := func(args ...string) {
		t.Helper()
		cmd := exec.Command(testutil.Bin(t, "pinnedd"), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pinnedd %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cli("tls", "ca", "create")
	cli("tls", "cert", "create", "--node", "web", "--host", "127.0.0.1")
	caFile := filepath.Join(dir, "pinnedd-ca.pem")
	tlsArgs := append([]string{"--http-tls-cert", filepath.Join(dir, "web.pem"), "--http-tls-key", filepath.Join(dir, "web-key.pem"), "--http-tls-ca", caFile}, extra...)
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(client.CloseIdleConnections)

	n1 := newNode(t, "n1", append([]string{"--bootstrap"}, tlsArgs...)...)
	n1.a = testutil.LaunchAgentAt(t, n1.wd, fleetEnv, n1.args...)
	n1.a.Client = client
	if err := n1.a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("n1 not ready: %v", err)
	}
	n2 := newNode(t, "n2", append([]string{"--join", n1.a.URL}, tlsArgs...)...)
	n2.a = testutil.LaunchAgentAt(t, n2.wd, fleetEnv, n2.args...)
	n2.a.Client = client
	if err := n2.a.WaitReady(30 * time.Second); err != nil {
		t.Fatalf("n2 not ready (joined over https, registered): %v\n%s", err, n2.a.Logs())
	}
	testutil.WaitFor(t, 20*time.Second, "an id n1 runs served through n2", func() bool {
		r, err := n1.a.Do("POST", "/counters/tls-fleet/increment", "")
		if err != nil || r.Code != 200 {
			return false
		}
		r, err = n2.a.Do("GET", "/counters/tls-fleet/value", "")
		return err == nil && r.Code == 200
	})

	// A node that does not know the CA cannot join through it.
	n3 := newNode(t, "n3", append([]string{"--join", n1.a.URL}, extra...)...)
	n3.a = testutil.LaunchAgentAt(t, n3.wd, fleetEnv, n3.args...)
	if _, err := n3.a.WaitLog(20*time.Second, "certificate signed by unknown authority"); err != nil {
		t.Fatalf("a join without the CA: %v\n%s", err, n3.a.Logs())
	}
}
