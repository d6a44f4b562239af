package frontdoor

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"

	"github.com/pinnedd/pinnedd/pinboard"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/passport"
)

// Every route that needs a scope answers the same way: 401 with
// WWW-Authenticate and a message naming PINBOARD_TOKEN for no token or an
// unknown one, 403 for a known token without the scope.
func TestRequireScopeAnswers(t *testing.T) {
	rig := newDoorRig(t, func(_ *doorRig, c *nodeConfig) {
		c.Tokens = pinboard.NewTokens("op-token").Grant("worker-only", pinboard.ScopeWorker)
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
		// Odd shapes: the scheme is case-insensitive, and the white space
		// around a field value is not part of it (net/http trims it),
		// but a token is one word after one space.
		{"lowercase scheme", "bearer op-token", http.StatusOK, ""},
		{"trailing spaces", "Bearer op-token   ", http.StatusOK, ""},
		{"two spaces", "Bearer  op-token", http.StatusUnauthorized, `must be "Bearer <token>"`},
		{"space inside", "Bearer op-token x", http.StatusUnauthorized, "unknown token"},
		{"10 KB key", "Bearer " + strings.Repeat("k", 10<<10), http.StatusUnauthorized, "unknown token"},
		{"two headers", "Bearer op-token\x00Bearer op-token", http.StatusUnauthorized, "2 Authorization headers: send one"},
	} {
		for _, path := range []string{"/registry/workers", "/_pinned/status", "/registry/stats"} {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", rig.srv.URL+path, nil)
			for h := range strings.SplitSeq(c.header, "\x00") {
				if h != "" {
					req.Header.Add("Authorization", h)
				}
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
			if msg := testutil.ErrorOf(t, string(buf[:n])); !strings.Contains(msg, c.want) {
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
	rig := newDoorRig(t, func(_ *doorRig, c *nodeConfig) { c.Tokens = pinboard.NewTokens("dev-token").AllowLoopbackAnonymous() })
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "", ""); code != http.StatusOK {
		t.Errorf("anonymous loopback status: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "dev-token", ""); code != http.StatusOK {
		t.Errorf("dev-token status: %d %s", code, body)
	}
	if code, body, _ := rig.call(t, "GET", "/_pinned/status", "wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("wrong token on loopback: %d %s, want 401", code, body)
	}
	tok := pinboard.NewTokens("dev-token").AllowLoopbackAnonymous()
	for addr, want := range map[string]error{
		"127.0.0.1:4000":       nil,
		"[::1]:4000":           nil,
		"[::ffff:127.0.0.1]:1": nil,
		"10.0.0.7:4000":        pinboard.ErrMissingToken,
		"192.0.2.1:80":         pinboard.ErrMissingToken,
		"garbage":              pinboard.ErrMissingToken,
	} {
		r := httptest.NewRequest("GET", "/registry/workers", nil)
		r.RemoteAddr = addr
		if err := tok.Check(r, pinboard.ScopeOperator); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("Check from %s = %v, want %v", addr, err, want)
		}
	}
	// Without the option, loopback needs a token like anyone else.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	if err := pinboard.NewTokens("dev-token").Check(r, pinboard.ScopeOperator); !errors.Is(err, pinboard.ErrMissingToken) {
		t.Errorf("loopback without the option: %v", err)
	}
}

// Claims narrow the scopes: an operator key narrowed to /a reaches the
// routes that name /a only (not the fleet-wide ones, nor /b), a worker key
// registers only the namespaces and addresses its claims admit. The
// answer names the key, never the token.
func TestClaimsNarrowTheScopes(t *testing.T) {
	narrow := func(scope pinboard.Scope) *passport.Key {
		c, err := passport.Parse([]byte(`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"T"},"scopes":["`+string(scope)+`"],
		  "claims":{"pinboard":{"namespaces":["/a"],"allowedBackendHosts":["10.0.0.0/8"]}}}]}]}`),
			func(string) (string, bool) { return "tok", true }, nil)
		if err != nil {
			t.Fatal(err)
		}
		k, _ := c.Lookup("tok")
		return k
	}
	rig := newDoorRig(t, func(r *doorRig, c *nodeConfig) {
		c.Registry = pinboard.NewRegistry(r.dir, 0)
		c.Tokens = pinboard.NewTokens("full-token")
		c.Tokens.Passport().Add(narrow(pinboard.ScopeOperator), "ops-a")
		c.Tokens.Passport().Add(narrow(pinboard.ScopeWorker), "worker-a")
	})
	rig.register(t, "wa", "n1", time.Hour, "/a")
	rig.register(t, "wb", "n2", time.Hour, "/b")
	for _, c := range []struct {
		method, path, body, token string
		code                      int
		say                       string
	}{
		{"POST", "/registry/drain", `{"clientId":"wa","deadline":30}`, "ops-a", 200, "wa"},
		{"POST", "/registry/drain", `{"clientId":"wb","deadline":30}`, "ops-a", 403, "forbidden"},
		{"POST", "/registry/register", `{"clientId":"wb","advertiseUrl":"http://10.1.2.3:80","namespaces":["/a"]}`, "worker-a", 403, `may not replace the registration of client id \"wb\"`},
		{"POST", "/registry/register", `{"clientId":"c","advertiseUrl":"http://10.1.2.3:80","namespaces":["/a"],"liveIds":[{"namespace":"/b","id":"x"}]}`, "worker-a", 403, "does not admit namespace /b"},
		{"GET", "/registry/health", "", "ops-a", 200, `"ok":true`},
		{"GET", "/_pinned/status", "", "ops-a", 403, `key \"k\" is narrowed to some`},
		{"GET", "/registry/workers", "", "ops-a", 403, "every namespace"},
		{"GET", "/_pinned/status", "", "full-token", 200, ""},
		{"POST", "/registry/wind_down", `{"namespace":"/b","deadline":0}`, "ops-a", 403, "does not admit namespace /b"},
		{"POST", "/registry/drain", `{"clientId":"nobody","deadline":30}`, "ops-a", 403, "forbidden"},
		{"POST", "/registry/drain", `{"clientId":"nobody","deadline":30}`, "full-token", 404, "unknown client id"},
		{"POST", "/_pinned/plugins/reload", `{}`, "ops-a", 403, "name one"},
		{"POST", "/registry/register", `{"clientId":"c","advertiseUrl":"http://10.1.2.3:80","namespaces":["/b"]}`, "worker-a", 403, "does not admit namespace /b"},
		{"POST", "/registry/register", `{"clientId":"c","advertiseUrl":"http://192.0.2.1:80","namespaces":["/a"]}`, "worker-a", 403, "may not advertise"},
		{"POST", "/registry/register", `{"clientId":"c","advertiseUrl":"http://workers.example:80","namespaces":["/a"]}`, "worker-a", 403, "may not advertise"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, rig.srv.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if c.path == "/registry/health" && strings.Contains(string(buf), "placements") {
			t.Errorf("health gave a narrowed key the fleet's figures: %s", buf)
		}
		if strings.Contains(c.body, `"clientId":"wb"`) && strings.Contains(string(buf), "/b") {
			t.Errorf("a narrowed key learned the namespaces of another client id: %s", buf)
		}
		if resp.StatusCode != c.code || !strings.Contains(string(buf), c.say) || strings.Contains(string(buf), c.token) {
			t.Errorf("%s %s %s with %s: %d %s, want %d saying %q", c.method, c.path, c.body, c.token, resp.StatusCode, buf, c.code, c.say)
		}
	}
	// Inside its claims, a narrowed worker key passes to the registry
	// (which then checks the registration itself).
	req, _ := http.NewRequestWithContext(t.Context(), "POST", rig.srv.URL+"/registry/register",
		strings.NewReader(`{"clientId":"c","advertiseUrl":"http://10.1.2.3:80","namespaces":["/a"]}`))
	req.Header.Set("Authorization", "Bearer worker-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(buf), "may not advertise") || strings.Contains(string(buf), "does not admit") {
		t.Fatalf("a registration inside the key's claims was refused for them: %d %s", resp.StatusCode, buf)
	}
}

// The refusal counter has every series it can count from the start, at 0:
// a rate over it, or an alert, sees the first refusal.
func TestRefusalSeriesStartAtZero(t *testing.T) {
	p := passport.Single("deployment-token-0123456789abcdef0123")
	p.Add(&passport.Key{Name: "ops", Scopes: []pinboard.Scope{pinboard.ScopeOperator}, Claims: passport.Unrestricted()}, "ops-token-0123456789abcdef0123456789")
	reg := prometheus.NewRegistry()
	reg.MustRegister(pinboard.NewPassportTokens(p).Collector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	var series []string
	for _, m := range mfs[0].GetMetric() {
		if v := m.GetCounter().GetValue(); v != 0 {
			t.Errorf("%v = %v", m.GetLabel(), v)
		}
		series = append(series, m.GetLabel()[0].GetValue()+"/"+m.GetLabel()[1].GetValue())
	}
	want := "deployment/claims deployment/scope none/missing none/unknown ops/claims ops/scope"
	if got := strings.Join(series, " "); got != want {
		t.Fatalf("series %s, want %s", got, want)
	}
}

// Under a passport whose default policy needs a key, a client without one
// learns nothing of which namespaces or ids exist: an unknown namespace and
// a bad id of a known one are both 401, as a good request is; with the key,
// the 404 and the 400.
func TestNoKeyLearnsNothingOfNamespaces(t *testing.T) {
	const key = "client-key-0123456789abcdef0123456789"
	p, err := passport.Parse([]byte(`{"providers":[{"type":"staticToken","id":"pinboard","keys":[
	 {"name":"client","token":{"env":"K"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],
	 "namespaces":{"*":{"allow":"authenticated"}}}`), func(string) (string, bool) { return key, true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	rig := newDoorRig(t, func(_ *doorRig, c *nodeConfig) { c.Tokens = pinboard.NewPassportTokens(p) })
	rig.register(t, "w1", "n1", time.Hour, "/known")
	for _, c := range []struct {
		path, token string
		code        int
	}{
		{"/nosuch/x", "", http.StatusUnauthorized},
		{"/known/a%2Fb", "", http.StatusUnauthorized},
		{"/nosuch/x", key, http.StatusNotFound},
		{"/known/a%2Fb", key, http.StatusBadRequest},
		{"/Bad/x", "", http.StatusNotFound}, // no namespace at all: nothing to protect
	} {
		if code, body, _ := rig.call(t, "GET", c.path, c.token, ""); code != c.code {
			t.Errorf("GET %s (key %v): %d %s, want %d", c.path, c.token != "", code, body, c.code)
		}
	}
}
