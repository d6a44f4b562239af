package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

const (
	opsKey    = "ops-key-0123456789abcdef0123456789"
	hooksKey  = "hooks-client-0123456789abcdef01234"
	countKey  = "counters-client-0123456789abcdef01"
	hooksOps  = "hooks-ops-0123456789abcdef0123456789"
	passportJ = `{"providers":[{"type":"staticToken","id":"pinboard","keys":[
  {"name":"node","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker"],
   "claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}},
  {"name":"ops","token":{"env":"OPS_KEY"},"scopes":["pinboard:operator"],
   "claims":{"pinboard":{"namespaces":["*"],"hostnames":["*"],"envs":["*"],"allowedBackendHosts":["*"]}}},
  {"name":"hooks-client","token":{"env":"HOOKS_KEY"},"scopes":["pinboard:worker"],
   "claims":{"pinboard":{"namespaces":["/hooks"]}}},
  {"name":"counters-client","token":{"env":"COUNT_KEY"},"scopes":["pinboard:worker"],
   "claims":{"pinboard":{"namespaces":["/counters"]}}},
  {"name":"hooks-ops","token":{"env":"HOOKS_OPS_KEY"},"scopes":["pinboard:operator"],
   "claims":{"pinboard":{"namespaces":["/hooks"]}}}]}],
 "namespaces":{"/hooks":{"allow":"authenticated"},"*":{"allow":"anonymous"}}}`
)

var passportEnv = []string{"PINBOARD_PASSPORT=" + passportJ, "OPS_KEY=" + opsKey, "HOOKS_KEY=" + hooksKey, "COUNT_KEY=" + countKey, "HOOKS_OPS_KEY=" + hooksOps}

// A passport splits the keys: an anonymous namespace admits anyone, an
// authenticated one only a key whose claims admit it (401 without one, 403
// with one that does not), also on a kept-alive connection whose previous
// request was admitted, and the host never sees the key; operator routes
// need the operator key, not the node's worker key nor a client's, and an
// operator key narrowed to a namespace reaches that namespace only.
func TestPassportPoliciesAndScopes(t *testing.T) {
	t.Parallel()
	n := newNode(t, "n1", "--bootstrap", "--plugin", "/hooks="+testutil.Bin(t, "testhost"))
	n.a = testutil.StartAgentAt(t, n.wd, append(append([]string{}, fleetEnv...), passportEnv...), n.args...)
	testutil.WaitFor(t, 15*time.Second, "the node serves", func() bool {
		r, err := testutil.Do(context.Background(), "GET", n.url()+"/counters/p0/value", "", nil)
		return err == nil && r.Code == 200
	})

	client := &http.Client{} // one kept-alive connection, reused
	get := func(path, key string) (int, http.Header, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("GET", n.url()+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, resp.Header, body
	}
	if code, _, body := get("/counters/p1/value", ""); code != 200 {
		t.Fatalf("anonymous namespace, no key: %d %v", code, body)
	}
	code, h, body := get("/hooks/p1/x", hooksKey)
	if code != 200 {
		t.Fatalf("authenticated namespace, its key: %d %v", code, body)
	}
	if hdrs, _ := body["headers"].(map[string]any); hdrs["Authorization"] != nil {
		t.Fatalf("the host saw the client's key: %v", hdrs)
	}
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{"/hooks/p1/x", "", 401},
		{"/hooks/p1/x", "not-a-key", 401},
		{"/hooks/p1/x", countKey, 403},
		{"/hooks/p1/x", hooksKey, 200},
		{"/_pinned/status", hooksKey, 403},
		{"/_pinned/status", testutil.Token, 403}, // the node's own key: worker only
		{"/_pinned/status", opsKey, 200},
		{"/_pinned/status", "", 401},
	} {
		code, h, body = get(c.path, c.key)
		if code != c.want {
			t.Errorf("GET %s with %q: %d %v, want %d", c.path, c.key, code, body, c.want)
		}
		if code == 401 && h.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s: 401 without WWW-Authenticate", c.path)
		}
	}
	_ = h
	// An operator key narrowed to /hooks winds /hooks down, nothing else.
	for _, c := range []struct {
		ns   string
		want int
	}{{"/hooks", 200}, {"/counters", 403}} {
		r, err := testutil.Do(context.Background(), "POST", n.url()+"/registry/wind_down", `{"namespace":"`+c.ns+`","deadline":0}`,
			map[string]string{"Authorization": "Bearer " + hooksOps})
		if err != nil || r.Code != c.want {
			t.Errorf("wind_down %s with the /hooks operator key: %v %d %s, want %d", c.ns, err, r.Code, r.Body, c.want)
		}
	}
	if code, _, _ := get("/_pinned/status", hooksOps); code != 403 {
		t.Errorf("status with the /hooks operator key: %d, want 403", code)
	}
	// Keys are named in answers, never shown.
	if _, _, body := get("/hooks/p1/x", countKey); strings.Contains(body["error"].(string), countKey) || !strings.Contains(body["error"].(string), "counters-client") {
		t.Errorf("a refusal shows the key or not its name: %v", body)
	}
}

// A passport that does not parse or check out stops the node at start,
// saying what and where; so does a node whose own key does not admit a
// namespace it serves.
func TestPassportRefusedAtStart(t *testing.T) {
	t.Parallel()
	bin := testutil.Bin(t, "pinnedd")
	for _, c := range []struct{ passport, want string }{
		{`{"providers":[]}`, "PINBOARD_PASSPORT is invalid: providers: no provider"},
		{strings.Replace(passportJ, "OPS_KEY", "UNSET_KEY", 1), "environment variable UNSET_KEY is not set"},
		{strings.Replace(passportJ, `"namespaces":["*"],"allowedBackendHosts"`, `"namespaces":["/hooks"],"allowedBackendHosts"`, 1), "does not admit namespace /counters"},
		{strings.Replace(passportJ, `"name":"node","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker"]`, `"name":"node","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:operator"]`, 1), "not a key of it with scope pinboard:worker"},
	} {
		code, out := runAgentEnv(t, bin, nil, []string{"PINBOARD_PASSPORT=" + c.passport, "OPS_KEY=" + opsKey, "HOOKS_KEY=" + hooksKey, "COUNT_KEY=" + countKey, "HOOKS_OPS_KEY=" + hooksOps},
			"--bootstrap", "--local-state", "--data-dir", t.TempDir(), "--plugin", "/counters="+testutil.Bin(t, "counter"))
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("passport %.60s...: exit %d, want a refusal saying %q:\n%s", c.passport, code, c.want, out)
		}
	}
}
