package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// Bounded connections on the front door, on net/http's side and the
// kept-alive loop's: an idle connection, a stalled request body (read or
// not) and an oversized head are cut; a held response stream is not;
// connections over the per-IP cap get 503; a body over --max-body-size
// gets 413 and never reaches its host; a chunked request (one with both
// Content-Length and Transfer-Encoding, too) closes its connection.

// dialFrom opens a TCP connection from the local IP from to the agent's
// front door (every 127/8 address is this machine's on Linux).
func dialFrom(t *testing.T, a *testutil.Agent, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", strings.TrimPrefix(a.URL, "http://"))
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes raw on c and reads one response (within 10 s).
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return resp, string(b)
}

// closedWithin reads c until the agent closes it, failing if that takes
// longer than limit; it returns how long it took.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %s", what, limit)
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

func TestBoundedConnections(t *testing.T) {
	t.Parallel()
	th := testutil.Bin(t, "testhost")
	a := testutil.StartAgent(t, nil, "--dev", "--http-idle-timeout", "1s", "--http-body-timeout", "1s",
		"--max-body-size", "1KiB", "--plugin", "/tally="+th, "--plugin", "/misc="+th)
	// The cap's own node: this test process's connections (from
	// 127.0.0.1, the node's own IP, exempt once it knows it) stay off it.
	capped := testutil.StartAgent(t, nil, "--dev", "--max-conns-per-ip", "2")

	t.Run("idle connection closed", func(t *testing.T) {
		c := dialFrom(t, a, "127.0.0.1")
		resp, _ := roundTrip(t, c, bufio.NewReader(c), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("GET /healthz: %d close=%v", resp.StatusCode, resp.Close)
		}
		closedWithin(t, c, 15*time.Second, "idle connection after GET /healthz")
	})

	t.Run("stalled body cut, held stream not", func(t *testing.T) {
		// The ticker sends one event a second: four of them hold the
		// stream well past the 1 s body deadline.
		streamed := make(chan error, 1)
		var events int
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", a.URL+"/tickers/bounds/stream?n=4", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				streamed <- err
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data:") {
					events++
				}
			}
			streamed <- sc.Err()
		}()
		start := time.Now()
		c := dialFrom(t, a, "127.0.0.1")
		// Promised ten bytes, sent one.
		if _, err := io.WriteString(c, "POST /counters/bounds/increment HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		closedWithin(t, c, 20*time.Second, "a request whose body stalled")
		if err := <-streamed; err != nil || events != 4 {
			t.Fatalf("held stream: %d of 4 events, err %v (cut by the body deadline?)", events, err)
		}
		if d := time.Since(start); d < 2*time.Second {
			t.Fatalf("the stream ended after %s: not held past the 1s deadline", d)
		}
	})

	t.Run("stalled body on a route that does not read it", func(t *testing.T) {
		// net/http drains an unread body before it answers: the body
		// timeout bounds that too, and the connection closes after.
		for _, tc := range []struct{ path, auth string }{
			{"/nosuch/x", ""}, // 404 unknown namespace
			{"/registry/register", "Bearer not-a-token"}, // 401
			{"/metrics", ""}, // 405: GET only
		} {
			c := dialFrom(t, a, "127.0.0.1")
			head := "POST " + tc.path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
			if tc.auth != "" {
				head += "Authorization: " + tc.auth + "\r\n"
			}
			resp, _ := roundTrip(t, c, bufio.NewReader(c), head+"\r\n")
			if resp.StatusCode < 400 {
				t.Fatalf("POST %s: %d, want a refusal", tc.path, resp.StatusCode)
			}
			closedWithin(t, c, 5*time.Second, "POST "+tc.path+" with a stalled body")
		}
	})

	t.Run("idle kept-alive loop connection closed", func(t *testing.T) {
		c := dialFrom(t, a, "127.0.0.1")
		intoLoop(t, a, c, bufio.NewReader(c), "/counters/idle/value")
		closedWithin(t, c, 5*time.Second, "an idle connection the kept-alive loop holds")
	})

	t.Run("Content-Length and Transfer-Encoding close the connection", func(t *testing.T) {
		const req = "POST /counters/clte/increment HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
		for _, loop := range []bool{false, true} {
			c := dialFrom(t, a, "127.0.0.1")
			br := bufio.NewReader(c)
			if loop {
				intoLoop(t, a, c, br, "/counters/clte/value")
			}
			resp, body := roundTrip(t, c, br, req)
			if resp.StatusCode != 200 || !strings.Contains(body, `"value"`) || !resp.Close {
				t.Fatalf("CL+TE (kept-alive loop: %v): %d close=%v %s, want served and closed", loop, resp.StatusCode, resp.Close, body)
			}
			closedWithin(t, c, 5*time.Second, "the connection after CL+TE")
		}
	})

	t.Run("body over the cap", func(t *testing.T) {
		big := strings.Repeat("x", 2<<10)
		value := func() string {
			return a.MustDo("GET", "/tally/cap/value", "").Body
		}
		c := dialFrom(t, a, "127.0.0.1")
		resp, body := roundTrip(t, c, bufio.NewReader(c), fmt.Sprintf("POST /tally/cap/inc HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big))
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "the limit is 1024 bytes") {
			t.Fatalf("2 KiB body: %d %s, want 413", resp.StatusCode, body)
		}
		// On a connection the kept-alive loop holds: the same.
		c = dialFrom(t, a, "127.0.0.1")
		br := bufio.NewReader(c)
		intoLoop(t, a, c, br, "/tally/cap/value")
		resp, body = roundTrip(t, c, br, fmt.Sprintf("POST /tally/cap/inc HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big))
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("2 KiB body on a kept-alive loop connection: %d %s, want 413", resp.StatusCode, body)
		}
		if v := value(); v != `{"value":0}` {
			t.Fatalf("the host counted %s after two refused bodies", v)
		}
		// Without a length (chunked): cut at the cap on its way to the host.
		c = dialFrom(t, a, "127.0.0.1")
		resp, body = roundTrip(t, c, bufio.NewReader(c), fmt.Sprintf("POST /misc/cap/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(big), big))
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("2 KiB chunked body: %d %.200s, want 413", resp.StatusCode, body)
		}
		// Within the cap: served.
		if r := a.MustDo("POST", "/misc/cap/echo", strings.Repeat("y", 1024)); r.Code != 200 || !strings.Contains(r.Body, `"contentLength":1024`) {
			t.Fatalf("1 KiB body: %d %.200s", r.Code, r.Body)
		}
	})

	t.Run("slow but steady body read whole", func(t *testing.T) {
		// The deadline is on progress, not on the whole body (as
		// http.Server.ReadTimeout is): 2.4 s of body in 0.4 s steps.
		body := `{"namespace":"/counters","id":"nobody","deadline":0}`
		c := dialFrom(t, a, "127.0.0.1")
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintf(c, "POST /registry/wind_down HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(body); i += 9 {
			time.Sleep(400 * time.Millisecond)
			if _, err := io.WriteString(c, body[i:min(i+9, len(body))]); err != nil {
				t.Fatalf("body at %d: %v", i, err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		// The whole JSON was read: the answer is about the id it names.
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(got), "no placement for /counters/nobody") {
			t.Fatalf("a body sent over 2.4s in 0.4s steps: %d %s", resp.StatusCode, got)
		}
	})

	t.Run("oversized head gets 431", func(t *testing.T) {
		c := dialFrom(t, a, "127.0.0.1")
		resp, _ := roundTrip(t, c, bufio.NewReader(c),
			"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\n\r\n")
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("100 KiB head: %d, want 431", resp.StatusCode)
		}
	})

	t.Run("per-IP cap", func(t *testing.T) {
		for i := range 2 {
			c := dialFrom(t, capped, "127.0.0.2")
			if resp, _ := roundTrip(t, c, bufio.NewReader(c), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
				t.Fatalf("connection %d from 127.0.0.2: %d", i+1, resp.StatusCode)
			}
		}
		c := dialFrom(t, capped, "127.0.0.2")
		resp, body := roundTrip(t, c, bufio.NewReader(c), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(body, "too many connections from 127.0.0.2") {
			t.Fatalf("third connection from 127.0.0.2: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		closedWithin(t, c, 10*time.Second, "a refused connection")
		other := dialFrom(t, capped, "127.0.0.3")
		if resp, _ := roundTrip(t, other, bufio.NewReader(other), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("from 127.0.0.3: %d", resp.StatusCode)
		}
		// From 127.0.0.1, exempt once the node's view of its fleet has it
		// (refreshed every second): until then a scrape may be refused too.
		testutil.WaitFor(t, 10*time.Second, `pinboard_connections_refused_total{reason="per-ip"} counts it`, func() bool {
			return capped.Metric(`pinboard_connections_refused_total{reason="per-ip"}`) >= 1
		})
	})
}

// intoLoop sends GET path on c twice, so (with the fast path) the second
// is carried by a's kept-alive loop, and checks that it was: c is then a
// connection the loop holds.
func intoLoop(t *testing.T, a *testutil.Agent, c net.Conn, br *bufio.Reader, path string) {
	t.Helper()
	before := a.Metric("pinboard_kept_alive_requests_total")
	for i := range 2 {
		if resp, body := roundTrip(t, c, br, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("GET %s (%d): %d %s", path, i+1, resp.StatusCode, body)
		}
	}
	if after := a.Metric("pinboard_kept_alive_requests_total"); fastPath(t) && after <= before {
		t.Fatalf("the kept-alive loop carried none of two requests on one connection (%v before, %v after)", before, after)
	}
}

// What a fleet node (no --dev: no anonymous loopback) shows without a
// token: /registry/health says ok, ready and quarantineMs only, /metrics
// nothing unless --metrics-public.
func TestUnauthenticatedSurface(t *testing.T) {
	t.Parallel()
	n := newNode(t, "s1", "--bootstrap").start(t, true)
	pub := newNode(t, "s2", "--bootstrap", "--metrics-public").start(t, true)
	anon := func(a *testutil.Agent, path string) testutil.Response {
		t.Helper()
		r, err := testutil.Do(context.Background(), "GET", a.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	keys := func(r testutil.Response) []string {
		var m map[string]any
		r.JSON(t, &m)
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}

	if r := anon(n.a, "/registry/health"); r.Code != 200 || fmt.Sprint(keys(r)) != "[ok quarantineMs ready]" {
		t.Fatalf("health without a token: %d %s", r.Code, r.Body)
	}
	full := n.a.MustDo("GET", "/registry/health", "")
	for _, k := range []string{"term", "appliedIndex", "leader", "leaderUrl"} {
		if !strings.Contains(full.Body, `"`+k+`"`) {
			t.Fatalf("health with the token has no %s: %s", k, full.Body)
		}
	}

	if r := anon(n.a, "/metrics"); r.Code != http.StatusUnauthorized || !strings.Contains(r.Body, "PINBOARD_TOKEN") {
		t.Fatalf("/metrics without a token: %d %s", r.Code, r.Body)
	}
	if r := n.a.MustDo("GET", "/metrics", ""); r.Code != 200 || !strings.Contains(r.Body, "pinboard_connections ") {
		t.Fatalf("/metrics with the token: %d", r.Code)
	}
	if r := anon(pub.a, "/metrics"); r.Code != 200 || !strings.Contains(r.Body, "pinboard_connections ") {
		t.Fatalf("/metrics without a token on a --metrics-public node: %d %.200s", r.Code, r.Body)
	}
}
