package agent

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/passport"
	"github.com/pinnedd/pinnedd/supervisor"
)

// The credentials of the matrix: none, one no key has, each key of the
// passport, both values of a key being rotated, and a plugin's own
// (its cluster-call credential: the request goes through its instance's
// cluster client).
var matrixCreds = []struct{ name, token string }{
	{"anonymous", ""},
	{"unknown", "not-a-key-0123456789abcdef0123456789"},
	{"node", testToken},
	{"worker", "worker-key-0123456789abcdef0123456789"},
	{"operator", "operator-key-0123456789abcdef01234567"},
	{"operator /a", "operator-a-key-0123456789abcdef012345"},
	{"client old", "client-old-0123456789abcdef0123456789"},
	{"client new", "client-new-0123456789abcdef0123456789"},
	{"plugin", ""},
}

const matrixPassport = `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
 {"name":"node","token":{"env":"M_NODE"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}},
 {"name":"worker","token":{"env":"M_WORKER"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}},
 {"name":"operator","token":{"env":"M_OPS"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"hostnames":["*"],"envs":["*"],"allowedBackendHosts":["*"]}}},
 {"name":"operator-a","token":{"env":"M_OPS_A"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["/a"]}}},
 {"name":"client","token":[{"env":"M_CLIENT_OLD"},{"env":"M_CLIENT_NEW"}],"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/a"]}}}]}],
 "namespaces":{"*":{"allow":"authenticated"}}}`

// What each class of route answers each credential: 401, 403, or "ok" (it
// got past authorization, whatever the handler then said of the request).
var matrixClasses = map[string][]string{
	//               anonymous unknown node  worker operator op/a client-old client-new plugin
	"public":      {"ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok"},
	"operator":    {"401", "401", "403", "403", "ok", "403", "403", "403", "401"},
	"operator ns": {"401", "401", "403", "403", "ok", "ok", "403", "403", "401"},
	"worker":      {"401", "401", "ok", "ok", "403", "403", "ok", "ok", "401"},
	// A drain names a worker; here there is none the narrowed key may touch.
	"operator worker": {"401", "401", "403", "403", "ok", "403", "403", "403", "401"},
	// The client key's claims admit no address to advertise.
	"worker register": {"401", "401", "ok", "ok", "403", "403", "403", "403", "401"},
	"worker health":   {"ok", "401", "ok", "ok", "ok", "ok", "ok", "ok", "ok"},
	"attested":        {"403", "403", "403", "403", "403", "403", "403", "403", "403"},
}

// Every route the front door mounts, by class: a route mounted without a
// row here fails the test, so none is left to chance.
var matrixRoutes = map[string]string{
	"GET /healthz":                 "public",
	"GET /readyz":                  "public",
	"GET /_pinned/challenge":       "public", // a worker's answer to the registry's probe
	"GET /metrics":                 "operator",
	"GET /_pinned/status":          "operator",
	"GET /registry/health":         "worker health",
	"GET /registry/stats":          "operator",
	"GET /_pinned/stats":           "attested",
	"POST /registry/drain":         "operator worker",
	"POST /registry/undrain":       "operator worker",
	"POST /registry/wind_down":     "operator ns",
	"GET /registry/overview":       "operator",
	"POST /_pinned/wind_down":      "attested",
	"POST /_pinned/drain":          "operator",
	"POST /_pinned/undrain":        "operator",
	"POST /_pinned/plugins/reload": "operator ns",
	"POST /_pinned/plugins/add":    "operator ns",
	"POST /_pinned/plugins/remove": "operator ns",
	"GET /registry/workers":        "operator",
	"POST /registry/register":      "worker register",
	"POST /registry/heartbeat":     "worker",
	"POST /registry/deregister":    "worker",
	"POST /registry/release":       "worker",
	"/":                            "public",
	"/_raft/":                      "operator",
	"POST /_pinned/join":           "operator",
	"POST /_pinned/leave":          "operator",
	"/_pinned/debug/pprof/":        "operator",
	"GET /_pinned/console/":        "public", // static files: every call its pages make is one of the routes above
}

// matrixBodies are the bodies of the routes that name what they touch.
var matrixBodies = map[string]string{
	"POST /registry/drain":         `{"clientId":"c1","deadline":30}`,
	"POST /registry/undrain":       `{"clientId":"c1"}`,
	"POST /registry/wind_down":     `{"namespace":"/a","deadline":0}`,
	"POST /_pinned/plugins/reload": `{"namespace":"/a"}`,
	"POST /_pinned/plugins/add":    `{"plugin":"/a"}`, // 400 past the checks: no path
	"POST /_pinned/plugins/remove": `{"namespace":"/a"}`,
	"POST /registry/register":      `{"clientId":"c1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/a"]}`,
}

