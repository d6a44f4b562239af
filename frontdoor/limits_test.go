package frontdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// dialFrom opens a TCP connection to addr from the local IP from.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get sends one GET on c and reads the answer (with a deadline).
func get(t *testing.T, c net.Conn, path string) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// startLimited serves ok on a loopback listener (all of 127/8) wrapped
// by a limiter with limits.
func startLimited(t *testing.T, limits ConnLimits) (*ConnLimiter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewConnLimiter(limits, nil, nil)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(lim.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return lim, ln.Addr().String()
}

// Over the per-IP cap, a connection gets 503 + Retry-After naming its IP
// and is closed; another IP is still served; closing one frees its slot.
func TestConnLimiterPerIP(t *testing.T) {
	lim, addr := startLimited(t, ConnLimits{PerIP: 2})
	a1, a2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	for _, c := range []net.Conn{a1, a2} {
		if resp, body := get(t, c, "/"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("within the cap: %d %q", resp.StatusCode, body)
		}
	}
	a3 := dialFrom(t, "127.0.0.2", addr)
	resp, body := get(t, a3, "/")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, "too many connections from 127.0.0.2") || !resp.Close {
		t.Fatalf("over the cap: %d Retry-After=%q close=%v %q", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, body)
	}
	if _, err := a3.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("refused connection not closed: %v", err)
	}
	if resp, _ := get(t, dialFrom(t, "127.0.0.3", addr), "/"); resp.StatusCode != 200 {
		t.Fatalf("another IP: %d", resp.StatusCode)
	}
	if n := lim.From(netip.MustParseAddr("127.0.0.2")); n != 2 {
		t.Fatalf("127.0.0.2 holds %d slots, want 2 (the refused one holds none)", n)
	}
	_ = a1.Close()
	testutil.WaitFor(t, 5*time.Second, "the closed connection's slot given back", func() bool {
		return lim.From(netip.MustParseAddr("127.0.0.2")) == 1
	})
	if resp, _ := get(t, dialFrom(t, "127.0.0.2", addr), "/"); resp.StatusCode != 200 {
		t.Fatalf("after a close: %d", resp.StatusCode)
	}
}

// The total cap counts every IP; Exempt IPs skip the per-IP cap only.
func TestConnLimiterTotalAndExempt(t *testing.T) {
	exempt := netip.MustParseAddr("127.0.0.4")
	_, addr := startLimited(t, ConnLimits{PerIP: 1, Total: 3, Exempt: func(ip netip.Addr) bool { return ip == exempt }})
	for i := range 3 {
		if resp, _ := get(t, dialFrom(t, "127.0.0.4", addr), "/"); resp.StatusCode != 200 {
			t.Fatalf("exempt connection %d: %d", i, resp.StatusCode)
		}
	}
	resp, body := get(t, dialFrom(t, "127.0.0.5", addr), "/")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "too many connections to this node") {
		t.Fatalf("over the total cap: %d %q", resp.StatusCode, body)
	}
}

// A connection whose socket was taken (Detach) keeps its slot past Close
// until the taker releases it, once.
func TestConnLimiterDetach(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lim := NewConnLimiter(ConnLimits{PerIP: 5}, nil, nil)
	lln := lim.Listener(ln)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	dialFrom(t, "127.0.0.6", ln.Addr().String())
	c := <-accepted
	ip := netip.MustParseAddr("127.0.0.6")
	release := c.(interface{ Detach() func() }).Detach()
	_ = c.Close()
	if n := lim.From(ip); n != 1 {
		t.Fatalf("after Detach and Close: %d slots, want 1", n)
	}
	release()
	release()
	if n, tot := lim.From(ip), lim.Total(); n != 0 || tot != 0 {
		t.Fatalf("after release: %d from the IP, %d in all; want 0", n, tot)
	}
}

