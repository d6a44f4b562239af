package agent

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/passport"
)

// The credentials of the matrix: none, one no key has, each key of the
// passport, and both values of a key being rotated.
var matrixCreds = []struct{ name, token string }{
	{"anonymous", ""},
	{"unknown", "not-a-key-0123456789abcdef0123456789"},
	{"node", testToken},
	{"worker", "worker-key-0123456789abcdef0123456789"},
	{"operator", "operator-key-0123456789abcdef01234567"},
	{"operator /a", "operator-a-key-0123456789abcdef012345"},
	{"client old", "client-old-0123456789abcdef0123456789"},
	{"client new", "client-new-0123456789abcdef0123456789"},
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
	//               anonymous unknown node  worker operator op/a client-old client-new
	"public":      {"ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok"},
	"operator":    {"401", "401", "403", "403", "ok", "403", "403", "403"},
	"operator ns": {"401", "401", "403", "403", "ok", "ok", "403", "403"},
	"worker":      {"401", "401", "ok", "ok", "403", "403", "ok", "ok"},
	// A drain names a worker; here there is none the narrowed key may touch.
	"operator worker": {"401", "401", "403", "403", "ok", "403", "403", "403"},
	// The client key's claims admit no address to advertise.
	"worker register": {"401", "401", "ok", "ok", "403", "403", "403", "403"},
	"worker health":   {"ok", "401", "ok", "ok", "ok", "ok", "ok", "ok"},
	"attested":        {"403", "403", "403", "403", "403", "403", "403", "403"},
}

// Every route the front door mounts, by class: a route mounted without a
// row here fails the test, so none is left to chance.
var matrixRoutes = map[string]string{
	"GET /healthz":                 "public",
	"GET /readyz":                  "public",
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
}

// matrixBodies are the bodies of the routes that name what they touch.
var matrixBodies = map[string]string{
	"POST /registry/drain":         `{"clientId":"c1","deadline":30}`,
	"POST /registry/undrain":       `{"clientId":"c1"}`,
	"POST /registry/wind_down":     `{"namespace":"/a","deadline":0}`,
	"POST /_pinned/plugins/reload": `{"namespace":"/a"}`,
	"POST /registry/register":      `{"clientId":"c1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/a"]}`,
}

// The authorization matrix comes from the routes actually mounted: each
// route × each credential gets its class's answer.
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
	cfg.Passport = p
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(Ending{}) })
	a.Start()
	waitReady(t, a)
	base := "http://" + a.ln.Addr().String()

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
			path = "/nosuch"
		case strings.HasSuffix(path, "/raft/"), path == "/_raft/":
			path += "members"
		}
		for i, cred := range matrixCreds {
			got := matrixAnswer(t, method, base+path, matrixBodies[route], cred.token)
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

// matrixAnswer is "401", "403", or "ok" for any other answer.
func matrixAnswer(t *testing.T, method, url, payload, token string) string {
	t.Helper()
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader(cmp.Or(payload, "{}"))
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case 401, 403:
		if strings.Contains(string(b), token) && token != "" {
			t.Errorf("%s %s: the refusal shows the token: %s", method, url, b)
		}
		return fmt.Sprint(resp.StatusCode)
	}
	return "ok"
}
