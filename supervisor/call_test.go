//go:build linux

package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	dto "github.com/prometheus/client_model/go"
)

// relayRouter carries /<ns>/<id>/<rest> under generation 1 to the plugin
// from a kept-alive loop, as a front door's fast path does: Open IfReady,
// the request written under httpx.Hop's rule with the call's fields, End
// when the exchange ends. Whatever Open turns down goes back (and is
// counted).
type relayRouter struct {
	s       *Supervisor
	trusted bool
}

func (r relayRouter) Route(h *relay.ReqHead) (relay.Forward, bool) {
	parts := strings.SplitN(h.Target, "/", 4)
	if len(parts) < 4 {
		return relay.Forward{}, false
	}
	c, err := r.s.Open(context.Background(), "", Key{Namespace: "/" + parts[1], ID: parts[2]}, 1, IfReady)
	if err == nil && !c.OnEvict(h.Ticket.Abort) {
		c.End(0, false)
		err = errNotReady
	}
	if err != nil {
		return relay.Forward{}, false
	}
	addr := c.Socket()
	if parts[3] == "gone" {
		addr += ".gone" // a socket nothing listens on
	}
	hop := httpx.Hop{RemoteAddr: h.RemoteAddr, Host: h.Host, Trusted: r.trusted, Set: c.Fields()}
	wire, _ := hop.AppendFields(nil, h.Method, "/"+parts[3], h.Fields, h.Body)
	return relay.Forward{
		Addr: addr, Wire: wire, Refusal: plugins.HeaderRefusal, Final: true, FailMsg: RestartingMsg, Timeout: -1,
		Refused: func(status int, v string) bool { return plugins.ClassifyAnswer(status, v) == plugins.AnswerInactive },
		Head: func(_ int, stream bool) {
			if stream {
				c.Stream()
			}
		},
		Done: func(status int, err error) { // as the front door's loop ends a call
			if relay.FailedUpstream(err) {
				c.Unanswered(err)
			}
			c.End(status, errors.Is(err, relay.ErrRefused))
		},
	}, true
}

// startRelayLoop serves a listener from a kept-alive loop routed through
// s.Relay; connections it gives back are closed, and counted.
func startRelayLoop(t *testing.T, s *Supervisor, trusted bool) (addr string, handed chan struct{}) {
	t.Helper()
	handed = make(chan struct{}, 16)
	loop := relay.NewConns(nil, relayRouter{s, trusted}, func(c net.Conn) { _ = c.Close(); handed <- struct{}{} }, 5*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = loop.Adopt(c, nil)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); _ = loop.Close() })
	return ln.Addr().String(), handed
}

// rawDo sends raw on conn and reads one response.
func rawDo(t *testing.T, conn net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A relayed request reaches the plugin exactly as ServeInstance sends a
// peer's request, fields and forwarding chain included; it holds the
// instance as a served request does and lets it go after.
func TestRelayMatchesServeInstance(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	if _, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/r/pid", "", nil); err != nil {
		t.Fatal(err) // activates it under generation 1
	}
	trusted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(httpx.WithTrustedForwarding(r.Context()))
		parts := strings.SplitN(r.URL.Path, "/", 4)
		serveCall(s, w, r, "/"+parts[1], parts[2], 1, "/"+parts[3])
	}))
	defer trusted.Close()
	loopAddr, handed := startRelayLoop(t, s, true)
	direct, _ := startRelayLoop(t, s, false)

	req := "POST /misc/r/echo?q=1&b=2 HTTP/1.1\r\nHost: front.example\r\nUser-Agent: ua/1\r\nX-Custom: a\r\nX-Custom: b\r\n" +
		"X-Forwarded-For: 10.1.1.1\r\nX-Forwarded-Host: client.example\r\nX-Forwarded-Proto: https\r\nForwarded: for=1.2.3.4\r\n" +
		"X-Pinned-Attestation: v1.x\r\nX-Pinned-Id: spoofed\r\nTe: trailers\r\nConnection: keep-alive\r\nContent-Length: 7\r\n\r\npayload"
	seen := map[string]string{}
	for name, addr := range map[string]string{
		"ServeInstance": strings.TrimPrefix(trusted.URL, "http://"), "Relay": loopAddr,
		"direct ServeInstance": strings.TrimPrefix(srv.URL, "http://"), "direct Relay": direct,
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for i := range 2 { // the second on the same connection: pooled on both sides
			resp, body := rawDo(t, conn, br, req)
			if resp.StatusCode != 200 {
				t.Fatalf("%s request %d: %d %s", name, i, resp.StatusCode, body)
			}
			if i == 0 {
				seen[name] = body
			} else if body != seen[name] {
				t.Fatalf("%s: a second request saw %s, the first %s", name, body, seen[name])
			}
		}
	}
	if seen["Relay"] != seen["ServeInstance"] {
		t.Fatalf("the plugin saw a relayed request differently:\nRelay:         %s\nServeInstance: %s", seen["Relay"], seen["ServeInstance"])
	}
	if seen["direct Relay"] != seen["direct ServeInstance"] {
		t.Fatalf("the plugin saw a client's relayed request differently:\nRelay:         %s\nServeInstance: %s", seen["direct Relay"], seen["direct ServeInstance"])
	}
	if !strings.Contains(seen["direct Relay"], `"X-Forwarded-For":["127.0.0.1"]`) || strings.Contains(seen["direct Relay"], "client.example") {
		t.Errorf("a client's own forwarding fields reached the instance: %s", seen["direct Relay"])
	}
	for _, want := range []string{`"X-Forwarded-For":["10.1.1.1, 127.0.0.1"]`, `"X-Forwarded-Proto":["https"]`, `"body":"payload"`, `"query":"q=1\u0026b=2"`, `"Te":["trailers"]`} {
		if !strings.Contains(seen["Relay"], want) {
			t.Errorf("relayed request lacks %s: %s", want, seen["Relay"])
		}
	}
	if strings.Contains(seen["Relay"], "spoofed") || strings.Contains(seen["Relay"], "Attestation") || strings.Contains(seen["Relay"], "1.2.3.4") {
		t.Errorf("relayed request carries fields it must not: %s", seen["Relay"])
	}
	select {
	case <-handed:
		t.Fatal("the loop gave a relayable request back")
	default:
	}

	// Not live under that generation, or not at all: Open IfReady turns
	// it down and holds nothing.
	if _, err := s.Open(context.Background(), "", Key{Namespace: "/misc", ID: "r"}, 2, IfReady); err == nil {
		t.Fatal("Open IfReady under another generation")
	}
	if _, err := s.Open(context.Background(), "", Key{Namespace: "/misc", ID: "never"}, 1, IfReady); err == nil {
		t.Fatal("Open IfReady for an instance not live")
	}
	testutil.WaitFor(t, 5*time.Second, "relayed requests to let the instance go", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		in := s.instances[Key{Namespace: "/misc", ID: "r"}]
		return in != nil && in.conns == 0 && in.streams == 0 && in.idle != nil
	})
}