// startCappedFront serves a front door, fast path on and at most perIP
// connections from a client IP, on a loopback listener; its directory
// places /counters/c1 on an owner (serve) on another node.
func startCappedFront(t *testing.T, perIP int, serve http.HandlerFunc, adjust ...func(*nodeConfig)) (*FrontDoor, string) {
	t.Helper()
	owner := httptest.NewServer(serve)
	t.Cleanup(owner.Close)
	m := directory.New()
	now := time.Now().UnixMilli()
	testdir.Apply(m, 1, directory.Init{Secret: []byte("0123456789abcdef0123456789abcdef")})
	testdir.Apply(m, 2, directory.Register{
		ClientID: "owner", SessionID: "s1", NodeID: "n2", AdvertiseURL: owner.URL, Namespaces: []string{"/counters"},
		Headroom: 1 << 20, TTLMs: time.Hour.Milliseconds(), Now: now,
	})
	if res := testdir.Apply(m, 3, directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "c1"}, ClientID: "owner", Now: now}); res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	dir := pinboard.NewDirectory(m, nil)
	t.Cleanup(dir.Close)
	cfg := nodeConfig{Config: Config{
		Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry(),
		FastPath: true, MaxConnsPerIP: perIP,
	}}
	for _, a := range adjust {
		a(&cfg)
	}
	f := newNode(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Shutdown(ctx); err != nil {
			t.Errorf("front door shutdown: %v", err)
		}
	})
	return f, ln.Addr().String()
}

// A connection that left net/http for the fast path keeps its slot under
// the per-IP cap: one moved to the kept-alive loop after a forwarded
// request, or one carrying a held stream in the relay loop. A client
// whose two connections each did is refused a third with the cap's 503,
// and gets its slots back as it closes them.
func TestConnCapCountsFastPath(t *testing.T) {
	ip := netip.MustParseAddr("127.0.0.2")
	for _, kind := range []string{"kept-alive", "held-stream"} {
		t.Run(kind, func(t *testing.T) {
			f, addr := startCappedFront(t, 2, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/_pinned/i/counters/c1/events" {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: hello\n\n")
					_ = http.NewResponseController(w).Flush()
					<-r.Context().Done()
					return
				}
				w.Header().Set("Content-Length", "3")
				_, _ = io.WriteString(w, "one")
			})
			// open makes a connection from ip, carrying its request to
			// the fast path.
			open := func() net.Conn {
				c := dialFrom(t, ip.String(), addr)
				if kind == "kept-alive" {
					if resp, body := get(t, c, "/counters/c1/value"); resp.StatusCode != 200 || body != "one" {
						t.Fatalf("forwarded: %d %q", resp.StatusCode, body)
					}
					return c
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, "GET /counters/c1/events HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: hello\n" {
					t.Fatalf("held stream: %d, first event %q %v", resp.StatusCode, line, err)
				}
				return c
			}
			// moved waits until n connections left net/http for the fast
			// path (where there is one).
			moved := func(n int) {
				if !relay.Supported {
					return
				}
				testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d connections on the fast path", n), func() bool {
					if kind == "kept-alive" {
						return f.keep.conns.Len() == n
					}
					return f.fwd.held.Len() == n
				})
			}
			a1, a2 := open(), open()
			if kind == "kept-alive" {
				// A request the loop gives back to net/http, then one it
				// takes again: the slot goes along both ways.
				if resp, _ := get(t, a2, "/healthz"); resp.StatusCode != 200 {
					t.Fatalf("given back: %d", resp.StatusCode)
				}
				if resp, body := get(t, a2, "/counters/c1/value"); resp.StatusCode != 200 || body != "one" {
					t.Fatalf("forwarded again: %d %q", resp.StatusCode, body)
				}
				if relay.Supported && f.keep.conns.HandedBack() != 1 {
					t.Fatalf("%d connections given back to net/http, want 1", f.keep.conns.HandedBack())
				}
			}
			moved(2)
			resp, body := get(t, dialFrom(t, ip.String(), addr), "/healthz")
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "too many connections from 127.0.0.2") {
				t.Fatalf("a third connection with two on the fast path: %d %q, want the per-IP cap's 503", resp.StatusCode, body)
			}
			if n := f.limiter.From(ip); n != 2 {
				t.Fatalf("%s holds %d slots, want 2", ip, n)
			}
			_ = a1.Close()
			testutil.WaitFor(t, 10*time.Second, "the closed connection's slot given back", func() bool { return f.limiter.From(ip) == 1 })
			a3 := open()
			moved(2)
			_, _ = a2.Close(), a3.Close()
			testutil.WaitFor(t, 10*time.Second, "every slot given back", func() bool { return f.limiter.From(ip) == 0 && f.limiter.Total() == 0 })
		})
	}
}

