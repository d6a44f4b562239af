package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

// hostnameNode is a fleet member in hostname-aware mode: its plugins are
// the routes given, and nothing else.
func hostnameNode(t *testing.T, id string, routes []string, extra ...string) *node {
	n := &node{id: id, http: testutil.FreeAddr(t), raft: testutil.FreeAddr(t), dir: filepath.Join(t.TempDir(), id)}
	n.args = []string{
		"--node-id", id, "--http-addr", n.http, "--raft-addr", n.raft, "--data-dir", n.dir, "--hostname-aware",
		"--lease-ttl", "3s", "--heartbeat-interval", "500ms", "--raft-timeout", "300ms",
	}
	for _, r := range routes {
		n.args = append(n.args, "--plugin", r)
	}
	n.args = append(n.args, extra...)
	return n
}

// viaHost sends one request to n for Host host.
func viaHost(t *testing.T, n *node, method, host, path string) testutil.Response {
	t.Helper()
	r, err := testutil.Do(context.Background(), method, n.url()+path, "",
		map[string]string{"Host": host, "Authorization": "Bearer " + testutil.Token})
	if err != nil {
		t.Fatalf("%s %s%s via %s: %v", method, host, path, n.id, err)
	}
	return r
}

// expectHost checks one answer through Host host; want "" takes any body.
func expectHost(t *testing.T, n *node, method, host, path string, code int, want string) testutil.Response {
	t.Helper()
	r := viaHost(t, n, method, host, path)
	if r.Code != code || (want != "" && strings.TrimSpace(r.Body) != want) {
		t.Fatalf("%s %s%s via %s = %d %q, want %d %q", method, host, path, n.id, r.Code, strings.TrimSpace(r.Body), code, want)
	}
	return r
}

