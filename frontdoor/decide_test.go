package frontdoor

import (
	"crypto/tls"
	"net/http"
	"testing"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/passport"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/plugins"
)

// The one routing decision: what each request is, and which of them the
// kept-alive loop may carry, for net/http's fields and the loop's alike.
func TestDecide(t *testing.T) {
	doc := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
	 {"name":"client","token":{"env":"K"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/keyed"]}}}]}],
	 "namespaces":{"/keyed":{"allow":"authenticated"},"*":{"allow":"anonymous"}}}`
	p, err := passport.Parse([]byte(doc), func(string) (string, bool) { return "client-key-0123456789abcdef0123456789", true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain := New(Config{Tokens: pinboard.NewPassportTokens(p)})
	secure := New(Config{Tokens: pinboard.NewPassportTokens(p), PeerTLS: &tls.Config{},
		PeerAddr: func(string) (string, bool) { return "", true }})
	t.Cleanup(func() { _ = plain.Close(); _ = secure.Close() })
	call := []relay.Field{{Name: plugins.HeaderClusterCall, Value: "x"}}
	for _, tc := range []struct {
		name                 string
		f                    *FrontDoor
		method, path, escape string
		query                string
		fields               []relay.Field
		from                 origin
		kind                 routeKind
		loop, bad            bool
	}{
		{name: "instance", f: plain, method: "GET", path: "/counters/a/x", kind: toInstance, loop: true},
		{name: "instance, escaped id", f: plain, method: "GET", path: "/counters/a:b/x", escape: "/counters/a%3Ab/x", kind: toInstance},
		{name: "instance, odd query", f: plain, method: "GET", path: "/counters/a/x", query: "a=%zz", kind: toInstance},
		{name: "instance, keyed namespace", f: plain, method: "GET", path: "/keyed/a/x", kind: toInstance},
		{name: "instance, cluster call", f: plain, method: "GET", path: "/counters/a/x", fields: call, kind: toInstance},
		{name: "instance, bad namespace", f: plain, method: "GET", path: "/Counters/a", kind: toInstance, bad: true},
		{name: "owner route", f: plain, method: "GET", path: "/_pinned/i/counters/a/x", kind: toOwner, loop: true},
		{name: "owner route, client over mTLS", f: secure, method: "GET", path: "/_pinned/i/counters/a/x", kind: toPeerOnly},
		{name: "owner route, member over mTLS", f: secure, method: "GET", path: "/_pinned/i/counters/a/x", from: fromMember, kind: toOwner, loop: true},
		{name: "owner route, former member", f: secure, method: "GET", path: "/_pinned/i/counters/a/x", from: fromStranger, kind: toOwner},
		{name: "wake", f: plain, method: "POST", path: "/_pinned/wake/counters/a", kind: toWake},
		{name: "wake, client over mTLS", f: secure, method: "POST", path: "/_pinned/wake/counters/a", kind: toPeerOnly},
		{name: "stats, client over mTLS", f: secure, method: "GET", path: pinboard.StatsPath, kind: toPeerOnly},
		{name: "stats, plain", f: plain, method: "GET", path: pinboard.StatsPath, kind: toMux},
		{name: "api route", f: plain, method: "GET", path: "/readyz", kind: toMux},
	} {
		escaped := tc.path
		if tc.escape != "" {
			escaped = tc.escape
		}
		for _, entry := range []struct {
			name string
			hdr  fields
		}{{"loop", loopFields(tc.fields)}, {"net/http", stdFields(headerOf(tc.fields))}} {
			d := tc.f.decide(tc.method, tc.path, escaped, tc.query, entry.hdr, tc.from)
			if d.kind != tc.kind || d.loop != tc.loop || (d.err != nil) != tc.bad {
				t.Errorf("%s (%s): kind %d loop %v err %v, want kind %d loop %v bad %v", tc.name, entry.name, d.kind, d.loop, d.err, tc.kind, tc.loop, tc.bad)
			}
		}
	}
}

func headerOf(fs []relay.Field) http.Header {
	h := http.Header{}
	for _, f := range fs {
		h.Add(f.Name, f.Value)
	}
	return h
}
