package frontdoor

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testdir"

	"github.com/pinnedd/pinnedd/internal/testsup"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// The loop's router forwards only a plain request for an id placed on a
// live worker elsewhere that it can reach by address; everything else is
// net/http's.
func TestKeptAliveRoute(t *testing.T) {
	rig := newForwardRig(t)
	m := rig.dir.Machine()
	now := time.Now().UnixMilli()
	testdir.Apply(m, 10, directory.Register{
		ClientID: "named", SessionID: "s2", NodeID: "n3", AdvertiseURL: "http://owner.internal:8080", Namespaces: []string{"/counters"},
		Headroom: 1, TTLMs: time.Hour.Milliseconds(), Now: now,
	})
	if res := testdir.Apply(m, 11, directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "named1"}, ClientID: "named", Now: now}); res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	head := func(target string, fields ...relay.Field) *relay.ReqHead {
		return &relay.ReqHead{Method: "GET", Target: target, Host: "front", Fields: fields, RemoteAddr: "10.1.2.3:5555"}
	}
	fwd, ok := rig.f.routeLoop(head("/counters/c1/value?x=1", relay.Field{Name: "x-keep", Value: "1"}, relay.Field{Name: "keep-alive", Value: "5"}))
	if !ok || fwd.Addr != strings.TrimPrefix(rig.owner.URL, "http://") {
		t.Fatalf("placed id: ok %v addr %q", ok, fwd.Addr)
	}
	wire := string(fwd.Wire)
	for _, want := range []string{"GET /_pinned/i/counters/c1/value?x=1 HTTP/1.1\r\n", "\r\nx-keep: 1\r\n", "\r\nX-Forwarded-For: 10.1.2.3\r\n", "\r\n" + pinboard.AttestationHeader + ": v1."} {
		if !strings.Contains(wire, want) {
			t.Errorf("wire lacks %q:\n%s", want, wire)
		}
	}
	if strings.Contains(strings.ToLower(wire), "keep-alive:") {
		t.Errorf("wire passes a hop-by-hop field:\n%s", wire)
	}
	for name, h := range map[string]*relay.ReqHead{
		"not placed":      head("/counters/nobody/value"),
		"escaped path":    head("/counters/c%31/value"),
		"odd query":       head("/counters/c1/value?a;b"),
		"bad id":          head("/counters/.c1/value"),
		"own route":       head("/registry/workers"),
		"reserved":        head("/_pinned/status"),
		"cluster call":    head("/counters/c1/value", relay.Field{Name: plugins.HeaderClusterCall, Value: "t"}),
		"owner by name":   head("/counters/named1/value"),
		"unknown ns path": head("/"),
	} {
		if _, ok := rig.f.routeLoop(h); ok {
			t.Errorf("%s: routed by the loop, want net/http", name)
		}
	}
	rig.f.SetStopping()
	if _, ok := rig.f.routeLoop(head("/counters/c1/value")); ok {
		t.Error("a stopping front door's loop still routes")
	}
}

// In hostname-aware mode the loop routes by Host too: a request for an id
// placed through its hostname is forwarded to the owner-side path that
// names the env; one without a Host, for a hostname nothing is bound to,
// or for the id of another hostname's env is net/http's.
func TestKeptAliveRouteByHost(t *testing.T) {
	rig := newHostnameForwardRig(t)
	head := func(host string) *relay.ReqHead {
		return &relay.ReqHead{Method: "GET", Target: "/counters/c1/value", Host: host, RemoteAddr: "10.1.2.3:5555"}
	}
	fwd, ok := rig.f.routeLoop(head(strings.ToUpper(benchHost) + ":8080"))
	if !ok {
		t.Fatal("an id placed through its hostname: not routed by the loop")
	}
	if wire := string(fwd.Wire); !strings.HasPrefix(wire, "GET /_pinned/i/~"+benchHost+"/counters/c1/value HTTP/1.1\r\n") {
		t.Errorf("wire does not name the env:\n%s", wire)
	}
	fwd.Done(200, nil)
	for _, host := range []string{"", "nobody.preview.test", "h1.preview.test"} {
		if _, ok := rig.f.routeLoop(head(host)); ok {
			t.Errorf("Host %q: routed by the loop, want net/http", host)
		}
	}
}

