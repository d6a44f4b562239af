package pinboard

import (
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
