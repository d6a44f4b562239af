package pinboard

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// The loop's router forwards only a plain request for an id placed on a
// live worker elsewhere that it can reach by address; everything else is
// net/http's.
func TestKeptAliveRoute(t *testing.T) {
	rig := newForwardRig(t)
	m := rig.f.cfg.Dir.Machine()
	now := time.Now().UnixMilli()
	m.ApplyCommand(10, directory.Register{
		ClientID: "named", SessionID: "s2", NodeID: "n3", AdvertiseURL: "http://owner.internal:8080", Namespaces: []string{"/counters"},
		Headroom: 1, TTLMs: time.Hour.Milliseconds(), Now: now,
	})
	if res := m.ApplyCommand(11, directory.Claim{Key: directory.Key{Namespace: "/counters", ID: "named1"}, ClientID: "named", Now: now}); res.Code != directory.CodeGranted {
		t.Fatalf("claim: %v %s", res.Code, res.Reason)
	}
	head := func(target string, fields ...relay.Field) *relay.ReqHead {
		return &relay.ReqHead{Method: "GET", Target: target, Host: "front", Fields: fields, RemoteAddr: "10.1.2.3:5555"}
	}
	fwd, ok := rig.f.Route(head("/counters/c1/value?x=1", relay.Field{Name: "x-keep", Value: "1"}, relay.Field{Name: "keep-alive", Value: "5"}))
	if !ok || fwd.Addr != strings.TrimPrefix(rig.owner.URL, "http://") {
		t.Fatalf("placed id: ok %v addr %q", ok, fwd.Addr)
	}
	wire := string(fwd.Wire)
	for _, want := range []string{"GET /_pinned/i/counters/c1/value?x=1 HTTP/1.1\r\n", "\r\nx-keep: 1\r\n", "\r\nX-Forwarded-For: 10.1.2.3\r\n", "\r\n" + AttestationHeader + ": v1."} {
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
		if _, ok := rig.f.Route(h); ok {
			t.Errorf("%s: routed by the loop, want net/http", name)
		}
	}
	rig.f.SetStopping()
	if _, ok := rig.f.Route(head("/counters/c1/value")); ok {
		t.Error("a stopping front door's loop still routes")
	}
}

