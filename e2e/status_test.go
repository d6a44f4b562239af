package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// statusDo sends one request on a connection of its own (no kept-alive
// reuse hides which path answered), with the fleet's token.
func statusDo(t *testing.T, n *node, method, path string) testutil.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := testutil.Do(ctx, method, n.url()+path, "", map[string]string{"Authorization": "Bearer " + testutil.Token, "Connection": "close"})
	if err != nil {
		t.Fatalf("%s %s via %s: %v", method, path, n.id, err)
	}
	return r
}

// mayHaveRun checks the unknown-outcome answer: 504, no Retry-After, a
// body that says the request may have run.
func mayHaveRun(t *testing.T, what string, r testutil.Response) {
	t.Helper()
	var body map[string]string
	_ = json.Unmarshal([]byte(r.Body), &body)
	if r.Code != http.StatusGatewayTimeout || r.Header.Get("Retry-After") != "" ||
		body["outcome"] != "unknown" || !strings.Contains(body["error"], "may have run") {
		t.Fatalf("%s: %d Retry-After %q %s, want 504 outcome unknown without Retry-After (never a 503: it may have run)",
			what, r.Code, r.Header.Get("Retry-After"), r.Body)
	}
}

// Status codes keep their promise through a hop: a request the owner
// received and then never answered (its plugin died under it, or took
// longer than the hop's header timeout) is a 504 "may have run", never a
// 503; a request that could not reach the owner at all (its node is dead,
// the dial refused) is a 503 + Retry-After: nothing ran.
func TestUnknownOutcomeIs504(t *testing.T) {
	t.Parallel()
	misc := []string{"--plugin", "/misc=" + testutil.Bin(t, "testhost")}
	n1 := newNode(t, "n1", append([]string{"--bootstrap"}, misc...)...).start(t, true)
	n2 := newNode(t, "n2", append([]string{"--join", n1.url()}, misc...)...).start(t, true)
	nodes := []*node{n1, n2}
	testutil.WaitFor(t, 15*time.Second, "placements past the quarantine", func() bool {
		return statusDo(t, n1, "GET", "/misc/warmup/ping").Code == 200
	})
	// placeOn places id (a request through n1) and returns its owner and
	// the other node, the front door for the test's request.
	placeOn := func(id string) (string, *node, *node) {
		// A plugin that crashed before is back within its restart backoff.
		testutil.WaitFor(t, 10*time.Second, id+" served", func() bool { return statusDo(t, n1, "GET", "/misc/"+id+"/ping").Code == 200 })
		switch ownerOf(t, nodes, "/misc", id) {
		case n1:
			return id, n1, n2
		case n2:
			return id, n2, n1
		}
		t.Fatalf("%s has no owner", id)
		return "", nil, nil
	}

	// The owner's plugin exits while it holds the request.
	id, _, front := placeOn("crash")
	mayHaveRun(t, "plugin died under a forwarded request", statusDo(t, front, "POST", "/misc/"+id+"/crash"))

	// The owner holds the request past the hop's header timeout (10 s).
	id, _, front = placeOn("slow")
	start := time.Now()
	r := statusDo(t, front, "POST", "/misc/"+id+"/sleep?ms=20000")
	mayHaveRun(t, "an owner slower than the hop's header timeout", r)
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the hop answered after %s, want about its 10s header timeout", d)
	}
	if got := front.a.Metric(`pinboard_forward_failures_total{outcome="unknown"}`); got < 1 {
		t.Fatalf(`pinboard_forward_failures_total{outcome="unknown"} = %v on %s, want >= 1`, got, front.id)
	}

	// Nothing reaches a dead owner: 503 + Retry-After, until its lease
	// lapses and the id moves.
	id, owner, front := placeOn("dead")
	owner.a.Signal(syscall.SIGKILL)
	if _, err := owner.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	r = statusDo(t, front, "POST", "/misc/"+id+"/ping")
	// (Which refusal depends on which node died: the owner unreachable, or,
	// when it was the leader of these two, the directory without a quorum.
	// Either way nothing ran.)
	if r.Code != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || strings.Contains(r.Body, "may have run") {
		t.Fatalf("forward to a dead owner: %d Retry-After %q %s, want 503 + Retry-After (nothing ran)", r.Code, r.Header.Get("Retry-After"), r.Body)
	}
	owner.a = nil
}