// A body that stops arriving is cut after BodyReadTimeout: the handler's
// read fails with a deadline error and the connection closes.
func TestBodyReadDeadlineCutsStall(t *testing.T) {
	readErr := make(chan error, 1)
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) { cfg.BodyReadTimeout = 300 * time.Millisecond })
	rig.f.Handle("POST /_t/read", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	}))
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(rig.srv.URL, "http://"))
	if _, err := io.WriteString(c, "POST /_t/read HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nA"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-readErr:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("stalled body read: %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stalled body was still being read after 10s")
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("connection not closed after the cut: %v", err)
	}
}

// A body that keeps arriving, slower in all than the bound but never
// stalling for it, is read whole; once it is read, a response held
// longer than the bound keeps its request context (net/http's background
// read runs with no deadline).
func TestBodyReadDeadlineSparesProgressAndHeldResponse(t *testing.T) {
	const bound = 300 * time.Millisecond
	var canceled atomic.Bool
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) { cfg.BodyReadTimeout = bound })
	rig.f.Handle("POST /_t/hold", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Readers often read once more past the end (a JSON decoder
		// checking for trailing data): that must not arm a deadline.
		if _, err := r.Body.Read(make([]byte, 1)); err != io.EOF {
			http.Error(w, fmt.Sprint("read past the end: ", err), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: got %d\n\n", len(b))
		http.NewResponseController(w).Flush()
		for i := range 10 { // 10 x 100ms: three times the bound
			select {
			case <-r.Context().Done():
				canceled.Store(true)
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
		}
		io.WriteString(w, "data: end\n\n")
	}))
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(rig.srv.URL, "http://"))
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	body := "0123456789"
	if _, err := io.WriteString(c, "POST /_t/hold HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for i := range body { // 10 x 100 ms: more than the bound in all
		time.Sleep(100 * time.Millisecond)
		if _, err := io.WriteString(c, body[i:i+1]); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("held response cut: %v after %q", err, got)
	}
	if !strings.HasPrefix(string(got), "data: got 10\n") || !strings.HasSuffix(string(got), "data: end\n\n") || canceled.Load() {
		t.Fatalf("held response: %q (context canceled: %v)", got, canceled.Load())
	}
}

// Without a token, /registry/health shows readiness and quarantine only;
// operator scope adds the directory's and consensus view; a wrong token
// is refused.
func TestRegistryHealthSurface(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) {
		cfg.API.Health = func() map[string]any {
			return map[string]any{"term": "7", "leader": "n1", "leaderUrl": "http://10.0.0.1:8080"}
		}
		cfg.Tokens.Grant("worker-token", pinboard.ScopeWorker)
	})
	view := func(token string) (int, map[string]any) {
		code, body, _ := rig.call(t, "GET", "/registry/health", token, "")
		var m map[string]any
		_ = json.Unmarshal([]byte(body), &m)
		return code, m
	}
	keys := func(m map[string]any) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		return fmt.Sprint(len(ks), ks)
	}
	for _, tok := range []string{"", "worker-token"} {
		code, m := view(tok)
		if code != 200 || len(m) != 3 || m["ok"] != true || m["quarantineMs"] == nil || m["ready"] == nil {
			t.Fatalf("token %q: %d %s, want ok, quarantineMs, ready only", tok, code, keys(m))
		}
	}
	code, m := view("op-token")
	for _, k := range []string{"ok", "quarantineMs", "ready", "appliedIndex", "workers", "term", "leader", "leaderUrl"} {
		if _, ok := m[k]; code != 200 || !ok {
			t.Fatalf("operator view: %d, no %q in %v", code, k, m)
		}
	}
	if code, _ := view("wrong-token"); code != http.StatusUnauthorized {
		t.Fatalf("unknown token: %d, want 401", code)
	}
}

