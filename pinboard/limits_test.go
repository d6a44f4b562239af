package pinboard

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
func startCappedFront(t *testing.T, perIP int, serve http.HandlerFunc) (*FrontDoor, string) {
	t.Helper()
	owner := httptest.NewServer(serve)
	t.Cleanup(owner.Close)
	m := directory.New()
	now := time.Now().UnixMilli()
	applyTo(m, 1, directory.Init{Secret: []byte("0123456789abcdef0123456789abcdef")})
	applyTo(m, 2, directory.Register{
		ClientID: "owner", SessionID: "s1", NodeID: "n2", AdvertiseURL: owner.URL, Namespaces: []string{"/counters"},
		Headroom: 1 << 20, TTLMs: time.Hour.Milliseconds(), Now: now,
	})
	if res := applyTo(m, 3, directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "c1"}, ClientID: "owner", Now: now}); res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	dir := NewDirectory(m, nil)
	t.Cleanup(dir.Close)
	f := NewFrontDoor(FrontDoorConfig{
		Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry(),
		FastPath: true, MaxConnsPerIP: perIP,
	})
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
	rig := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) { cfg.BodyReadTimeout = 300 * time.Millisecond })
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
	rig := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) { cfg.BodyReadTimeout = bound })
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
	rig := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) {
		cfg.Health = func() map[string]any {
			return map[string]any{"term": "7", "leader": "n1", "leaderUrl": "http://10.0.0.1:8080"}
		}
		cfg.Tokens.Grant("worker-token", ScopeWorker)
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
	rig := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) { cfg.Metrics = metrics })
	if code, body, _ := rig.call(t, "GET", "/metrics", "", ""); code != http.StatusUnauthorized || !strings.Contains(body, "PINBOARD_TOKEN") {
		t.Fatalf("no token: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/metrics", "op-token", ""); code != 200 || body != "m 1\n" {
		t.Fatalf("operator: %d %s", code, body)
	}
	pub := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) { cfg.Metrics, cfg.MetricsPublic = metrics, true })
	if code, body, _ := pub.call(t, "GET", "/metrics", "", ""); code != 200 || body != "m 1\n" {
		t.Fatalf("public: %d %s", code, body)
	}
}

// The per-IP cap exempts the fleet's own nodes (members' front doors and
// workers' advertise URLs) and trusted proxies; they still count in all.
func TestFrontDoorListenerExemptsFleet(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, cfg *FrontDoorConfig) {
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
