package httpx

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// The two sinks of Hop's rule agree: a request written by AppendHeader
// and the same request sent by httputil.ReverseProxy with Rewrite reach a
// server with the same header, for a trusted and an untrusted sender.
func TestHopSinksAgree(t *testing.T) {
	in := http.Header{
		"Accept":            {"text/plain"},
		"X-Custom":          {"a", "b"},
		"Connection":        {"keep-alive, X-Listed"},
		"X-Listed":          {"hop"},
		"Keep-Alive":        {"5"},
		"Te":                {"trailers, deflate"},
		"Forwarded":         {"for=1.2.3.4"},
		"X-Forwarded-For":   {"10.1.1.1", "10.2.2.2"},
		"X-Forwarded-Host":  {"client.example"},
		"X-Forwarded-Proto": {"https"},
		"X-Pinned-Id":       {"spoofed"},
		"Expect":            {"100-continue"},
		"Proxy-Connection":  {"keep-alive"},
	}
	seen := make(chan http.Header, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := r.Header.Clone()
		h.Del("Accept-Encoding") // the Transport's own
		h.Del("Content-Length")  // framing: a length either way, or none
		seen <- h
	}))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)

	for _, trusted := range []bool{false, true} {
		hop := Hop{RemoteAddr: "192.0.2.7:4321", Host: "front.example", Trusted: trusted,
			Set: []Field{{Name: "X-Pinned-Attestation", Value: "v1.sig"}}}

		wire, ok := hop.AppendHeader(nil, "POST", "/x?q=1", in, []byte("body"))
		if !ok {
			t.Fatal("AppendHeader refused safe fields")
		}
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(wire); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("AppendHeader's request got no response: %v\n%s", err, wire)
		}
		resp.Body.Close()
		conn.Close()
		written := <-seen

		proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			hop.Rewrite(pr.Out.Header, pr.In.Header)
		}}
		r := httptest.NewRequest("POST", "http://front.example/x?q=1", strings.NewReader("body"))
		r.Header = in.Clone()
		r.RemoteAddr = hop.RemoteAddr
		proxy.ServeHTTP(httptest.NewRecorder(), r)
		proxied := <-seen

		if !reflect.DeepEqual(written, proxied) {
			t.Errorf("trusted %v: the sinks disagree:\nAppendHeader:  %v\nReverseProxy:  %v", trusted, written, proxied)
		}
		wantFor := "192.0.2.7"
		if trusted {
			wantFor = "10.1.1.1, 10.2.2.2, 192.0.2.7"
		}
		for k, want := range map[string]string{
			"X-Forwarded-For": wantFor, "X-Pinned-Attestation": "v1.sig", "Te": "trailers", "X-Custom": "a",
		} {
			if got := written.Get(k); got != want {
				t.Errorf("trusted %v: %s = %q, want %q", trusted, k, got, want)
			}
		}
		for _, k := range []string{"X-Listed", "Keep-Alive", "Forwarded", "X-Pinned-Id", "Proxy-Connection", "Expect"} {
			if v, ok := written[k]; ok {
				t.Errorf("trusted %v: %s passed: %q", trusted, k, v)
			}
		}
		if trusted != (written.Get("X-Forwarded-Host") == "client.example") {
			t.Errorf("trusted %v: X-Forwarded-Host = %q", trusted, written.Get("X-Forwarded-Host"))
		}
	}
}

// A field that would split the head is refused, never written as is.
func TestHopRefusesUnsafeFields(t *testing.T) {
	hop := Hop{RemoteAddr: "192.0.2.7:1", Host: "h"}
	for _, h := range []http.Header{{"X-A": {"a\r\nX-Injected: 1"}}, {"X-A\n": {"v"}}, {"X-A": {"v\x00"}}} {
		if _, ok := hop.AppendHeader(nil, "GET", "/", h, nil); ok {
			t.Errorf("%q written", h)
		}
	}
	bad := Hop{RemoteAddr: "192.0.2.7:1", Host: "h\r\nX: y"}
	if _, ok := bad.AppendHeader(nil, "GET", "/", nil, nil); ok {
		t.Error("an unsafe Host written")
	}
}

// Field names are matched whatever their case, as the kept-alive loop
// passes them on as sent.
func TestHopNamesAnyCase(t *testing.T) {
	hop := Hop{RemoteAddr: "192.0.2.7:1", Host: "h", Trusted: true}
	wire, ok := hop.AppendFields(nil, "GET", "/", []Field{
		{Name: "x-forwarded-for", Value: "10.0.0.1"},
		{Name: "X-PINNED-ID", Value: "spoofed"},
		{Name: "connection", Value: "x-listed"},
		{Name: "X-Listed", Value: "hop"},
		{Name: "tE", Value: "trailers"},
		{Name: "x-keep", Value: "1"},
	}, nil)
	if !ok {
		t.Fatal("safe fields refused")
	}
	got := string(wire)
	for _, want := range []string{"\r\nx-keep: 1\r\n", "\r\nTe: trailers\r\n", "\r\nX-Forwarded-For: 10.0.0.1, 192.0.2.7\r\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"spoofed", "X-Listed", "connection", "x-forwarded-for"} {
		if strings.Contains(got, not) {
			t.Errorf("passes %q:\n%s", not, got)
		}
	}
}