// A relayed stream counts as one, and ends when its instance is evicted;
// a plugin that no longer holds the instance refuses, and the instance is
// dropped here too.
func TestRelayedStreamsAndRefusal(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	for _, id := range []string{"e", "gone"} {
		if _, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/"+id+"/pid", "", nil); err != nil {
			t.Fatal(err)
		}
	}
	loopAddr, _ := startRelayLoop(t, s, true)
	conn, err := net.Dial("tcp", loopAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /misc/e/sse HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the relayed stream to count as one", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.instances[Key{Namespace: "/misc", ID: "e"}].streams == 1
	})
	if !s.Evict(context.Background(), Key{Namespace: "/misc", ID: "e"}, time.Second) {
		t.Fatal("instance not live")
	}
	if b, err := io.ReadAll(resp.Body); err != nil || !strings.Contains(string(b), "fin") {
		t.Fatalf("relayed stream after eviction: %q %v", b, err)
	}

	// A request that ignores the eviction is cut once its grace is over.
	if _, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/e/pid", "", nil); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "GET /misc/e/sleep?ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
	testutil.WaitFor(t, 5*time.Second, "the request to be under way", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.instances[Key{Namespace: "/misc", ID: "e"}].conns == 1
	})
	go s.Evict(context.Background(), Key{Namespace: "/misc", ID: "e"}, 0)
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("a request cut by eviction got a response: %d", resp.StatusCode)
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("a relayed request outlived its instance's eviction")
	}

	// The plugin forgets "gone" behind the supervisor's back.
	inc, err := s.plugins().byRoute[Route{Namespace: "/misc"}].current()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inc.conn.Control.Deactivate(context.Background(), &proto.DeactivateRequest{Namespace: "/misc", Id: "gone"}); err != nil {
		t.Fatal(err)
	}
	conn2, err := net.Dial("tcp", loopAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	resp, body := rawDo(t, conn2, bufio.NewReader(conn2), "GET /misc/gone/pid HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Pinned-Refusal") != "" ||
		body != fmt.Sprintf(`{"error":%q}`+"\n", RestartingMsg) {
		t.Fatalf("refused by the plugin: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	// Done runs once the answer is out: the client may be first.
	testutil.WaitFor(t, 5*time.Second, "an instance the plugin refused to be dropped here", func() bool { return !s.Live("/misc", "gone") })
	// Counted once the eviction has ended (Live turns false as it begins).
	testutil.WaitFor(t, 5*time.Second, "the drop booked as an eviction (reason inactive)", func() bool {
		return evictions(t, s, "/misc", "inactive") == 1
	})
}

// An answer the relay loop gives on its own (the plugin's socket cannot be
// reached) is booked as net/http's path books one: counted in
// pinned_plugin_unanswered_total{outcome="unreachable"} and logged, one
// line per plugin and outcome per window, not one a request.
func TestRelayedUnansweredIsCountedAndLogged(t *testing.T) {
	logs, logger := newLogBuffer()
	s, srv := serveSupervisor(t, Config{Specs: []Spec{{Name: "p", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}}, Logger: logger})
	if _, err := testutil.Do(context.Background(), "GET", srv.URL+"/misc/u/pid", "", nil); err != nil {
		t.Fatal(err) // activates it under generation 1
	}
	unreachable := func() float64 {
		var m dto.Metric
		if err := s.metrics.unanswered.WithLabelValues("p", httpx.OutcomeUnreachable).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	if n := unreachable(); n != 0 {
		t.Fatalf("unanswered before any failure: %v", n)
	}
	loopAddr, _ := startRelayLoop(t, s, false)
	conn, err := net.Dial("tcp", loopAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 3 {
		resp, body := rawDo(t, conn, br, "GET /misc/u/gone HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode != 503 || !strings.Contains(body, RestartingMsg) {
			t.Fatalf("request %d to a socket nothing listens on: %d %s", i, resp.StatusCode, body)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "3 unreachable in the metric", func() bool { return unreachable() == 3 })
	if n := strings.Count(logs.String(), `"msg":"plugin did not answer"`); n != 1 {
		t.Fatalf("%d 'plugin did not answer' lines for 3 failures within a window, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `"outcome":"unreachable"`) || !strings.Contains(logs.String(), ".gone") {
		t.Fatalf("the line does not say what failed:\n%s", logs.String())
	}
	// The instance still serves over the loop.
	if resp, body := rawDo(t, conn, br, "GET /misc/u/pid HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("after the failures: %d %s", resp.StatusCode, body)
	}
}
