//go:build linux

package frontdoor

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/pinnedd/pinnedd/passport"
)

// After one forwarded request through net/http the connection is served
// by the kept-alive loop, and the owner sees the same request from it as
// from net/http: the client's fields without hop-by-hop and forwarding
// ones, fresh X-Forwarded-*, a valid attestation, the body.
func TestKeptAliveSendsWhatNetHTTPSends(t *testing.T) {
	rig := newForwardRigWith(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var got []string
		for _, k := range []string{"X-Keep", "Keep-Alive", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Te", "Content-Length"} {
			got = append(got, k+"="+strings.Join(r.Header[k], ","))
		}
		fmt.Fprintf(w, "%s %s %q %s", r.Method, r.URL.RequestURI(), body, strings.Join(got, " "))
	})
	rig.f.serveHandBacks(rig.entry.Config)

	conn, br := rig.dial(t)
	var first string
	for i := range 4 {
		fmt.Fprint(conn, "POST /counters/c1/add?n=1 HTTP/1.1\r\nHost: front.example\r\nX-Keep: yes\r\nKeep-Alive: timeout=5\r\n"+
			"X-Forwarded-For: 10.9.9.9\r\nTe: trailers\r\nContent-Length: 5\r\n\r\nhello")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if i == 0 {
			first = string(body)
			want := `POST /_pinned/i/counters/c1/add?n=1 "hello" X-Keep=yes Keep-Alive= X-Forwarded-For=127.0.0.1 X-Forwarded-Proto=http X-Forwarded-Host=front.example Te=trailers Content-Length=5`
			if first != want {
				t.Fatalf("through net/http:\n got %s\nwant %s", first, want)
			}
		} else if string(body) != first {
			t.Fatalf("request %d through the loop:\n got %s\nwant %s", i, body, first)
		}
	}
	if got := rig.f.keep.conns.Served(); got != 3 {
		t.Fatalf("the loop forwarded %d requests, want 3 (all but the first)", got)
	}
}

// A namespace that needs the client's key keeps its connections in
// net/http, which checks every request's key: the loop would give each one
// back.
func TestKeyedNamespaceStaysInNetHTTP(t *testing.T) {
	const key = "client-key-0123456789abcdef0123456789"
	doc := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
	 {"name":"client","token":{"env":"K"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/counters"]}}}]}],
	 "namespaces":{"/counters":{"allow":"authenticated"},"*":{"allow":"anonymous"}}}`
	p, err := passport.Parse([]byte(doc), func(string) (string, bool) { return key, true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	rig := newForwardRigConfig(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") },
		func(c *nodeConfig) { c.Tokens = pinboard.NewPassportTokens(p); c.FastPath = true })
	rig.f.serveHandBacks(rig.entry.Config)
	conn, br := rig.dial(t)
	for i := range 4 {
		fmt.Fprint(conn, "GET /counters/c1/value HTTP/1.1\r\nHost: front.example\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n, served := rig.f.keep.conns.Len(), rig.f.keep.conns.HandedBack(); n != 0 || served != 0 {
		t.Fatalf("the loop holds %d connections and gave %d back: a keyed connection was adopted", n, served)
	}
}