// The authorization matrix comes from the routes actually mounted, on a
// node that runs a plugin (testhost, /misc): each route × each credential
// gets its class's answer.
func TestAuthorizationMatrix(t *testing.T) {
	for k, v := range map[string]string{"M_NODE": testToken, "M_WORKER": matrixCreds[3].token, "M_OPS": matrixCreds[4].token,
		"M_OPS_A": matrixCreds[5].token, "M_CLIENT_OLD": matrixCreds[6].token, "M_CLIENT_NEW": matrixCreds[7].token} {
		t.Setenv(k, v)
	}
	p, err := passport.Parse([]byte(matrixPassport), os.LookupEnv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	cfg := noHostsConfig(t, &logs)
	cfg.Passport, cfg.NoHosts = p, false
	cfg.Specs = []supervisor.Spec{{Name: "testhost", Path: testutil.Bin(t, "testhost"), Namespaces: []string{"/misc"}}}
	cfg.LeaseTTL, cfg.Heartbeat = 2*time.Second, 500*time.Millisecond // a short cold-start quarantine
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(Ending{}) })
	a.Start()
	waitReady(t, a)
	base := "http://" + a.ln.Addr().String()
	// The plugin's instance makes its calls with its own credential; the
	// node's key admits /misc (its policy: authenticated) to reach it.
	testutil.WaitFor(t, 15*time.Second, "/misc/caller active", func() bool {
		r, err := testutil.Do(context.Background(), "GET", base+"/misc/caller/pid", "", map[string]string{"Authorization": "Bearer " + testToken})
		return err == nil && r.Code == 200
	})

	routes := a.fd.Routes()
	if len(routes) < 10 {
		t.Fatalf("only %d routes mounted: %q", len(routes), routes)
	}
	for _, route := range routes {
		class, ok := matrixRoutes[route]
		if !ok {
			t.Errorf("route %q is mounted but has no row in the authorization matrix", route)
			continue
		}
		method, path, found := strings.Cut(route, " ")
		if !found {
			method, path = "GET", route
		}
		switch {
		case path == "/":
			// The mux's catch-all: a path no route and no namespace
			// takes ("/nosuch" names a namespace, which the passport's
			// default policy guards: TestNoKeyLearnsNothingOfNamespaces).
			path = "/_nosuch"
		case strings.HasSuffix(path, "/raft/"), path == "/_raft/":
			path += "members"
		}
		for i, cred := range matrixCreds {
			var got string
			if cred.name == "plugin" {
				got = pluginAnswer(t, base, method, path)
			} else {
				got = matrixAnswer(t, method, base+path, matrixBodies[route], cred.token)
			}
			if want := matrixClasses[class][i]; got != want {
				t.Errorf("%s (%s) with %s: %s, want %s", route, class, cred.name, got, want)
			}
		}
	}
	for route := range matrixRoutes {
		if !slices.Contains(routes, route) {
			t.Errorf("the matrix has a row for %q, which is not mounted", route)
		}
	}
}

// pluginAnswer is matrixAnswer for a request /misc/caller makes with its
// cluster client (its plugin's credential, and no key).
func pluginAnswer(t *testing.T, base, method, path string) string {
	t.Helper()
	q := url.Values{"method": {method}, "target": {path}}
	got, code := answerClass(t, "GET", base+"/misc/caller/call?"+q.Encode(), "", testToken, "")
	if code == http.StatusBadGateway { // testhost's answer when its cluster client got none
		t.Fatalf("the plugin's call %s %s did not reach the front door", method, path)
	}
	return got
}

// matrixAnswer is "401", "403", or "ok" for any other answer.
func matrixAnswer(t *testing.T, method, url, payload, token string) string {
	t.Helper()
	var body string
	if method == "POST" {
		body = cmp.Or(payload, "{}")
	}
	got, _ := answerClass(t, method, url, body, token, token)
	return got
}

// answerClass sends the request with token as its bearer key ("" for
// none) and classes the answer: "401", "403", or "ok" (code is the
// status); a refusal must not show secret.
func answerClass(t *testing.T, method, url, body, token, secret string) (class string, code int) {
	t.Helper()
	headers := map[string]string{}
	if token != "" {
		headers["Authorization"] = "Bearer " + token
	}
	r, err := testutil.Do(context.Background(), method, url, body, headers)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	switch r.Code {
	case 401, 403:
		if secret != "" && strings.Contains(r.Body, secret) {
			t.Errorf("%s %s: the refusal shows the token: %s", method, url, r.Body)
		}
		return fmt.Sprint(r.Code), r.Code
	}
	return "ok", r.Code
}
