package frontdoor

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The forward's own request writer sends what ReverseProxy would: the
// client's fields without hop-by-hop ones (also those Connection names),
// fresh X-Forwarded-*, the body (Expect answered here, not passed on);
// the owner's response comes back without its hop-by-hop fields, with its
// trailers, and the connections stay alive.
func TestForwardWire(t *testing.T) {
	rig := newForwardRigWith(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var got []string
		for _, k := range []string{"X-Keep", "X-Drop", "Keep-Alive", "Expect", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Te", "User-Agent"} {
			got = append(got, k+"="+strings.Join(r.Header[k], ","))
		}
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("Trailer", "X-Sum")
		fmt.Fprintf(w, "%s %s %q %s", r.Method, r.URL.RequestURI(), body, strings.Join(got, " "))
		w.Header().Set("X-Sum", "42")
	})
	conn, br := rig.dial(t)
	for i := range 2 {
		fmt.Fprintf(conn, "POST /counters/c1/add?n=%d HTTP/1.1\r\nHost: front.example\r\nX-Keep: yes\r\nX-Drop: no\r\nConnection: X-Drop, keep-alive\r\n"+
			"Keep-Alive: timeout=5\r\nX-Forwarded-For: 10.9.9.9\r\nTe: trailers\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusContinue {
			t.Fatalf("want 100 Continue first, got %d", resp.StatusCode)
		}
		io.WriteString(conn, "hello")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`POST /_pinned/i/counters/c1/add?n=%d "hello" X-Keep=yes X-Drop= Keep-Alive= Expect= X-Forwarded-For=127.0.0.1 X-Forwarded-Proto=http X-Forwarded-Host=front.example Te=trailers User-Agent=`, i)
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("request %d: %d\n got %s\nwant %s", i, resp.StatusCode, body, want)
		}
		if resp.Header.Get("X-Resp-Hop") != "" || resp.Trailer.Get("X-Sum") != "42" || resp.Close {
			t.Fatalf("response head %v trailer %v close %v", resp.Header, resp.Trailer, resp.Close)
		}
	}
}

// The fast path takes exactly the queries ReverseProxy passes unchanged.
func TestCleanQuery(t *testing.T) {
	for q, want := range map[string]bool{
		"":              true,
		"a=1&b=2":       true,
		"q=hello%20you": true,
		"x=%41":         true,
		"x=%4":          false,
		"x=%zz":         false,
		"%":             false,
		"a=1;b=2":       false,
	} {
		if got := cleanQuery(q); got != want {
			t.Errorf("cleanQuery(%q) = %v, want %v", q, got, want)
		}
	}
}