// /metrics needs the operator token unless MetricsPublic.
func TestMetricsNeedOperator(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") })
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) { cfg.API.Metrics = metrics })
	if code, body, _ := rig.call(t, "GET", "/metrics", "", ""); code != http.StatusUnauthorized || !strings.Contains(body, "PINBOARD_TOKEN") {
		t.Fatalf("no token: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/metrics", "op-token", ""); code != 200 || body != "m 1\n" {
		t.Fatalf("operator: %d %s", code, body)
	}
	pub := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) { cfg.API.Metrics, cfg.API.MetricsPublic = metrics, true })
	if code, body, _ := pub.call(t, "GET", "/metrics", "", ""); code != 200 || body != "m 1\n" {
		t.Fatalf("public: %d %s", code, body)
	}
}

// The per-IP cap exempts the fleet's own nodes (members' front doors and
// workers' advertise URLs) and trusted proxies; they still count in all.
func TestFrontDoorListenerExemptsFleet(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) {
		cfg.MaxConnsPerIP = 1
		cfg.PeerAddrs = func() []string { return []string{"http://127.0.0.8:8080"} }
		cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")}
	})
	res, err := rig.dir.Do(t.Context(), directory.Register{
		ClientID: "w10", SessionID: "s-w10", NodeID: "n10", AdvertiseURL: "http://127.0.0.10:8080",
		Namespaces: []string{"/counters"}, Headroom: 10, TTLMs: time.Hour.Milliseconds(), Now: time.Now().UnixMilli(),
	})
	if err != nil || res.Code != directory.CodeOK {
		t.Fatalf("register: %v %v", err, res.Code)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rig.f}
	go func() { _ = srv.Serve(rig.f.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()
	testutil.WaitFor(t, 5*time.Second, "the fleet's IPs known", func() bool {
		return rig.f.exemptFromIPCap(netip.MustParseAddr("127.0.0.8")) && rig.f.exemptFromIPCap(netip.MustParseAddr("127.0.0.10"))
	})
	for _, ip := range []string{"127.0.0.8", "127.0.0.9", "127.0.0.10"} {
		for i := range 3 {
			if resp, _ := get(t, dialFrom(t, ip, addr), "/healthz"); resp.StatusCode != 200 {
				t.Fatalf("connection %d from %s: %d", i+1, ip, resp.StatusCode)
			}
		}
	}
	get(t, dialFrom(t, "127.0.0.11", addr), "/healthz")
	if resp, _ := get(t, dialFrom(t, "127.0.0.11", addr), "/healthz"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second connection from a client IP: %d, want 503", resp.StatusCode)
	}
}

// closedWithin reads c until the far end closes it, failing if that takes
// longer than limit.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: still open after %s", what, limit)
	}
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("%s: %v", what, err)
	}
}

// answer writes raw on c and reads one response, with a deadline.
func answer(t *testing.T, c net.Conn, br *bufio.Reader, raw string, within time.Duration) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %s to %.60q: %v", within, raw, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer's body: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return resp, string(b)
}

