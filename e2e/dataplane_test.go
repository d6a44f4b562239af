package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// threeWorkers starts the fleet: three nodes serving /counters and
// the test host, past the cold-start quarantine.
func threeWorkers(t *testing.T) []*node {
	t.Helper()
	th := testutil.Bin(t, "testhost")
	// Trusting loopback's forwarding headers lets a test pose as many
	// client IPs, so ids spread over the workers (placement prefers one
	// worker per client IP).
	return startFleet(t, "--plugin", "/misc="+th, "--plugin", "/jobs="+th, "--trusted-proxies", "127.0.0.1/32")
}

// startFleet starts n1 (bootstrap), n2 and n3 (joining n1) with extra
// arguments and waits until each sees the three workers.
func startFleet(t *testing.T, extra ...string) []*node {
	t.Helper()
	n1 := newNode(t, "n1", append([]string{"--bootstrap"}, extra...)...).start(t, true)
	n2 := newNode(t, "n2", append([]string{"--join", n1.url()}, extra...)...).start(t, true)
	n3 := newNode(t, "n3", append([]string{"--join", n1.url()}, extra...)...).start(t, true)
	testutil.WaitFleet(t, 10*time.Second, n1.a, n2.a, n3.a)
	return []*node{n1, n2, n3}
}

// ownerOf asks a node's status which node runs an instance.
func ownerOf(t *testing.T, nodes []*node, ns, id string) *node {
	t.Helper()
	for _, n := range nodes {
		if n.a == nil {
			continue
		}
		if st, err := statusOf(n.a); err == nil && st.Runs(ns, id) {
			return n
		}
	}
	return nil
}

func TestAnyNodeServesAnyID(t *testing.T) {
	t.Parallel()
	nodes := threeWorkers(t)
	for i, n := range nodes {
		r := n.a.MustDo("POST", "/counters/alice/increment", "")
		if r.Code != 200 || strings.TrimSpace(r.Body) != fmt.Sprintf(`{"value":%d}`, i+1) {
			t.Fatalf("increment via %s: %d %s", n.id, r.Code, r.Body)
		}
	}
	// Exactly one node runs alice.
	count := 0
	for _, n := range nodes {
		for _, in := range getStatus(t, n.a).Instances {
			if in.ID == "alice" {
				count++
			}
		}
	}
	if count != 1 {
		t.Fatalf("alice runs on %d nodes", count)
	}
	// Each hop's durations: the forwarding nodes time their forward, the
	// owner its plugin's answer.
	owner := ownerOf(t, nodes, "/counters", "alice")
	for _, n := range nodes {
		forwarded := n.a.Metric("pinboard_forward_duration_seconds_count")
		served := n.a.Metric(`pinned_request_duration_seconds_count{code="200",namespace="/counters"}`)
		if n == owner && served < 3 || n != owner && forwarded < 1 {
			t.Errorf("%s (owner %v): %v forwards and %v served requests timed", n.id, n == owner, forwarded, served)
		}
	}
	// Streams flush through the forwarding hop; upgrades pass through.
	var via *node
	for _, n := range nodes {
		if n != owner {
			via = n
		}
	}
	_ = via.a.MustDo("GET", "/misc/s1/ping", "") // place s1 somewhere
	streamEvents(t, via.url()+"/misc/s1/sse", 3)
	upgradeEcho(t, via.url(), "/misc/s1/upgrade")
	gatedStream(t, nodes)

	// /registry/stats on any node shows which worker holds alice.
	var stats struct {
		Workers []struct {
			NodeID     string `json:"nodeId"`
			Error      string `json:"error"`
			UptimeMs   int64  `json:"uptimeMs"`
			RSSBytes   int64  `json:"rssBytes"`
			LeaseFlaps *int   `json:"leaseFlaps"`
			Namespaces []struct {
				Namespace   string `json:"namespace"`
				Activations int    `json:"activations"`
			} `json:"namespaces"`
			Instances []struct {
				Namespace  string `json:"namespace"`
				ID         string `json:"id"`
				Generation uint64 `json:"generation"`
			} `json:"instances"`
		} `json:"workers"`
	}
	via.a.MustDo("GET", "/registry/stats", "").JSON(t, &stats)
	holders := []string{}
	for _, w := range stats.Workers {
		if w.Error != "" || w.UptimeMs <= 0 || w.RSSBytes <= 0 || w.LeaseFlaps == nil || len(w.Namespaces) != 3 {
			t.Fatalf("worker stats %+v", w)
		}
		for _, in := range w.Instances {
			if in.ID == "alice" && in.Generation > 0 {
				holders = append(holders, w.NodeID)
			}
		}
	}
	if len(stats.Workers) != 3 || len(holders) != 1 || holders[0] != owner.id {
		t.Fatalf("stats: %d workers, alice held by %v (owner %s)", len(stats.Workers), holders, owner.id)
	}
	// The worker-side route answers attested callers only.
	if r, _ := testutil.Do(context.Background(), "GET", owner.url()+"/_pinned/stats", "", map[string]string{"Authorization": "Bearer " + testutil.Token}); r.Code != 403 {
		t.Fatalf("unattested /_pinned/stats: %d", r.Code)
	}
}

