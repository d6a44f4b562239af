package passport

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

var env = map[string]string{
	"TOK_A": "token-a-0123456789abcdef0123456789",
	"TOK_B": "token-b-0123456789abcdef0123456789",
	"TOK_O": "token-o-0123456789abcdef0123456789",
	"SHORT": "short",
}

func getenv(k string) (string, bool) { v, ok := env[k]; return v, ok }

func weak(t string) error {
	if len(t) < 16 {
		return errors.New("too short")
	}
	return nil
}

const good = `{
  "providers": [{ "type": "staticToken", "id": "pinboard", "keys": [
    { "name": "previews", "token": [{ "env": "TOK_A" }, { "env": "TOK_B" }],
      "scopes": ["pinboard:worker"],
      "claims": { "pinboard": { "namespaces": ["/threads"], "allowedBackendHosts": ["10.0.0.0/8", "192.0.2.7"],
        "hostnames": [".preview.example.com"], "envs": ["*"] } } },
    { "name": "ops", "token": { "env": "TOK_O" }, "scopes": ["pinboard:operator"],
      "claims": { "pinboard": { "namespaces": ["*"], "hostnames": ["*"], "envs": ["*"], "allowedBackendHosts": ["*"] } } }
  ]}],
  "namespaces": { "/threads": { "allow": "authenticated" }, "*": { "allow": "anonymous" } }
}`