// BenchmarkKeptAliveRoute: the loop's per-request routing (lookup,
// attestation, the forwarded request's bytes).
func BenchmarkKeptAliveRoute(b *testing.B) {
	rig := newForwardRig(b)
	h := &relay.ReqHead{Method: "GET", Target: "/counters/c1/value", Host: "front", RemoteAddr: "10.1.2.3:5555",
		Fields: []relay.Field{{Name: "User-Agent", Value: "bench"}, {Name: "Accept", Value: "*/*"}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := rig.f.Route(h); !ok {
			b.Fatal("not routed")
		}
	}
}

// ownedLocal is the owner's instance runtime as routeOwned sees it: it
// records Relay calls and the Done of each Forward it hands out.
type ownedLocal struct {
	Instances
	live   bool
	relays []string
	dones  int
}

// LiveGeneration: "loc" runs here under generation 5.
func (l *ownedLocal) LiveGeneration(ns, id string) (uint64, bool) { return 5, id == "loc" }

func (l *ownedLocal) Relay(ns, id string, gen uint64, h *relay.ReqHead, target string, trusted bool) (relay.Forward, bool) {
	l.relays = append(l.relays, fmt.Sprintf("%s %s %d %s %v", ns, id, gen, target, trusted))
	if !l.live {
		return relay.Forward{}, false
	}
	return relay.Forward{Addr: "/plugin.sock", Final: true, Done: func(int, error) { l.dones++ }}, true
}

// On the owner, the loop relays a peer's attested request to a live
// instance only: the attestation must verify, and is spent only when the
// loop serves the request itself, so net/http decides everything else with
// it as it stands.
func TestKeptAliveRouteOwned(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	m := directory.New()
	m.ApplyCommand(1, directory.Init{Secret: secret})
	dir := NewDirectory(m, nil)
	t.Cleanup(dir.Close)
	w := NewWorker(WorkerConfig{NodeID: "n1", AdvertiseURL: "http://127.0.0.1:1"}, nil)
	w.clientID, w.expiresAt = "owner", time.Now().Add(time.Hour)
	local := &ownedLocal{live: true}
	f := NewFrontDoor(FrontDoorConfig{Dir: dir, Worker: w, Local: local})
	t.Cleanup(func() { _ = f.Close() })

	const path = "/_pinned/i/misc/x1/echo"
	head := func(att string, extra ...relay.Field) *relay.ReqHead {
		fields := append([]relay.Field{{Name: "X-Forwarded-For", Value: "10.0.0.9"}}, extra...)
		if att != "" {
			fields = append(fields, relay.Field{Name: AttestationHeader, Value: att})
		}
		return &relay.ReqHead{Method: "POST", Target: path + "?a=1", Host: "h", Fields: fields, RemoteAddr: "10.0.0.2:4000"}
	}
	sign := func(target string, gen uint64) string {
		return Sign(secret, Attestation{Target: target, Caller: "peer", Generation: gen, At: time.Now()}, "POST", path+"?a=1")
	}

	good := sign("owner", 7)
	if fwd, ok := f.Route(head(good)); !ok || fwd.Addr != "/plugin.sock" {
		t.Fatalf("a valid attestation for a live instance: ok %v %+v", ok, fwd)
	}
	if want := "/misc x1 7 /echo?a=1 true"; len(local.relays) != 1 || local.relays[0] != want {
		t.Fatalf("Relay calls %q, want [%q]", local.relays, want)
	}
	// Spent: the same attestation again is net/http's to refuse, and the
	// instance it held is let go.
	if _, ok := f.Route(head(good)); ok {
		t.Fatal("a replayed attestation was relayed")
	}
	if local.dones != 1 {
		t.Fatalf("a replay's hold was released %d times, want 1", local.dones)
	}
	for name, h := range map[string]*relay.ReqHead{
		"missing":        head(""),
		"for another":    head(sign("other", 7)),
		"forged":         head(good[:len(good)-4] + "AAAA"),
		"two of them":    head(sign("owner", 7), relay.Field{Name: AttestationHeader, Value: sign("owner", 7)}),
		"bad instance":   {Method: "POST", Target: "/_pinned/i/misc/.x/echo", Host: "h"},
		"bad namespace":  {Method: "POST", Target: "/_pinned/i/Mi$c/x/echo", Host: "h"},
		"other pinned":   {Method: "POST", Target: "/_pinned/status", Host: "h"},
		"escaped target": {Method: "POST", Target: "/_pinned/i/misc/x%31/echo", Host: "h"},
	} {
		before := len(local.relays)
		if _, ok := f.Route(h); ok {
			t.Errorf("%s: relayed, want net/http", name)
		}
		if len(local.relays) != before {
			t.Errorf("%s: Relay was asked", name)
		}
	}

	// Not live here (or not under that generation): net/http activates it,
	// with the attestation still good.
	local.live = false
	fresh := sign("owner", 8)
	if _, ok := f.Route(head(fresh)); ok {
		t.Fatal("relayed to an instance that is not live")
	}
	if _, err := f.verifier.Verify(secret, fresh, "owner", "POST", path+"?a=1", time.Now()); err != nil {
		t.Fatalf("the loop spent an attestation it left to net/http: %v", err)
	}
	local.live = true
	// A client's request for an id live here goes to it too, under the
	// generation it runs, its forwarding fields not trusted.
	if _, ok := f.Route(&relay.ReqHead{Method: "GET", Target: "/misc/loc/x?y", Host: "h"}); !ok {
		t.Fatal("a request for an id live here went to net/http")
	}
	if got, want := local.relays[len(local.relays)-1], "/misc loc 5 /x?y false"; got != want {
		t.Fatalf("Relay call %q, want %q", got, want)
	}
	w.mu.Lock()
	w.expiresAt = time.Now().Add(-time.Second)
	w.mu.Unlock()
	if _, ok := f.Route(head(sign("owner", 7))); ok {
		t.Fatal("relayed with the lease expired")
	}
	if _, ok := f.Route(&relay.ReqHead{Method: "GET", Target: "/misc/loc/x", Host: "h"}); ok {
		t.Fatal("relayed to a local instance with the lease expired")
	}
}
