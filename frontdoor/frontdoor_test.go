package frontdoor

import (
	"net/http/httptest"
	"testing"

	"github.com/pinnedd/pinnedd/pinboard"
)

func TestSplitInstancePath(t *testing.T) {
	for path, want := range map[string][3]string{
		"/counters/alice/increment": {"/counters", "alice", "/increment"},
		"/counters/alice":           {"/counters", "alice", "/"},
		"/counters/alice/":          {"/counters", "alice", "/"},
		"/counters/alice/a/b%2Fc":   {"/counters", "alice", "/a/b%2Fc"},
		"/counters//x":              {"/counters", "", "/x"},
		"/counters":                 {"/counters", "", "/"},
		"/counters/":                {"/counters", "", "/"},
		"/":                         {"/", "", "/"},
	} {
		ns, id, rest, ok := splitInstancePath(path)
		if !ok || [3]string{ns, id, rest} != want {
			t.Errorf("split(%q) = %q %q %q %v, want %q", path, ns, id, rest, ok, want)
		}
	}
	for _, path := range []string{"", "counters/alice"} {
		if _, _, _, ok := splitInstancePath(path); ok {
			t.Errorf("split(%q) ok, want not", path)
		}
	}
}

func TestIsInstancePath(t *testing.T) {
	for p, want := range map[string]bool{
		"/counters/a": true, "/healthz": false, "/metrics": false, "/registry/workers": false,
		"/_pinned/status": false, "/_raft/apply": false, "/": false, "": false,
	} {
		if got := isInstancePath(p); got != want {
			t.Errorf("isInstancePath(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestTokens(t *testing.T) {
	tok := pinboard.NewTokens("s3cret", "")
	req := func(h string) bool {
		r := httptest.NewRequest("GET", "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		return tok.Allowed(r, pinboard.ScopeOperator)
	}
	if !req("Bearer s3cret") || req("Bearer s3cre") || req("Bearer ") || req("") || req("s3cret") || req("Basic s3cret") {
		t.Fatal("token check accepts or refuses the wrong things")
	}
}