func streamEvents(t *testing.T, url string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for i := 0; i < n; {
		if !sc.Scan() {
			t.Fatalf("stream %s ended after %d events: %v", url, i, sc.Err())
		}
		if sc.Text() != "" {
			i++
		}
	}
}

// placeMisc activates /misc/<id> through the first node and returns the
// node that runs it and another one.
func placeMisc(t *testing.T, nodes []*node, id string) (owner, via *node) {
	t.Helper()
	nodes[0].a.MustDo("GET", "/misc/"+id+"/ping", "")
	owner = ownerOf(t, nodes, "/misc", id)
	if owner == nil {
		t.Fatal(id + " runs nowhere")
	}
	for _, n := range nodes {
		if n != owner {
			return owner, n
		}
	}
	t.Fatal("no node besides the owner")
	return nil, nil
}

// gatedStream proves that a stream read through a node that does not own
// the id arrives event by event, and that the client leaving ends the
// stream at the owner. The owner's host writes each event only when told
// to, after the test has read the one before: a hop that buffered would
// leave the read waiting, whatever the timing.
func gatedStream(t *testing.T, nodes []*node) {
	t.Helper()
	const id = "gated1"
	owner, via := placeMisc(t, nodes, id)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", via.url()+"/misc/"+id+"/gated", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("stream through %s: %v", via.id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream through %s: %d %q", via.id, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	start := time.Now()
	var stamps []string
	for i := range 4 {
		if i > 0 {
			if r := owner.a.MustDo("POST", "/misc/"+id+"/gated/next", ""); r.Code != 200 {
				t.Fatalf("next event: %d %s", r.Code, r.Body)
			}
		}
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d through %s: %q, %v", i, via.id, line, err)
		}
		if blank, err := br.ReadString('\n'); err != nil || blank != "\n" {
			t.Fatalf("event %d's end: %q, %v", i, blank, err)
		}
		stamps = append(stamps, time.Since(start).Round(time.Microsecond).String())
	}
	t.Logf("events through %s from owner %s, each read before the next was written, at %v", via.id, owner.id, stamps)
	if r := owner.a.MustDo("GET", "/misc/"+id+"/gated/open", ""); strings.TrimSpace(r.Body) != "1" {
		t.Fatalf("open streams at the owner: %q, want 1", r.Body)
	}
	cancel()
	resp.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "the owner's stream ended after the client left "+via.id, func() bool {
		r := owner.a.MustDo("GET", "/misc/"+id+"/gated/open", "")
		return strings.TrimSpace(r.Body) == "0"
	})
}

func upgradeEcho(t *testing.T, base, path string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", path)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through %s: %v %v", base, resp, err)
	}
	fmt.Fprint(conn, "hi\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hi\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
}

