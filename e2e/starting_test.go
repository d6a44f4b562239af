package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A node restarting into a fleet answers for an id another node serves from
// the moment its front door listens: its copy of the directory is empty or
// old until it has caught up with the leader, and until then it must not
// say "no live workers for namespace" (a lie: the owner is alive). It waits
// for its replica, or says it is starting (503 + Retry-After).
func TestStartingNodeNeverSaysNoLiveWorkers(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFor(t, 20*time.Second, "3 workers", func() bool { return len(liveWorkers(t, n1)) == 3 })
	nodes := []*node{n1, n2, n3}

	// Place an id (the fresh directory's quarantine first), and find its owner.
	testutil.WaitFor(t, 20*time.Second, "an increment", func() bool {
		r, _ := n1.a.Do("POST", "/counters/far/increment", "")
		return r.Code == http.StatusOK
	})
	var owner *node
	testutil.WaitFor(t, 5*time.Second, "the owner", func() bool {
		for _, n := range nodes {
			if getStatus(t, n.a).Runs("/counters", "far") {
				owner = n
				return true
			}
		}
		return false
	})
	// Restart a node that neither owns the id nor leads, so the fleet goes
	// on as it was while it is down.
	var leader string
	for _, m := range members(t, n1) {
		if m.Leader {
			leader = m.ID
		}
	}
	var x *node
	for _, n := range nodes {
		if n != owner && n.id != leader {
			x = n
		}
	}
	if x == nil {
		t.Fatalf("no node other than the owner %s and the leader %s", owner.id, leader)
	}
	x.a.Signal(syscall.SIGKILL)
	if _, err := x.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	x.start(t, false) // returns as soon as its front door listens

	// From its first answer to its readiness: the id is served, or the node
	// says it is starting; never that no worker lives.
	first := true
	testutil.WaitFor(t, 20*time.Second, "the restarted node ready and serving the id", func() bool {
		r, err := x.a.Do("GET", "/counters/far/value", "")
		if err != nil {
			t.Fatalf("GET through the restarted %s: %v", x.id, err)
		}
		switch {
		case r.Code == http.StatusOK:
			if r.Body != `{"value":1}`+"\n" {
				t.Fatalf("GET through the restarted %s: %s, want value 1", x.id, r.Body)
			}
		case r.Code == http.StatusServiceUnavailable && strings.Contains(r.Body, "starting") && r.Header.Get("Retry-After") != "":
			t.Logf("restarted %s: %d %s", x.id, r.Code, strings.TrimSpace(r.Body))
		default:
			t.Fatalf("GET through the restarted %s (first request: %v): %d %s (Retry-After %q), want 200 or 503 \"starting\" + Retry-After",
				x.id, first, r.Code, strings.TrimSpace(r.Body), r.Header.Get("Retry-After"))
		}
		first = false
		ready, _ := x.a.Do("GET", "/readyz", "")
		return r.Code == http.StatusOK && ready.Code == http.StatusOK
	})
}