// BenchmarkKeptAliveRoute: the loop's per-request routing (lookup,
// attestation, the forwarded request's bytes), and the exchange's end.
// In single mode, and in hostname-aware mode with 200 hostnames bound.
func BenchmarkKeptAliveRoute(b *testing.B) {
	for _, c := range []struct {
		name, host string
		rig        func(testing.TB) *forwardRig
	}{
		{"single", "front", newForwardRig},
		{fmt.Sprintf("hostnames=%d", benchHostnames), benchHost + ":8080", newHostnameForwardRig},
	} {
		b.Run(c.name, func(b *testing.B) {
			rig := c.rig(b)
			h := &relay.ReqHead{Method: "GET", Target: "/counters/c1/value", Host: c.host, RemoteAddr: "10.1.2.3:5555",
				Fields: []relay.Field{{Name: "User-Agent", Value: "bench"}, {Name: "Accept", Value: "*/*"}}}
			routeEach(b, rig.f, h, func() {})
		})
	}
}

// routeEach routes h as the loop does, once per iteration after prepare,
// and ends each exchange as the loop does (the wire buffer goes back).
func routeEach(b *testing.B, f *FrontDoor, h *relay.ReqHead, prepare func()) {
	b.ReportAllocs()
	for b.Loop() {
		prepare()
		fwd, ok := f.routeLoop(h)
		if !ok {
			b.Fatal("not routed")
		}
		fwd.Done(200, nil)
	}
}

// newOwnerRig is a front door on an owner node ("owner", lease good for
// an hour) with /misc/x1 live under generation 7 and /misc/loc under 5,
// on a real supervisor.
func newOwnerRig(t testing.TB) (*FrontDoor, *pinboard.Worker, *supervisor.Supervisor, []byte) {
	t.Helper()
	secret := []byte("0123456789abcdef0123456789abcdef")
	m := directory.New()
	testdir.Apply(m, 1, directory.Init{Secret: secret})
	dir := pinboard.NewDirectory(m, nil)
	t.Cleanup(dir.Close)
	w := pinboard.NewWorker(pinboard.WorkerConfig{NodeID: "n1", AdvertiseURL: "http://127.0.0.1:1"}, nil)
	w.SetRegisteredForTesting("owner", "", time.Now().Add(time.Hour))
	local := testsup.Start(t)
	for id, gen := range map[string]uint64{"x1": 7, "loc": 5} {
		if err := local.Wake(t.Context(), "", supervisor.Key{Namespace: "/misc", ID: id}, gen); err != nil {
			t.Fatal(err)
		}
	}
	f := New(Config{Dir: dir, Self: pinboard.NewSelf(dir, w), Local: local})
	t.Cleanup(func() { _ = f.Close() })
	return f, w, local, secret
}

// BenchmarkKeptAliveRouteOwned: the owner loop's routing of a peer's
// attested request (owned: the attestation checked and spent; each
// iteration also signs one, see BenchmarkSign) and of a client's request
// for an id live here (local), through to the wire for the plugin and the
// exchange's end.
func BenchmarkKeptAliveRouteOwned(b *testing.B) {
	f, _, _, secret := newOwnerRig(b)
	fields := []relay.Field{{Name: "User-Agent", Value: "bench"}, {Name: "Accept", Value: "*/*"},
		{Name: "X-Forwarded-For", Value: "10.0.0.9"}, {Name: "X-Forwarded-Host", Value: "front"}, {Name: "X-Forwarded-Proto", Value: "http"}}
	const target = "/_pinned/i/misc/x1/value"
	b.Run("owned", func(b *testing.B) {
		h := &relay.ReqHead{Method: "GET", Target: target, Host: "front", RemoteAddr: "10.0.0.2:4000",
			Fields: append(slices.Clone(fields), relay.Field{Name: pinboard.AttestationHeader})}
		att := &h.Fields[len(h.Fields)-1].Value
		routeEach(b, f, h, func() {
			*att = pinboard.Sign(secret, pinboard.Attestation{Target: "owner", Caller: "peer", Generation: 7, At: time.Now()}, "GET", target)
		})
	})
	b.Run("local", func(b *testing.B) {
		h := &relay.ReqHead{Method: "GET", Target: "/misc/loc/value", Host: "front", RemoteAddr: "10.0.0.2:4000", Fields: fields[:2]}
		routeEach(b, f, h, func() {})
	})
}