// kill -9 the owner: once its lease lapses the next request through a
// survivor places the id on a live node.
func TestOwnerKilledIDMoves(t *testing.T) {
	t.Parallel()
	nodes := threeWorkers(t)
	if r := nodes[0].a.MustDo("POST", "/counters/bob/increment", ""); r.Code != 200 {
		t.Fatalf("first increment: %d %s", r.Code, r.Body)
	}
	owner := ownerOf(t, nodes, "/counters", "bob")
	if owner == nil {
		t.Fatal("no owner for bob")
	}
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var survivor *node
	for _, n := range nodes {
		if n != owner {
			survivor = n
		}
	}
	// Until the lease lapses: a prompt 503 + Retry-After, never a hang.
	for range 5 {
		r := survivor.a.MustDo("POST", "/counters/bob/increment", "")
		if r.Code == 503 && r.Header.Get("Retry-After") == "" {
			t.Fatalf("503 without Retry-After: %s", r.Body)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "bob served after the lease lapsed", func() bool {
		r := survivor.a.MustDo("POST", "/counters/bob/increment", "")
		return r.Code == 200
	})
	owner.a = nil
	if n := ownerOf(t, nodes, "/counters", "bob"); n == nil || n == owner {
		t.Fatalf("bob's new owner: %v", n)
	}
	if got := survivor.a.Metric(`pinboard_forward_failures_total{outcome="unreachable"}`); got < 1 {
		// Only if a request was forwarded to the dead owner before its
		// lease lapsed; the first request above was.
		t.Fatalf("unreachable forwards = %v", got)
	} else if lines := strings.Count(survivor.a.Logs(), `"msg":"owner did not answer"`); got > 1 && lines != 1 {
		// One cause, one line (and a count, were it to last a window).
		t.Fatalf("%v unreachable forwards logged in %d lines, want 1", got, lines)
	}
}

// The seed's topology: one host-less front door (the pinboard role) in
// front of two workers; losing one worker keeps quorum and service.
func TestPinboardFrontsTwoWorkers(t *testing.T) {
	t.Parallel()
	pb := newNode(t, "pb", "--bootstrap")
	pb.args = removePlugin(pb.args)
	pb.args = append(pb.args, "--no-hosts")
	pb.start(t, true)
	w1 := newNode(t, "w1", "--join", pb.url()).start(t, true)
	w2 := newNode(t, "w2", "--join", pb.url()).start(t, true)
	testutil.WaitFor(t, 10*time.Second, "two workers", func() bool { return len(liveWorkers(t, pb)) == 2 })
	testutil.WaitFor(t, 10*time.Second, "quarantine over", func() bool {
		return pb.a.MustDo("POST", "/counters/c1/increment", "").Code == 200
	})
	if r := pb.a.MustDo("POST", "/counters/c1/increment", ""); strings.TrimSpace(r.Body) != `{"value":2}` {
		t.Fatalf("second increment through pinboard: %d %s", r.Code, r.Body)
	}
	if r := pb.a.MustDo("GET", "/nope/x/y", ""); r.Code != 404 || !strings.Contains(r.Body, "unknown namespace") {
		t.Fatalf("unknown namespace via pinboard: %d %s", r.Code, r.Body)
	}
	owner := ownerOf(t, []*node{w1, w2}, "/counters", "c1")
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "c1 served by the other worker", func() bool {
		return pb.a.MustDo("POST", "/counters/c1/increment", "").Code == 200
	})
}

