package pinboard

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every route that needs a scope answers the same way: 401 with
// WWW-Authenticate and a message naming PINBOARD_TOKEN for no token or an
// unknown one, 403 for a known token without the scope.
func TestRequireScopeAnswers(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *FrontDoorConfig) {
		c.Tokens = NewTokens("op-token").Grant("worker-only", ScopeWorker)
	})
	for _, c := range []struct {
		name, header string
		code         int
		want         string
	}{
		{"no header", "", http.StatusUnauthorized, "missing bearer token: set PINBOARD_TOKEN / --token"},
		{"not bearer", "Basic b3A6dG9rZW4=", http.StatusUnauthorized, `must be "Bearer <token>"`},
		{"empty bearer", "Bearer ", http.StatusUnauthorized, "missing bearer token"},
		{"unknown token", "Bearer nope", http.StatusUnauthorized, "unknown token: check PINBOARD_TOKEN"},
		{"no scope", "Bearer worker-only", http.StatusForbidden, "token lacks the scope pinboard:operator"},
		{"good", "Bearer op-token", http.StatusOK, ""},
	} {
		for _, path := range []string{"/registry/workers", "/_pinned/status", "/registry/stats"} {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", rig.srv.URL+path, nil)
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			buf, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			n := len(buf)
			if resp.StatusCode != c.code {
				t.Errorf("%s %s: %d %s, want %d", c.name, path, resp.StatusCode, buf[:n], c.code)
				continue
			}
			if c.code == http.StatusOK {
				continue
			}
			if msg := errorOf(t, string(buf[:n])); !strings.Contains(msg, c.want) {
				t.Errorf("%s %s: error %q, want it to say %q", c.name, path, msg, c.want)
			}
			if got := resp.Header.Get("WWW-Authenticate"); (c.code == http.StatusUnauthorized) != strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s %s: WWW-Authenticate %q", c.name, path, got)
			}
		}
	}
}

// With AllowLoopbackAnonymous (--dev), a request with no Authorization
// header from loopback holds every scope; a named token is still checked,
// and a peer from elsewhere still needs one.
func TestLoopbackAnonymous(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *FrontDoorConfig) { c.Tokens = NewTokens("dev-token").AllowLoopbackAnonymous() })
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "", ""); code != http.StatusOK {
		t.Errorf("anonymous loopback status: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "dev-token", ""); code != http.StatusOK {
		t.Errorf("dev-token status: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("wrong token on loopback: %d %s, want 401", code, body)
	}
	tok := NewTokens("dev-token").AllowLoopbackAnonymous()
	for addr, want := range map[string]error{
		"127.0.0.1:4000":       nil,
		"[::1]:4000":           nil,
		"[::ffff:127.0.0.1]:1": nil,
		"10.0.0.7:4000":        ErrMissingToken,
		"192.0.2.1:80":         ErrMissingToken,
		"garbage":              ErrMissingToken,
	} {
		r := httptest.NewRequest("GET", "/registry/workers", nil)
		r.RemoteAddr = addr
		if err := tok.Check(r, ScopeOperator); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("Check from %s = %v, want %v", addr, err, want)
		}
	}
	// Without the option, loopback needs a token like anyone else.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	if err := NewTokens("dev-token").Check(r, ScopeOperator); !errors.Is(err, ErrMissingToken) {
		t.Errorf("loopback without the option: %v", err)
	}
}
