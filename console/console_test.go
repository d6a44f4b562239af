package console

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix, NewHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// Every page and every file a page names is served, each with the headers
// that keep it same-origin: a strict CSP, no framing, no CORS.
func TestPagesAndTheirFilesAreServedSameOriginOnly(t *testing.T) {
	srv := serve(t)
	ref := regexp.MustCompile(`(?:src|href)="(/_pinned/console/[^"]+)"`)
	seen := map[string]bool{}
	for _, page := range []string{"fleet", "fleet/hosts", "fleet/instances", "inspector"} {
		resp, body := get(t, srv.URL+Prefix+page, map[string]string{"Origin": "https://elsewhere.example"})
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("%s: %d %s", page, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		checkHeaders(t, page, resp)
		for _, m := range ref.FindAllStringSubmatch(body, -1) {
			seen[m[1]] = true
		}
	}
	if len(seen) < 5 {
		t.Fatalf("the pages name only %v", seen)
	}
	for path := range seen {
		resp, _ := get(t, srv.URL+path, nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s, named by a page: %d", path, resp.StatusCode)
		}
		if strings.HasSuffix(path, ".js") && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/javascript") {
			t.Errorf("%s: Content-Type %q: a module script must be served as JavaScript", path, resp.Header.Get("Content-Type"))
		}
		checkHeaders(t, path, resp)
	}
}

func checkHeaders(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("%s: CSP %q lacks %q", what, csp, want)
		}
	}
	if strings.Contains(csp, "unsafe") {
		t.Errorf("%s: CSP %q allows something unsafe", what, csp)
	}
	if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
		t.Errorf("%s: X-Frame-Options %q", what, got)
	}
	if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("%s: X-Content-Type-Options %q", what, got)
	}
	for k := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			t.Errorf("%s: answers %s: the console serves no other origin", what, k)
		}
	}
}

func TestAddressesOutsideThePagesAreRefused(t *testing.T) {
	srv := serve(t)
	resp, _ := get(t, srv.URL+Prefix, nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != Prefix+"fleet" {
		t.Errorf("%s: %d to %q, want a redirect to the fleet", Prefix, resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, p := range []string{"static/nope.js", "fleet.html", "static/../console.go", "static/../../doc.go", "nope", "static/"} {
		// Straight to the handler: a mux would clean the dots first.
		rec := httptest.NewRecorder()
		NewHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://x"+Prefix+p, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", p, rec.Code)
		}
	}
	rec := httptest.NewRecorder()
	NewHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Prefix+"fleet", strings.NewReader("{}")))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
	resp, _ = get(t, srv.URL+Prefix+"static/fleet.js", nil)
	etag := resp.Header.Get("ETag")
	if resp, _ := get(t, srv.URL+Prefix+"static/fleet.js", map[string]string{"If-None-Match": etag}); etag == "" || resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match %q: %d, want 304", etag, resp.StatusCode)
	}
}

// The CSP would block inline script, inline style and event-handler
// attributes in the browser; the files must not need them, and must load
// nothing from another origin (the machines are offline).
func TestFilesNeedNothingTheCSPForbids(t *testing.T) {
	files, err := filepath.Glob("static/*")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	handler := regexp.MustCompile(`(?i)<[^>]+\son[a-z]+\s*=`)
	remote := regexp.MustCompile(`(?:src|href|import|from|url\()\s*=?\s*["'(]?\s*(?:https?:)?//`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.HasSuffix(f, ".html") {
			for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(s, -1) {
				if !strings.Contains(tag, ` src="`) {
					t.Errorf("%s: inline script %s", f, tag)
				}
			}
			if strings.Contains(s, "<style") || regexp.MustCompile(`\sstyle=`).MatchString(s) {
				t.Errorf("%s: inline style", f)
			}
			if m := handler.FindString(s); m != "" {
				t.Errorf("%s: inline event handler %s", f, m)
			}
		}
		if m := remote.FindString(s); m != "" {
			t.Errorf("%s: loads from another origin: %s", f, m)
		}
		if strings.Contains(s, "innerHTML") || strings.Contains(s, "eval(") {
			t.Errorf("%s: builds markup or code from strings", f)
		}
	}
}

// The inspector speaks Statewire with the chat's own JavaScript client,
// byte for byte: one client, whose conformance tests run with node.
func TestInspectorUsesTheChatsClient(t *testing.T) {
	want, err := os.ReadFile("../examples/chat/statewire.mjs")
	if err != nil {
		t.Fatal(err)
	}
	got, err := static.ReadFile("static/statewire.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("console/static/statewire.mjs differs from examples/chat/statewire.mjs: cp examples/chat/statewire.mjs console/static/")
	}
}