func removePlugin(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--plugin" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// The owner-side route serves nothing without a valid attestation, and
// nothing activates.
func TestOwnerRouteNeedsAttestation(t *testing.T) {
	t.Parallel()
	nodes := threeWorkers(t)
	n := nodes[1]
	before := n.a.Metric(`pinned_activations_total{namespace="/counters"}`)
	for name, h := range map[string]string{
		"missing":   "",
		"malformed": "v1.garbage",
		"forged":    "v1." + liveWorkers(t, n)[n.id].ClientID + "..5." + fmt.Sprint(time.Now().UnixMilli()) + ".nonce.AAAA",
	} {
		hdr := map[string]string{}
		if h != "" {
			hdr["X-Pinned-Attestation"] = h
		}
		r, err := testutil.Do(context.Background(), "POST", n.url()+"/_pinned/i/counters/mallory/increment", "", hdr)
		if err != nil || r.Code != 403 {
			t.Errorf("%s attestation: %v %d %s, want 403", name, err, r.Code, r.Body)
		}
	}
	if got := n.a.Metric(`pinned_activations_total{namespace="/counters"}`); got != before {
		t.Fatalf("refused requests activated instances: %v -> %v", before, got)
	}
	if ownerOf(t, nodes, "/counters", "mallory") != nil {
		t.Fatal("mallory was activated")
	}
}

// doAs sends a request as if from client IP ip (through a trusted proxy).
func doAs(t *testing.T, n *node, method, path, ip string) testutil.Response {
	t.Helper()
	r, err := testutil.Do(context.Background(), method, n.url()+path, "", map[string]string{"X-Forwarded-For": ip})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A cluster call (an instance calling another id through its own node's
// front door) places a new id on the caller's own node.
func TestClusterCallPrefersOwnNode(t *testing.T) {
	t.Parallel()
	nodes := threeWorkers(t)
	// One caller instance on each node.
	callers := map[*node]string{}
	for i := 0; len(callers) < 3 && i < 300; i++ {
		id := fmt.Sprintf("caller%d", i)
		_ = doAs(t, nodes[0], "GET", "/misc/"+id+"/ping", fmt.Sprintf("10.9.%d.%d", i/250, i%250))
		if n := ownerOf(t, nodes, "/misc", id); n != nil && callers[n] == "" {
			callers[n] = id
		}
	}
	if len(callers) < 3 {
		t.Fatalf("callers on %d nodes only", len(callers))
	}
	for n, caller := range callers {
		for j := 0; j < 3; j++ {
			target := fmt.Sprintf("/counters/%s-made-%d/increment", caller, j)
			r := nodes[j].a.MustDo("GET", "/misc/"+caller+"/call?target="+target, "")
			if r.Code != 200 || strings.TrimSpace(r.Body) != `{"value":1}` {
				t.Fatalf("cluster call from %s: %d %s", caller, r.Code, r.Body)
			}
			if got := ownerOf(t, nodes, "/counters", fmt.Sprintf("%s-made-%d", caller, j)); got != n {
				t.Fatalf("id made by a cluster call from %s landed on %v, want %s", n.id, got, n.id)
			}
		}
	}
}

// A client connection that carried one forwarded request is served by the
// forwarding node's kept-alive loop from then on. On one connection:
// forwarded requests, a request the loop gives back to net/http (a
// registry route), forwarded requests again, then a stream through the
// loop that arrives event by event and ends at the owner when the client
// leaves. On another: an upgrade after a forwarded request (given back,
// then tunnelled by net/http's proxy).
func TestKeptAliveConnectionForwards(t *testing.T) {
	t.Parallel()
	nodes := threeWorkers(t)
	const id = "ka1"
	owner, via := placeMisc(t, nodes, id)
	dial := func() (net.Conn, *bufio.Reader) {
		conn, err := net.DialTimeout("tcp", via.http, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		return conn, bufio.NewReader(conn)
	}
	do := func(conn net.Conn, br *bufio.Reader, method, path, extra string) (*http.Response, string) {
		t.Helper()
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n%s\r\n", method, path, via.http, testutil.Token, extra)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s %s through %s: %v", method, path, via.id, err)
		}
		if resp.ContentLength < 0 {
			return resp, "" // a stream: the caller reads it
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s body: %v", method, path, err)
		}
		return resp, string(b)
	}
	kept := func() float64 { return via.a.Metric("pinboard_kept_alive_connections") }

	conn, br := dial()
	for i := range 5 {
		// The first goes through net/http on both nodes, the later ones
		// through the loops: the instance sees the same forwarding chain,
		// the client's address and then the forwarding node's.
		resp, body := do(conn, br, "GET", "/misc/"+id+"/ping", "X-Forwarded-For: 203.0.113.9\r\n")
		if resp.StatusCode != 200 || !strings.Contains(body, `"forwardedFor":"127.0.0.1, 127.0.0.1"`) {
			t.Fatalf("ping %d: %d %s", i, resp.StatusCode, body)
		}
	}
	switch relayed := owner.a.Metric("pinboard_kept_alive_requests_total"); {
	case !fastPath(t):
	case relayed < 1:
		// The owner's loop took the peer's connection too (over mutual
		// TLS, on its cluster port), and relays the peer's requests to
		// the plugin itself.
		t.Fatalf("%s's kept-alive loop relayed %v requests of 5 forwarded to it", owner.id, relayed)
	}
	// Straight to the owner, on a kept-alive connection: the client's own
	// forwarding fields do not reach the instance.
	for i := range 3 {
		r, err := testutil.Do(context.Background(), "GET", owner.a.URL+"/misc/"+id+"/ping", "", map[string]string{"X-Forwarded-For": "203.0.113.9"})
		if err != nil || r.Code != 200 || !strings.Contains(r.Body, `"forwardedFor":"127.0.0.1"`) {
			t.Fatalf("direct ping %d: %v %d %s", i, err, r.Code, r.Body)
		}
	}
	switch relayed := owner.a.Metric("pinboard_kept_alive_requests_total"); {
	case !fastPath(t):
		if kept() != 0 || relayed != 0 {
			t.Fatalf("with %s the loops hold %v connections and relayed %v requests", noFastPath, kept(), relayed)
		}
	case kept() < 1:
		t.Fatalf("%s's kept-alive loop holds no connection after 5 forwarded requests", via.id)
	case relayed < 3:
		t.Fatalf("%s's kept-alive loop relayed %v requests, want the direct pings too", owner.id, relayed)
	}
	if resp, body := do(conn, br, "GET", "/registry/workers", ""); resp.StatusCode != 200 || !strings.Contains(body, `"workers"`) {
		t.Fatalf("registry on a kept-alive connection: %d %s", resp.StatusCode, body)
	}
	for i := range 3 {
		if resp, body := do(conn, br, "GET", "/misc/"+id+"/ping", ""); resp.StatusCode != 200 {
			t.Fatalf("ping %d after the hand-back: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, _ := do(conn, br, "GET", "/misc/"+id+"/gated", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream on a kept-alive connection: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := bufio.NewReader(resp.Body)
	for i := range 3 {
		if i > 0 {
			if r := owner.a.MustDo("POST", "/misc/"+id+"/gated/next", ""); r.Code != 200 {
				t.Fatalf("next event: %d %s", r.Code, r.Body)
			}
		}
		line, err := events.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		if blank, err := events.ReadString('\n'); err != nil || blank != "\n" {
			t.Fatalf("event %d's end: %q, %v", i, blank, err)
		}
	}
	conn.Close()
	testutil.WaitFor(t, 10*time.Second, "the owner's stream ended after the client left", func() bool {
		r := owner.a.MustDo("GET", "/misc/"+id+"/gated/open", "")
		return strings.TrimSpace(r.Body) == "0"
	})

	conn, br = dial()
	if resp, body := do(conn, br, "GET", "/misc/"+id+"/ping", ""); resp.StatusCode != 200 {
		t.Fatalf("ping before the upgrade: %d %s", resp.StatusCode, body)
	}
	resp, _ = do(conn, br, "GET", "/misc/"+id+"/upgrade", "Connection: Upgrade\r\nUpgrade: echo\r\n")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade on a kept-alive connection: %d", resp.StatusCode)
	}
	fmt.Fprint(conn, "hi\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hi\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
}

// The README's fleet, as an operator types it: relative data dirs
// (--data-dir data/n1, so the plugins' sockets are relative too) and a
// client that keeps its connection open. Every request on one connection
// is answered, through the owner and through the other node, whichever
// path carries it, and no plugin request goes unanswered.
func TestRelativeDataDirKeptAliveClient(t *testing.T) {
	t.Parallel()
	wd := t.TempDir()
	relNode := func(id string, extra ...string) *node {
		n := newNode(t, id, extra...)
		n.wd = wd
		for i, a := range n.args {
			if a == "--data-dir" {
				n.dir = filepath.Join("data", id)
				n.args[i+1] = n.dir
			}
		}
		return n
	}
	n1 := relNode("n1", "--bootstrap").start(t, true)
	n2 := relNode("n2", "--join", n1.url()).start(t, true)
	testutil.WaitFleet(t, 10*time.Second, n1.a, n2.a)
	if _, err := os.Stat(filepath.Join(wd, "data", "n1", "run")); err != nil {
		t.Fatalf("n1's runtime dir is not under its working directory: %v", err)
	}

	want := 0
	for _, via := range []*node{n1, n2, n1} {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
		for i := range 5 {
			want++
			req, _ := http.NewRequest("POST", via.url()+"/counters/ka/increment", nil)
			req.Header.Set("Authorization", "Bearer "+testutil.Token)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("request %d via %s: %v", i+1, via.id, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != fmt.Sprintf(`{"value":%d}`, want) {
				t.Fatalf("request %d on one connection via %s: %d %s (want value %d)", i+1, via.id, resp.StatusCode, body, want)
			}
		}
		client.CloseIdleConnections()
	}
	for _, n := range []*node{n1, n2} {
		for _, o := range []string{"unreachable", "unknown"} {
			if v := n.a.Metric(`pinned_plugin_unanswered_total{outcome="` + o + `",plugin="counter"}`); v != 0 {
				t.Errorf("%s: %v plugin requests %s", n.id, v, o)
			}
		}
	}
	if fastPath(t) && n1.a.Metric("pinboard_kept_alive_requests_total")+n2.a.Metric("pinboard_kept_alive_requests_total") == 0 {
		t.Fatal("no request took the kept-alive loop: the test proves nothing about it")
	}
}

// A plugin that crash-loops on one node (a poison input) degrades its
// namespaces there; the ids placed on that node are given up at once, and
// every front door, the degraded node's included, serves them from another
// node within a lease, while the degraded node's /readyz names the
// namespaces.
func TestCrashLoopingPluginGivesItsIDsUp(t *testing.T) {
	t.Parallel()
	th := testutil.Bin(t, "testhost")
	nodes := startFleet(t, "--plugin", "/misc="+th, "--trusted-proxies", "127.0.0.1/32", "--plugin-stable-period", "1m")
	owner, _ := placeMisc(t, nodes, "cl0")
	ids := []string{"cl0"}
	for i := 1; len(ids) < 3 && i < 40; i++ {
		id := fmt.Sprintf("cl%d", i)
		r, err := testutil.Do(context.Background(), "GET", owner.url()+"/misc/"+id+"/ping", "",
			map[string]string{"Authorization": "Bearer " + testutil.Token, "X-Forwarded-For": fmt.Sprintf("198.51.100.%d", i)})
		if err == nil && r.Code == 200 && ownerOf(t, nodes, "/misc", id) == owner {
			ids = append(ids, id)
		}
	}
	// Three quick crashes: the third degrades /misc on the owner.
	for i := range 3 {
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("the plugin serving after %d crashes", i), func() bool {
			r, err := owner.a.Do("GET", "/misc/"+ids[0]+"/ping", "")
			return err == nil && r.Code == 200
		})
		_, _ = owner.a.Do("GET", "/misc/"+ids[0]+"/crash", "")
	}
	testutil.WaitFor(t, 10*time.Second, "/readyz on the owner naming /misc degraded", func() bool {
		r, err := owner.a.Do("GET", "/readyz", "")
		return err == nil && r.Code == 200 && strings.Contains(r.Body, `"degraded":["/misc"]`)
	})
	for _, id := range ids {
		for _, via := range nodes {
			var r testutil.Response
			if err := testutil.Eventually(5*time.Second, func() bool {
				r = via.a.MustDo("GET", "/misc/"+id+"/ping", "")
				return r.Code == 200
			}); err != nil {
				t.Fatalf("%s via %s after its owner %s degraded: %d %s", id, via.id, owner.id, r.Code, r.Body)
			}
			if n := ownerOf(t, nodes, "/misc", id); n == owner {
				t.Fatalf("%s still runs on the degraded %s", id, owner.id)
			}
		}
	}
	t.Logf("%d ids moved off %s", len(ids), owner.id)
}

// An owner that stops (SIGSTOP: it keeps its connections but answers
// nothing, and stops renewing its lease) holds a forwarded request only
// until its lease lapses, not for the forward's own 10 s bound: the client
// gets its 504 (the request may have run) when the id can be placed again,
// on a new connection (net/http's path) and on a kept-alive one (the
// loop's) alike, and the id is then served by another node.
func TestStoppedOwnerAnsweredWhenItsLeaseLapses(t *testing.T) {
	t.Parallel()
	nodes := startFleet(t) // --lease-ttl 3s
	const id = "frozen"
	if r := nodes[0].a.MustDo("POST", "/counters/"+id+"/increment", ""); r.Code != 200 {
		t.Fatalf("first increment: %d %s", r.Code, r.Body)
	}
	owner := ownerOf(t, nodes, "/counters", id)
	var via *node
	for _, n := range nodes {
		if n != owner {
			via = n
		}
	}
	kept := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer kept.CloseIdleConnections()
	post := func(c *http.Client) (int, string, time.Duration) {
		req, _ := http.NewRequest("POST", via.url()+"/counters/"+id+"/increment", nil)
		req.Header.Set("Authorization", "Bearer "+testutil.Token)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST via %s: %v", via.id, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), time.Since(start)
	}
	for range 2 { // the connection's second request rides the loop
		if code, body, _ := post(kept); code != 200 {
			t.Fatalf("warm-up via %s: %d %s", via.id, code, body)
		}
	}
	owner.a.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { owner.a.Signal(syscall.SIGCONT) })

	type answer struct {
		code int
		body string
		took time.Duration
	}
	answers := make(chan answer, 2)
	for _, c := range []*http.Client{kept, {Transport: &http.Transport{}}} {
		go func() {
			code, body, took := post(c)
			answers <- answer{code, body, took}
		}()
	}
	for range 2 {
		a := <-answers
		// The lease is 3 s; the forward's own bound is 10 s.
		if a.code != 504 && a.code != 503 || a.took > 8*time.Second {
			t.Fatalf("a request to the stopped owner: %d %s after %s, want a 504 or 503 once its 3 s lease lapsed", a.code, a.body, a.took)
		}
		t.Logf("answered %d after %s", a.code, a.took.Round(time.Millisecond))
	}
	testutil.WaitFor(t, 15*time.Second, id+" served by another node", func() bool {
		code, _, _ := post(&http.Client{Timeout: 10 * time.Second})
		return code == 200
	})
}
