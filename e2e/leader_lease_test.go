package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A leader's death at a short lease TTL (3 s) lapses no healthy worker's
// lease: the survivors stay ready, keep their sessions and their ids, and
// no id is placed onto the dead ex-leader, while clients keep asking for
// ids old and new through both survivors.
func TestLeaderDeathLapsesNoLease(t *testing.T) {
	t.Parallel()
	nodes := startFleet(t)
	// The leader dies, whichever node it is (the bootstrap node, unless a
	// slow machine had an election already); n2 and n3 name the survivors.
	var n1, n2, n3 *node
	for _, m := range members(t, nodes[1]) {
		for _, n := range nodes {
			switch {
			case n.id != m.ID:
			case m.Leader:
				n1 = n
			case n2 == nil:
				n2 = n
			default:
				n3 = n
			}
		}
	}
	if n1 == nil || n2 == nil || n3 == nil {
		t.Fatalf("members %q: want three, one leading", memberSummary(members(t, nodes[1])))
	}
	// Load: closed-loop clients on both survivors, each on ids placed
	// before the kill and on a fresh id every other request.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var served, failed atomic.Int64
	var killedAt atomic.Int64 // unix ns, 0 before the kill
	var failMu sync.Mutex
	var failures, ontoDead []string
	for _, n := range []*node{n2, n3} {
		for c := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					id := fmt.Sprintf("%s-c%d-k%d", n.id, c, i%4)
					fresh := i%2 == 1
					if fresh {
						id = fmt.Sprintf("%s-c%d-f%d", n.id, c, i)
					}
					afterKill := killedAt.Load() != 0
					rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
					r, err := testutil.Do(rctx, "POST", n.url()+"/counters/"+id+"/increment", "", nil)
					cancel()
					switch {
					case ctx.Err() != nil:
					case err == nil && r.Code == 200:
						served.Add(1)
					default:
						failed.Add(1)
						failMu.Lock()
						// Placed after the kill, the only owner it could
						// not reach is the dead node.
						if fresh && afterKill && (strings.Contains(r.Body, "owner unreachable") || strings.Contains(r.Body, "owner did not answer")) {
							ontoDead = append(ontoDead, id+": "+strings.TrimSpace(r.Body))
						}
						if len(failures) < 20 {
							failures = append(failures, fmt.Sprintf("%s %s: %d %v %s", n.id, id, r.Code, err, strings.TrimSpace(r.Body)))
						}
						failMu.Unlock()
					}
				}
			}()
		}
	}
	testutil.WaitFor(t, 20*time.Second, "load served", func() bool { return served.Load() >= 60 })

	// Watch the survivors' readiness every 20 ms.
	var unready []string
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		client := &http.Client{Timeout: 2 * time.Second}
		for ctx.Err() == nil {
			for _, n := range []*node{n2, n3} {
				resp, err := client.Get(n.url() + "/readyz")
				if err == nil {
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					unready = append(unready, fmt.Sprintf("%s at %s: %v %v", n.id, time.Now().Format("15:04:05.000"), err, resp != nil && resp.StatusCode == 200))
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	killed := time.Now()
	n1.a.Signal(syscall.SIGKILL)
	killedAt.Store(killed.UnixNano())
	if _, err := n1.a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "a new leader", func() bool {
		h := health(t, n2)
		return h != nil && (h["leader"] == n2.id || h["leader"] == n3.id)
	})
	t.Logf("new leader %.1fs after the kill", time.Since(killed).Seconds())
	// Two TTLs more under load: the renewed leases of n2 and n3 must have
	// been judged more than once by then.
	mark := served.Load()
	testutil.WaitFor(t, 30*time.Second, "load served after the election", func() bool {
		return time.Since(killed) > 8*time.Second && served.Load() > mark+60
	})
	stop()
	wg.Wait()
	<-watchDone
	t.Logf("served %d, failed %d", served.Load(), failed.Load())

	if len(unready) > 0 {
		t.Errorf("survivors went unready %d times after the leader died, e.g. %v", len(unready), unready[:min(5, len(unready))])
	}
	failMu.Lock()
	defer failMu.Unlock()
	if len(ontoDead) > 0 {
		t.Errorf("%d ids first asked for after the kill were placed onto the dead ex-leader, e.g. %v", len(ontoDead), ontoDead[:min(5, len(ontoDead))])
	}
	for _, n := range []*node{n2, n3} {
		for _, line := range strings.Split(n.a.Logs(), "\n") {
			switch {
			case strings.Contains(line, "worker re-registered"), strings.Contains(line, "lease lapsed"):
				t.Errorf("%s's lease lapsed: %s", n.id, line)
			case strings.Contains(line, "took over instance") && !strings.Contains(line, `"previous_node":"`+n1.id+`"`):
				t.Errorf("%s took an id from a live survivor: %s", n.id, line)
			}
		}
	}
	// Requests for ids on the dead node may fail until its lease lapses.
	for _, f := range failures {
		t.Logf("failed: %s", f)
	}
}