func TestParseAndLookup(t *testing.T) {
	p, err := Parse([]byte(good), getenv, weak)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{env["TOK_A"], env["TOK_B"]} {
		k, ok := p.Lookup(tok)
		if !ok || k.Name != "previews" || !k.Has(Worker) || k.Has(Operator) {
			t.Fatalf("rotated value: %+v %v", k, ok)
		}
	}
	ops, ok := p.Lookup(env["TOK_O"])
	if !ok || !ops.Has(Operator) || !ops.Claims.Unrestricted() {
		t.Fatalf("ops: %+v", ops)
	}
	if _, ok := p.Lookup(env["TOK_A"] + "x"); ok {
		t.Fatal("a token with one more byte found a key")
	}
	if _, ok := p.Lookup(""); ok {
		t.Fatal("the empty token found a key")
	}
	prev, _ := p.Lookup(env["TOK_A"])
	c := prev.Claims
	checks := []struct {
		name string
		got  bool
		want bool
	}{
		{"namespace /threads", c.Namespace("/threads"), true},
		{"namespace /other", c.Namespace("/other"), false},
		{"hostname under the suffix", c.Hostname("pr-42.Preview.example.com"), true},
		{"the bare suffix", c.Hostname("preview.example.com"), false},
		{"another domain", c.Hostname("evilpreview.example.com"), false},
		{"env", c.Env("pr-42"), true},
		{"backend in the prefix", c.BackendHost(netip.MustParseAddr("10.1.2.3")), true},
		{"backend, the one IP", c.BackendHost(netip.MustParseAddr("192.0.2.7")), true},
		{"backend outside", c.BackendHost(netip.MustParseAddr("192.0.2.8")), false},
		{"unrestricted", c.Unrestricted(), false},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s: %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	if p.Policy("/threads") != Authenticated || p.Policy("/counters") != Anonymous {
		t.Fatalf("policies: %s %s", p.Policy("/threads"), p.Policy("/counters"))
	}
}

// Without a "*" policy a namespace not named needs a key: a passport is closed by default.
func TestPolicyDefaultsToAuthenticated(t *testing.T) {
	p, err := Parse([]byte(`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"TOK_A"},"scopes":["pinboard:worker"]}]}]}`), getenv, weak)
	if err != nil {
		t.Fatal(err)
	}
	if p.Policy("/x") != Authenticated {
		t.Fatal("an unnamed namespace is anonymous without a \"*\" policy")
	}
	if k, _ := p.Lookup(env["TOK_A"]); k.Claims.Namespace("/x") {
		t.Fatal("a key without claims admits a namespace")
	}
}

// PINBOARD_TOKEN alone: one key with both scopes and every claim, every namespace anonymous.
func TestSingle(t *testing.T) {
	p := Single("token-a", "")
	k, ok := p.Lookup("token-a")
	if !ok || !k.Has(Worker) || !k.Has(Operator) || !k.Claims.Unrestricted() || p.Policy("/any") != Anonymous {
		t.Fatalf("%+v %v", k, ok)
	}
	if _, ok := p.Lookup(""); ok {
		t.Fatal("the empty token is a key")
	}
}

// Every malformed passport is refused whole, saying what and where.
func TestParseRefuses(t *testing.T) {
	key := func(fields string) string {
		return `{"providers":[{"type":"staticToken","keys":[{"name":"k",` + fields + `}]}]}`
	}
	cases := []struct{ doc, want string }{
		{``, "EOF"},
		{`{"providers":[]}`, "providers: no provider"},
		{`{"providers":[{"type":"jwt","keys":[]}]}`, `providers[0].type: unknown provider type "jwt"`},
		{`{"providers":[{"type":"staticToken","keys":[]}]}`, "providers[0].keys: no key"},
		{`{"providers":[{"type":"staticToken","keys":[{"token":{"env":"TOK_A"},"scopes":["pinboard:worker"]}]}]}`, "keys[0].name: missing"},
		{key(`"token":{"env":"TOK_A"},"scopes":[]`), "keys[0].scopes: no scope"},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:admin"]`), `scopes[0]: unknown scope "pinboard:admin"`},
		{key(`"token":{"env":"NOPE"},"scopes":["pinboard:worker"]`), "token[0]: environment variable NOPE is not set"},
		{key(`"token":[{"env":"TOK_A"},{"env":"NOPE"}],"scopes":["pinboard:worker"]`), "token[1]: environment variable NOPE is not set"},
		{key(`"token":[],"scopes":["pinboard:worker"]`), "an empty array"},
		{key(`"token":{"name":"TOK_A"},"scopes":["pinboard:worker"]`), `unknown field "name"`},
		{key(`"scopes":["pinboard:worker"]`), "token: missing"},
		{key(`"token":{"env":"SHORT"},"scopes":["pinboard:worker"]`), "token[0]: SHORT: too short"},
		{key(`"token":[{"env":"TOK_A"},{"env":"TOK_A"}],"scopes":["pinboard:worker"]`), "the same token as key"},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"regions":["eu"]}}`), `unknown field "regions"`},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"],"claims":{"other":{}}`), `unknown field "other"`},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["threads"]}}`), `namespaces: "threads" is not`},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"allowedBackendHosts":["10.0.0.0/33"]}}`), "allowedBackendHosts"},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"hostnames":["*.example.com"]}}`), "hostnames"},
		{key(`"token":{"env":"TOK_A"},"scopes":["pinboard:worker"]`) + `x`, "more than one JSON value"},
		{`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"TOK_A"},"scopes":["pinboard:worker"]},{"name":"k","token":{"env":"TOK_B"},"scopes":["pinboard:worker"]}]}]}`, `keys[1].name: "k" names two keys`},
		{`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"TOK_A"},"scopes":["pinboard:worker"]}]}],"namespaces":{"threads":{"allow":"anonymous"}}}`, `namespaces["threads"]: not a namespace`},
		{`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"TOK_A"},"scopes":["pinboard:worker"]}]}],"namespaces":{"*":{"allow":"everyone"}}}`, `namespaces["*"].allow: unknown policy "everyone"`},
		{`{"providers":[{"type":"staticToken","keys":[{"name":"k","token":{"env":"TOK_A"},"scopes":["pinboard:worker"]}]}],"tokens":[]}`, `unknown field "tokens"`},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			p, err := Parse([]byte(c.doc), getenv, weak)
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse(%s):\n got %v (%v)\nwant PINBOARD_PASSPORT is invalid: ...%s...", c.doc, err, p, c.want)
			}
		})
	}
}
