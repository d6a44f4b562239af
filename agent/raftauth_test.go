package agent

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"testing"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A refused call to Raft's RPCs (/_raft/) counts in
// pinboard_auth_refused_total as a refusal on any other route does: an
// operator watching for probes sees these too.
func TestRaftRefusalsAreCounted(t *testing.T) {
	a, err := New(context.Background(), noHostsConfig(t, io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(Ending{}) })
	a.Start()
	waitReady(t, a)
	base := "http://" + a.ln.Addr().String()
	refused := func(reason string) float64 {
		t.Helper()
		r, err := testutil.Do(t.Context(), "GET", base+"/metrics", "", map[string]string{"Authorization": "Bearer " + testToken})
		if err != nil || r.Code != 200 {
			t.Fatalf("metrics: %v %d", err, r.Code)
		}
		m := regexp.MustCompile(`(?m)^pinboard_auth_refused_total\{key="none",reason="` + reason + `"\} (\S+)$`).FindStringSubmatch(r.Body)
		if m == nil {
			t.Fatalf("no pinboard_auth_refused_total{key=none,reason=%s} in the metrics", reason)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	missing, unknown := refused("missing"), refused("unknown")
	for _, token := range []string{"", "not-a-key-0123456789abcdef0123456789"} {
		h := map[string]string{}
		if token != "" {
			h["Authorization"] = "Bearer " + token
		}
		if r, err := testutil.Do(t.Context(), "GET", base+"/_raft/members", "", h); err != nil || r.Code != 401 {
			t.Fatalf("GET /_raft/members with %q: %v %d %s", token, err, r.Code, r.Body)
		}
	}
	if got := refused("missing"); got != missing+1 {
		t.Errorf("refusals for a missing key: %v, want %v", got, missing+1)
	}
	if got := refused("unknown"); got != unknown+1 {
		t.Errorf("refusals for an unknown key: %v, want %v", got, unknown+1)
	}
}