// held is the connections instance (ns, id) counts now.
func held(t *testing.T, s *supervisor.Supervisor, ns, id string) int {
	t.Helper()
	_, insts := s.Stats(t.Context())
	for _, in := range insts {
		if in.Namespace == ns && in.ID == id {
			return in.Connections
		}
	}
	t.Fatalf("%s/%s not live", ns, id)
	return 0
}

// On the owner, the loop relays a peer's attested request to a live
// instance only: the attestation must verify, and is spent only when the
// loop serves the request itself, so net/http decides everything else with
// it as it stands. The instances are a real supervisor's.
func TestKeptAliveRouteOwned(t *testing.T) {
	f, w, local, secret := newOwnerRig(t)

	const path = "/_pinned/i/misc/x1/echo"
	head := func(att string, extra ...relay.Field) *relay.ReqHead {
		fields := append([]relay.Field{{Name: "X-Forwarded-For", Value: "10.0.0.9"}}, extra...)
		if att != "" {
			fields = append(fields, relay.Field{Name: pinboard.AttestationHeader, Value: att})
		}
		return &relay.ReqHead{Method: "POST", Target: path + "?a=1", Host: "h", Fields: fields, RemoteAddr: "10.0.0.2:4000"}
	}
	sign := func(target string, gen uint64) string {
		return pinboard.Sign(secret, pinboard.Attestation{Target: target, Caller: "peer", Generation: gen, At: time.Now()}, "POST", path+"?a=1")
	}
	wireHas := func(fwd relay.Forward, want ...string) {
		t.Helper()
		for _, s := range want {
			if !strings.Contains(string(fwd.Wire), s) {
				t.Errorf("the request for the plugin lacks %q:\n%s", s, fwd.Wire)
			}
		}
	}

	// On a cluster-port connection whose certificate's CA was retired the
	// loop carries nothing: net/http answers, then closes the connection.
	onRetired := head(sign("owner", 7))
	onRetired.Conn = wrapped{peerConnStub{retired: true}}
	if _, ok := f.routeLoop(onRetired); ok {
		t.Fatal("the loop carried a request on a retired connection")
	}

	good := sign("owner", 7)
	fwd, ok := f.routeLoop(head(good))
	if !ok || !strings.HasPrefix(fwd.Addr, "/") {
		t.Fatalf("a valid attestation for a live instance: ok %v, to %q", ok, fwd.Addr)
	}
	// For x1 under generation 7, trusted: the peer's chain goes on.
	wireHas(fwd, "POST /echo?a=1 HTTP/1.1\r\n", "\r\nX-Pinned-Id: x1\r\n", "\r\nX-Forwarded-For: 10.0.0.9, 10.0.0.2\r\n")
	if n := held(t, local, "/misc", "x1"); n != 1 {
		t.Fatalf("a relayed request holds the instance %d times, want 1", n)
	}
	fwd.Done(200, nil)
	// Spent: the same attestation again is net/http's to refuse, and the
	// instance it held is let go.
	if _, ok := f.routeLoop(head(good)); ok {
		t.Fatal("a replayed attestation was relayed")
	}
	if n := held(t, local, "/misc", "x1"); n != 0 {
		t.Fatalf("after a replay the instance is still held %d times", n)
	}
	for name, h := range map[string]*relay.ReqHead{
		"missing":        head(""),
		"for another":    head(sign("other", 7)),
		"forged":         head(good[:len(good)-4] + "AAAA"),
		"two of them":    head(sign("owner", 7), relay.Field{Name: pinboard.AttestationHeader, Value: sign("owner", 7)}),
		"bad instance":   {Method: "POST", Target: "/_pinned/i/misc/.x/echo", Host: "h"},
		"bad namespace":  {Method: "POST", Target: "/_pinned/i/Mi$c/x/echo", Host: "h"},
		"other pinned":   {Method: "POST", Target: "/_pinned/status", Host: "h"},
		"escaped target": {Method: "POST", Target: "/_pinned/i/misc/x%31/echo", Host: "h"},
	} {
		if _, ok := f.routeLoop(h); ok {
			t.Errorf("%s: relayed, want net/http", name)
		}
		if n := held(t, local, "/misc", "x1"); n != 0 {
			t.Errorf("%s: left the instance held %d times", name, n)
		}
	}

	// Not live under the attested generation: net/http re-places it, with
	// the attestation still good.
	fresh := sign("owner", 8)
	if _, ok := f.routeLoop(head(fresh)); ok {
		t.Fatal("relayed to an instance not live under that generation")
	}
	now := time.Now()
	att, err := f.owner.gate.Check(fresh, "POST", path+"?a=1", now)
	if err == nil {
		err = f.owner.gate.Spend(att, now)
	}
	if err != nil {
		t.Fatalf("the loop spent an attestation it left to net/http: %v", err)
	}
	// A client's request for an id live here goes to it too, under the
	// generation it runs, its forwarding fields not trusted.
	fwd, ok = f.routeLoop(&relay.ReqHead{Method: "GET", Target: "/misc/loc/x?y", Host: "h", RemoteAddr: "10.0.0.3:5000",
		Fields: []relay.Field{{Name: "X-Forwarded-For", Value: "9.9.9.9"}}})
	if !ok {
		t.Fatal("a request for an id live here went to net/http")
	}
	wireHas(fwd, "GET /x?y HTTP/1.1\r\n", "\r\nX-Pinned-Id: loc\r\n", "\r\nX-Forwarded-For: 10.0.0.3\r\n")
	if strings.Contains(string(fwd.Wire), "9.9.9.9") {
		t.Errorf("a client's own X-Forwarded-For reached the plugin:\n%s", fwd.Wire)
	}
	fwd.Done(200, nil)
	w.SetRegisteredForTesting("", "", time.Now().Add(-time.Second))
	if _, ok := f.routeLoop(head(sign("owner", 7))); ok {
		t.Fatal("relayed with the lease expired")
	}
	if _, ok := f.routeLoop(&relay.ReqHead{Method: "GET", Target: "/misc/loc/x", Host: "h"}); ok {
		t.Fatal("relayed to a local instance with the lease expired")
	}
}