// A route that answers without reading its body (404, 401) leaves the
// body to net/http, which drains up to 256 KiB of it before it writes the
// answer: a body that never comes is bounded by BodyReadTimeout all the
// same, and the connection closes after the answer.
func TestUnreadBodyBounded(t *testing.T) {
	const bound = 300 * time.Millisecond
	rig := newDoorRig(t, func(_ *doorRig, cfg *nodeConfig) { cfg.BodyReadTimeout = bound })
	rig.f.Handle("POST /_t/flush", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Answers and flushes at once, the body unread, then holds.
		w.WriteHeader(http.StatusAccepted)
		_ = http.NewResponseController(w).Flush()
		time.Sleep(2 * bound)
	}))
	for path, want := range map[string]int{
		"/nosuch/x":       http.StatusNotFound,     // an unknown namespace
		"/registry/drain": http.StatusUnauthorized, // no token
		"/_nosuch":        http.StatusNotFound,     // the mux's own
		"/_t/flush":       http.StatusAccepted,
	} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(rig.srv.URL, "http://"))
			// Ten bytes promised, none sent.
			resp, _ := answer(t, c, bufio.NewReader(c), "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", 10*bound)
			if resp.StatusCode != want {
				t.Fatalf("POST %s with a stalled body: %d, want %d", path, resp.StatusCode, want)
			}
			closedWithin(t, c, 10*bound, "a connection whose unread body stalled")
		})
	}
	t.Run("body that arrives keeps the connection", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(rig.srv.URL, "http://"))
		br := bufio.NewReader(c)
		for i := range 2 {
			resp, _ := answer(t, c, br, "POST /nosuch/x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789", 10*bound)
			if resp.StatusCode != http.StatusNotFound || resp.Close {
				t.Fatalf("request %d: %d close=%v, want 404 on a kept connection", i, resp.StatusCode, resp.Close)
			}
		}
	})
}