// Preview environments, as seed 004 runs them: two nodes in
// hostname-aware mode sharing Postgres, each running builds of one
// counter host side by side under their own hostnames. pr-41 and pr-42
// share env staging, so an id is one counter through either (a request
// through the other hostname takes it over once its holder wound it down);
// pr-43 has an env of its own; a deny env refuses a second hostname while
// the holder lives. A request without a Host, or for a hostname no worker
// serves, is refused with the seeds' words. A higher epoch displaces a
// binding: for a lease nothing is placed through it, the displaced node
// is told on its next heartbeat, aborts what it ran and reports it in
// /readyz; then the hostname serves its new env.
func TestPreviewEnvironments(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	dir := filepath.Join(testutil.SharedDir(t), "plugins")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(dir, "counter")
	copyFile(t, testutil.Bin(t, "counter"), counter)
	routes := []string{
		"pr-41.preview.example.com/counters=" + counter + ",env=staging",
		"pr-42.preview.example.com/counters=" + counter + ",env=staging",
		"pr-43.preview.example.com/counters=" + counter,
		"a.locked.test/counters=" + counter + ",env=locked,takeover=deny",
		"b.locked.test/counters=" + counter + ",env=locked,takeover=deny",
	}
	n1 := hostnameNode(t, "n1", routes, "--bootstrap", "--database-url", dsn, "--plugin-dir", dir).start(t, true)
	n2 := hostnameNode(t, "n2", routes, "--join", n1.url(), "--database-url", dsn, "--plugin-dir", dir).start(t, true)
	testutil.WaitForErr(t, 20*time.Second, "both workers live, the quarantine over", func() error {
		for _, n := range []*node{n1, n2} {
			if c, err := n.a.LiveWorkers(); err != nil || c != 2 {
				return fmt.Errorf("%s: %d live workers (%v)", n.id, c, err)
			}
		}
		if r := viaHost(t, n1, "GET", "pr-43.preview.example.com", "/counters/warmup/value"); r.Code != http.StatusOK {
			return fmt.Errorf("%d %s", r.Code, r.Body)
		}
		return nil
	})

	if out, err := testutil.CLI(t, "workers", "--addr", n2.url()); err != nil || strings.Count(out, "pr-41.preview.example.com/counters (env staging)") != 2 {
		t.Fatalf("pinnedd workers lists each node's routes with their env: %v\n%s", err, out)
	}

	// Ids live per env: staging's a is one counter, pr-43's another.
	expectHost(t, n1, "POST", "pr-41.preview.example.com", "/counters/a/increment", 200, `{"value":1}`)
	expectHost(t, n2, "POST", "PR-41.preview.example.com:8080", "/counters/a/increment", 200, `{"value":2}`)
	expectHost(t, n2, "POST", "pr-43.preview.example.com", "/counters/a/increment", 200, `{"value":1}`)

	// The seeds' refusals.
	missing := rawRequest(t, n1, "GET /counters/a/value HTTP/1.0\r\n\r\n")
	if !strings.HasPrefix(missing, "HTTP/1.0 400") || !strings.Contains(missing, `{"error":"missing Host header"}`) {
		t.Fatalf("a request without a Host: %q", missing)
	}
	r := expectHost(t, n1, "GET", "nobody.preview.example.com", "/counters/a/value", 503, "")
	if !strings.Contains(r.Body, "no live workers for hostname") || r.Header.Get("Retry-After") == "" {
		t.Fatalf("an unserved hostname: %s (Retry-After %q)", r.Body, r.Header.Get("Retry-After"))
	}

	// wind_down: pr-42 asks for staging's a, which pr-41 holds. The holder
	// is told to wind it down within a lease; pr-42 retries until then,
	// and goes on from the holder's last value.
	r = expectHost(t, n1, "POST", "pr-42.preview.example.com", "/counters/a/increment", 503, "")
	if !strings.Contains(r.Body, "takeover in progress, retry") || r.Header.Get("Retry-After") == "" {
		t.Fatalf("first request of a takeover: %s (Retry-After %q)", r.Body, r.Header.Get("Retry-After"))
	}
	testutil.WaitFor(t, 15*time.Second, "pr-42 took staging's a over", func() bool {
		r = viaHost(t, n2, "POST", "pr-42.preview.example.com", "/counters/a/increment")
		return r.Code == http.StatusOK
	})
	if strings.TrimSpace(r.Body) != `{"value":3}` {
		t.Fatalf("after the takeover: %s, want 3", r.Body)
	}

	// deny: b.locked never takes over what a.locked holds.
	expectHost(t, n2, "POST", "a.locked.test", "/counters/d/increment", 200, `{"value":1}`)
	for _, n := range []*node{n1, n2} {
		expectHost(t, n, "POST", "b.locked.test", "/counters/d/increment", 503, `{"error":"placement held by another hostname"}`)
	}
	expectHost(t, n1, "GET", "a.locked.test", "/counters/d/value", 200, `{"value":1}`)

	// From here on, clients of two other hostnames never see a failed
	// request while previews come and go.
	l := startLoadWith(4, func(w int) (testutil.Response, error) {
		host := []string{"pr-42.preview.example.com", "a.locked.test"}[w%2]
		return testutil.Do(context.Background(), "POST", []*node{n1, n2}[w/2].url()+fmt.Sprintf("/counters/load%d/increment", w), "",
			map[string]string{"Host": host, "Authorization": "Bearer " + testutil.Token})
	})
	acked := &l.acked
	testutil.WaitFor(t, 10*time.Second, "load flowing", func() bool { return acked.Load() > 20 })

	// A preview deployed on a running node, and torn down.
	if out, err := testutil.CLI(t, "plugins", "add", "--addr", n1.url(), "pr-44.preview.example.com/counters="+counter); err != nil {
		t.Fatalf("plugins add pr-44: %v\n%s", err, out)
	}
	expectHost(t, n1, "POST", "pr-44.preview.example.com", "/counters/a/increment", 200, `{"value":1}`)
	testutil.WaitFor(t, 5*time.Second, "n2's replica shows pr-44", func() bool {
		return viaHost(t, n2, "GET", "pr-44.preview.example.com", "/counters/a/value").Code == http.StatusOK
	})
	if out, err := testutil.CLI(t, "plugins", "remove", "--addr", n1.url(), "pr-44.preview.example.com/counters"); err != nil {
		t.Fatalf("plugins remove pr-44: %v\n%s", err, out)
	}
	testutil.WaitFor(t, 10*time.Second, "pr-44 gone from the fleet", func() bool {
		r := viaHost(t, n2, "POST", "pr-44.preview.example.com", "/counters/a/increment")
		return r.Code == http.StatusServiceUnavailable && strings.Contains(r.Body, "no live workers for hostname")
	})

	// A new build of pr-43 on n2, in a new env at a higher epoch, displaces
	// n1's binding of the hostname.
	if out, err := testutil.CLI(t, "plugins", "remove", "--addr", n2.url(), "pr-43.preview.example.com/counters"); err != nil {
		t.Fatalf("plugins remove: %v\n%s", err, out)
	}
	if out, err := testutil.CLI(t, "plugins", "add", "--addr", n2.url(), "pr-43.preview.example.com/counters="+counter+",env=pr-43-v2,epoch=1"); err != nil {
		t.Fatalf("plugins add at epoch 1: %v\n%s", err, out)
	}
	r = viaHost(t, n1, "GET", "pr-43.preview.example.com", "/counters/a/value")
	if r.Code != http.StatusServiceUnavailable || !strings.Contains(r.Body, "hostname binding displaced, retry") {
		t.Fatalf("through a binding displaced a moment ago: %d %s", r.Code, r.Body)
	}
	testutil.WaitForErr(t, 15*time.Second, "n1 reports its pr-43 superseded", func() error {
		r, err := n1.a.Do("GET", "/readyz", "")
		if err != nil || r.Code != http.StatusServiceUnavailable || !strings.Contains(r.Body, "superseded") {
			return fmt.Errorf("/readyz: %d %s %v", r.Code, r.Body, err)
		}
		return nil
	})
	testutil.WaitFor(t, 15*time.Second, "pr-43 serves its new env", func() bool {
		r = viaHost(t, n1, "POST", "pr-43.preview.example.com", "/counters/a/increment")
		return r.Code == http.StatusOK
	})
	if strings.TrimSpace(r.Body) != `{"value":1}` {
		t.Fatalf("pr-43's a in its new env: %s, want a fresh 1", r.Body)
	}
	for _, in := range getStatus(t, n1.a).Instances {
		if in.Env == "pr-43.preview.example.com" {
			t.Fatalf("n1 still runs an id of pr-43's displaced env: %+v", in)
		}
	}
	// The other hostnames never noticed.
	expectHost(t, n1, "GET", "pr-42.preview.example.com", "/counters/a/value", 200, `{"value":3}`)
	before := acked.Load()
	testutil.WaitFor(t, 10*time.Second, "load still flowing", func() bool { return acked.Load() > before+20 })
	if bad := l.Stop(); bad != nil || l.refused.Load() != 0 {
		t.Fatalf("clients of other hostnames saw failures: last %v, %d refused, %d acked", bad, l.refused.Load(), acked.Load())
	}
}

// rawRequest writes req on a new connection to n and reads the answer
// until the server closes it.
func rawRequest(t *testing.T, n *node, req string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", n.http, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// A fleet whose nodes disagree on --hostname-aware runs, and says so:
// each node logs one ERROR naming the other mode's worker.
func TestMixedModeFleetSaysSo(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := hostnameNode(t, "n2", []string{"127.0.0.1/counters=" + testutil.Bin(t, "counter")}, "--join", n1.url(), "--local-state").start(t, true)
	for _, c := range []struct {
		n     *node
		other string
	}{{n1, "n2"}, {n2, "n1"}} {
		testutil.WaitFor(t, 30*time.Second, c.n.id+" logs the other mode's worker", func() bool {
			logs := c.n.a.Logs()
			return strings.Contains(logs, "runs in the other mode") && strings.Contains(logs, `"worker_node":"`+c.other+`"`)
		})
		if n := strings.Count(c.n.a.Logs(), "runs in the other mode"); n != 1 {
			t.Errorf("%s logged the mismatch %d times, want once", c.n.id, n)
		}
	}
}