// peerConnStub is a cluster-port connection as raftstore wraps it: it
// names its node.
type peerConnStub struct {
	net.Conn
	retired bool
}

func (peerConnStub) PeerNode() string { return "n2" }
func (p peerConnStub) Retired() bool  { return p.retired }

// wrapped is a wrapper that says what it wraps, as relay's given-back
// connections do.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

// A connection the loop gives back goes to the server it came from: a
// peer's (found through wrappers) to the cluster port's listener, a
// client's to the front door's.
func TestKeptAliveGivesBackWhereItCameFrom(t *testing.T) {
	k := newKeptAlive(nil, true, false, slog.New(slog.NewTextHandler(io.Discard, nil)), relay.ClientLimits{})
	defer k.close()
	peers := k.peerHandBacks()
	client, _ := net.Pipe()
	peer, _ := net.Pipe()
	for _, c := range []struct {
		conn net.Conn
		to   net.Listener
	}{
		{wrapped{peerConnStub{Conn: peer}}, peers},
		{wrapped{client}, k.handBack},
	} {
		go k.giveBack(c.conn)
		got, err := c.to.Accept()
		if err != nil || got != c.conn {
			t.Fatalf("given back %v to the wrong listener (got %v, %v)", c.conn, got, err)
		}
	}
	if peerNode(wrapped{wrapped{peerConnStub{Conn: peer}}}) != "n2" || peerNode(client) != "" {
		t.Fatal("peerNode does not see through wrappers, or sees a node in a client's connection")
	}
}