// A client's request with both Content-Length and Transfer-Encoding is
// served by its chunked framing (net/http's reading) and its connection
// closes after the answer (RFC 9112 §6.1), as for any chunked request of a
// client's, even when the handler relays a 1xx first (ReverseProxy clears
// the header then); a peer's chunked request keeps its connection.
func TestChunkedRequestClosesConnection(t *testing.T) {
	rig := newDoorRig(t, nil)
	rig.f.Handle("POST /_t/echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Query().Has("hints") {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			clear(w.Header())
		}
		_, _ = w.Write(b)
	}))
	peers := httptest.NewServer(rig.f.PeerHandler())
	t.Cleanup(peers.Close)
	const clte = "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
	for name, tc := range map[string]struct {
		srv, head string
		close     bool
	}{
		"CL+TE":             {rig.srv.URL, "POST /_t/echo HTTP/1.1\r\nHost: x\r\n" + clte, true},
		"TE+CL":             {rig.srv.URL, "POST /_t/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true},
		"CL+TE after a 1xx": {rig.srv.URL, "POST /_t/echo?hints HTTP/1.1\r\nHost: x\r\n" + clte, true},
		"chunked":           {rig.srv.URL, "POST /_t/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true},
		"length only":       {rig.srv.URL, "POST /_t/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", false},
		"a peer's chunked":  {peers.URL, "POST /_t/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false},
	} {
		t.Run(name, func(t *testing.T) {
			c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(tc.srv, "http://"))
			br := bufio.NewReader(c)
			resp, body := answer(t, c, br, tc.head, 5*time.Second)
			for resp.StatusCode == http.StatusEarlyHints {
				var err error
				if resp, err = http.ReadResponse(br, nil); err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				body = string(b)
			}
			if resp.StatusCode != 200 || body != "hello" || resp.Close != tc.close {
				t.Fatalf("%d %q close=%v, want 200 \"hello\" close=%v", resp.StatusCode, body, resp.Close, tc.close)
			}
			if tc.close {
				closedWithin(t, c, 5*time.Second, "the connection after a chunked request")
				return
			}
			if resp, _ := answer(t, c, br, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second); resp.StatusCode != 200 {
				t.Fatalf("next request on the kept connection: %d", resp.StatusCode)
			}
		})
	}
}

// A body over MaxBodyBytes is refused 413 before anything runs: at once,
// unread, when its Content-Length says so (the connection closes instead
// of draining it); a chunked one is cut at the cap and its forward
// answered 413. The owner never receives more than the cap.
func TestBodyCap(t *testing.T) {
	const limit = 1000
	var whole atomic.Int64 // bodies the owner read to their end
	var ran atomic.Int64   // requests that reached the owner
	f, addr := startCappedFront(t, 0, func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		n, err := io.Copy(io.Discard, r.Body)
		if err == nil {
			whole.Add(1)
		}
		w.Header().Set("Content-Length", "2")
		_, _ = fmt.Fprintf(w, "%02d", n%100)
	}, func(cfg *nodeConfig) { cfg.MaxBodyBytes = limit })
	post := func(c net.Conn, br *bufio.Reader, head, body string) (*http.Response, string) {
		t.Helper()
		return answer(t, c, br, "POST /counters/c1/increment HTTP/1.1\r\nHost: x\r\n"+head+"\r\n"+body, 5*time.Second)
	}
	t.Run("declared over the cap", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		// No body bytes sent: the answer must not wait for them.
		resp, body := post(c, bufio.NewReader(c), fmt.Sprintf("Content-Length: %d\r\n", limit+1), "")
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "the limit is 1000 bytes") || !resp.Close {
			t.Fatalf("%d %q close=%v, want 413 and close", resp.StatusCode, body, resp.Close)
		}
		closedWithin(t, c, 5*time.Second, "after a 413")
	})
	t.Run("at the cap", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		if resp, body := post(c, bufio.NewReader(c), fmt.Sprintf("Content-Length: %d\r\n", limit), strings.Repeat("a", limit)); resp.StatusCode != 200 || body != "00" {
			t.Fatalf("%d %q, want the owner's 200 \"00\"", resp.StatusCode, body)
		}
	})
	t.Run("chunked over the cap", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		chunk := strings.Repeat("b", 600)
		resp, body := post(c, bufio.NewReader(c), "Transfer-Encoding: chunked\r\n",
			fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", len(chunk), chunk, len(chunk), chunk))
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "the limit is 1000 bytes") {
			t.Fatalf("%d %q, want 413", resp.StatusCode, body)
		}
	})
	if relay.Supported {
		t.Run("on a kept-alive connection", func(t *testing.T) {
			// The loop gives a request over the cap back to net/http,
			// which refuses it.
			c := dialFrom(t, "127.0.0.1", addr)
			br := bufio.NewReader(c)
			if resp, _ := post(c, br, "Content-Length: 0\r\n", ""); resp.StatusCode != 200 {
				t.Fatalf("first request: %d", resp.StatusCode)
			}
			testutil.WaitFor(t, 5*time.Second, "the connection in the kept-alive loop", func() bool { return f.keep.conns.Len() == 1 })
			back := f.keep.conns.HandedBack()
			resp, _ := post(c, br, fmt.Sprintf("Content-Length: %d\r\n", limit+1), strings.Repeat("c", limit+1))
			if resp.StatusCode != http.StatusRequestEntityTooLarge || f.keep.conns.HandedBack() != back+1 {
				t.Fatalf("%d, handed back %d, want 413 from net/http", resp.StatusCode, f.keep.conns.HandedBack()-back)
			}
		})
	}
	// Within the cap: the one at it, and the kept-alive subtest's first.
	within := int64(1)
	if relay.Supported {
		within++
	}
	// The chunked one may have reached the owner, its body cut short.
	if whole.Load() != within || ran.Load() > within+1 {
		t.Fatalf("the owner got %d requests and read %d bodies whole, want %d whole and no other but the cut one",
			ran.Load(), whole.Load(), within)
	}
}
