package main

import (
	"encoding/base64"
	"errors"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestNormalizeAddr(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080", ""},
		{"https://pinnedd.example.com", "https://pinnedd.example.com", ""},
		{"127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{"localhost:8080", "http://localhost:8080", ""},
		{":8080", "http://127.0.0.1:8080", ""},
		{"8080", "http://127.0.0.1:8080", ""},
		{" 8080", "http://127.0.0.1:8080", ""},
		{"99999", "", "has port 99999, not 1-65535"},
		{"[::1]:8080", "http://[::1]:8080", ""},
		{"node-3", "http://node-3", ""},
		{" 127.0.0.1:8080 ", "http://127.0.0.1:8080", ""},
		{"http://10.0.0.1:8080/prefix/", "http://10.0.0.1:8080/prefix", ""},
		{"", "", "is empty"},
		{"ftp://127.0.0.1:21", "", "has scheme ftp, not http or https"},
		{"127.0.0.1:99999", "", "has port 99999, not 1-65535"},
		{"127.0.0.1:http", "", "does not parse"},
		{"127.0.0.1:", "", "has an empty port"},
		{"http://", "", "names no host"},
		{"foo bar", "", "does not parse"},
		{"http://u:p@127.0.0.1:8080", "", "carries a user, query or fragment"},
		{"http://127.0.0.1:8080/?x=1", "", "carries a user, query or fragment"},
	} {
		got, err := normalizeAddr("--addr", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "give a URL or host:port") {
				t.Errorf("normalizeAddr(%q) = %q, %v; want an error saying %q and what to give", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("normalizeAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestValidateToken(t *testing.T) {
	gen, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ tok, err string }{
		{gen, ""},
		{strings.Repeat("k", 32), ""},
		{"x", "the token is 1 characters long, the minimum is 32; make one with `pinnedd token generate`"},
		{strings.Repeat("k", 31), "is 31 characters long, the minimum is 32"},
		{"CHANGE-ME", `placeholder "CHANGE-ME"`},
		{"CHANGE-ME-to-a-long-random-string-of-forty", `placeholder "CHANGE-ME"`},
		{"dev-token", `placeholder "dev-token"`},
		{"changeme", `placeholder "changeme"`},
		{"Secret-secret-secret-secret-secret!", `placeholder "Secret"`},
		{gen + "\n", "white space"},
	} {
		err := validateToken(tc.tok)
		if tc.err == "" {
			if err != nil {
				t.Errorf("validateToken(%q) = %v, want nil", tc.tok, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errWeakToken) {
			t.Errorf("validateToken(%q) = %v, want an errWeakToken saying %q", tc.tok, err, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "pinnedd token generate") && !strings.Contains(err.Error(), "white space") {
			t.Errorf("validateToken(%q) = %v: does not say how to make a good one", tc.tok, err)
		}
	}
}

func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		tok, err := newToken()
		if err != nil {
			t.Fatal(err)
		}
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) != 32 || len(tok) != 43 {
			t.Fatalf("token %q: %d bytes, %v; want 32 bytes in 43 URL-safe characters", tok, len(b), err)
		}
		if seen[tok] {
			t.Fatalf("token %q made twice", tok)
		}
		seen[tok] = true
		if err := validateToken(tok); err != nil {
			t.Fatalf("a generated token is refused: %v", err)
		}
	}
}

func TestVersionOf(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"tagged module", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: vcs("false")}, "v1.4.0"},
		{"clean checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("false")}, "0123456789ab"},
		{"dirty checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("true")}, "0123456789ab-dirty"},
		{"no vcs", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"nothing", debug.BuildInfo{}, "devel"},
	} {
		if got := versionOf(&tc.info); got != tc.want {
			t.Errorf("%s: versionOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestAgentErrorHint(t *testing.T) {
	e := &agentError{addr: "http://127.0.0.1:8080", status: 401, message: "missing token"}
	if got, want := e.Error(), "http://127.0.0.1:8080 answered 401: missing token (set PINBOARD_TOKEN or pass --token)"; got != want {
		t.Fatalf("401: %q, want %q", got, want)
	}
	e = &agentError{addr: "http://127.0.0.1:8080", status: 403, message: "token lacks the operator scope"}
	if strings.Contains(e.Error(), "PINBOARD_TOKEN") {
		t.Fatalf("403 names the token hint: %q", e.Error())
	}
}

// TestRefusedWindowFor: at a terminal a refused address is given up on
// soon; otherwise (a script, a pipe) an agent still starting gets 10 s;
// --timeout bounds both.
func TestRefusedWindowFor(t *testing.T) {
	for _, tc := range []struct {
		terminal bool
		timeout  time.Duration
		want     time.Duration
	}{
		{true, defaultTimeout, 2 * time.Second},
		{false, defaultTimeout, 10 * time.Second},
		{true, time.Second, time.Second},
		{false, time.Second, time.Second},
	} {
		if got := refusedWindowFor(tc.terminal, tc.timeout); got != tc.want {
			t.Errorf("refusedWindowFor(%v, %s) = %s, want %s", tc.terminal, tc.timeout, got, tc.want)
		}
	}
}

// A token goes in clear only to this machine; anywhere else it needs
// https (or --insecure, which skips this check).
func TestKeyTravelsSafely(t *testing.T) {
	for _, c := range []struct {
		base string
		ok   bool
	}{
		{"http://127.0.0.1:8080", true},
		{"http://127.8.9.10:8080", true},
		{"http://[::1]:8080", true},
		{"http://localhost:8080", true},
		{"http://LOCALHOST:8080", true},
		{"https://10.0.0.5:8080", true},
		{"https://node1.example:8443", true},
		{"http://10.0.0.5:8080", false},
		{"http://node1.example:8080", false},
		{"http://localhost.evil.example:8080", false},
		{"http://[::ffff:10.0.0.5]:8080", false},
	} {
		err := keyTravelsSafely(c.base)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.base, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("%s: the refusal does not name --insecure: %v", c.base, err)
		}
	}
}

// status says where the keys at rest stand during a rotation of the node
// key: all under this node's token, or which are still under the old one.
func TestStatusShowsKeysToSeal(t *testing.T) {
	for _, c := range []struct {
		keys *[]string
		want string
	}{
		{nil, ""},
		{&[]string{}, "keys at rest  sealed under this node's token"},
		{&[]string{"cluster CA key", "cluster secret"}, "keys at rest  cluster CA key, cluster secret still sealed under a previous token"},
	} {
		var b strings.Builder
		if err := printStatus(&b, statusView{KeysToSeal: c.keys}); err != nil {
			t.Fatal(err)
		}
		if c.want == "" && strings.Contains(b.String(), "keys at rest") || !strings.Contains(b.String(), c.want) {
			t.Errorf("keysToSeal %v:\n%s\nwant %q", c.keys, b.String(), c.want)
		}
	}
}
