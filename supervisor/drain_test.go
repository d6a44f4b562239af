package supervisor

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	dto "github.com/prometheus/client_model/go"
)

// busy opens a request on /misc/<id> that the plugin holds for a minute,
// and waits until the instance counts it: a busy instance, which a drain
// or wind-down may evict only at its deadline. The returned channel
// receives the request's outcome once it ends.
func busy(t *testing.T, s *Supervisor, srv *httptest.Server, id string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		_, err := testutil.Do(ctx, "GET", srv.URL+"/misc/"+id+"/sleep?ms=60000", "", nil)
		done <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the busy request open on /misc/"+id, func() bool {
		for _, in := range s.Instances() {
			if in.Namespace == "/misc" && in.ID == id && in.Connections == 1 {
				return true
			}
		}
		return false
	})
	return done
}

// streamed opens a stream on /misc/<id>, reads its first event, and
// returns once the stream is over and the instance has no connection.
func streamed(t *testing.T, s *Supervisor, srv *httptest.Server, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/misc/"+id+"/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "the stream on /misc/"+id+" over", func() bool {
		for _, in := range s.Instances() {
			if in.Namespace == "/misc" && in.ID == id {
				return in.Connections == 0
			}
		}
		return false
	})
}

// activateIdle serves one request on ns/id and returns once it ended: an
// idle instance, which a drain or wind-down evicts at once.
func activateIdle(t *testing.T, srv *httptest.Server, ns, id string) {
	t.Helper()
	r, err := testutil.Do(context.Background(), "GET", srv.URL+ns+"/"+id+"/pid", "", nil)
	if err != nil || r.Code != 200 {
		t.Fatalf("activate %s/%s: %v %+v", ns, id, err, r)
	}
}

func evictions(t *testing.T, s *Supervisor, ns, reason string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.evictions.WithLabelValues(ns, reason).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// goneAt polls until ns/id is no longer live and returns when that was
// first seen: never before the eviction began, so a return before a
// deadline proves an early eviction.
func goneAt(t *testing.T, s *Supervisor, ns, id string, within time.Duration) time.Time {
	t.Helper()
	limit := time.Now().Add(within)
	for {
		live := s.Live(ns, id)
		now := time.Now()
		if !live {
			return now
		}
		if now.After(limit) {
			t.Fatalf("%s/%s still live %s later", ns, id, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two drain sources at once: the earlier deadline is the node's, whichever
// was set first; revoking one leaves the other in force.
func TestDrainEarliestOfTwoSourcesWins(t *testing.T) {
	s, _ := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	now := time.Now()
	early, late := now.Add(time.Hour), now.Add(2*time.Hour)
	s.SetDrain(DrainOperator, late, false)
	s.SetDrain(DrainLocal, early, false)
	if on, d := s.Draining(); !on || !d.Equal(early) {
		t.Fatalf("draining %v by %s, want the earlier deadline %s", on, d, early)
	}
	s.SetDrain(DrainLocal, time.Time{}, false) // revoked: the operator's stays
	if on, d := s.Draining(); !on || !d.Equal(late) {
		t.Fatalf("after revoking the local drain: draining %v by %s, want %s", on, d, late)
	}
	// A cordon has no deadline and does not lift the other's.
	s.SetDrain(DrainLocal, time.Time{}, true)
	if on, d := s.Draining(); !on || !d.Equal(late) {
		t.Fatalf("with a cordon beside it: draining %v by %s, want %s", on, d, late)
	}
	s.SetDrain(DrainOperator, time.Time{}, false)
	if on, d := s.Draining(); !on || !d.IsZero() {
		t.Fatalf("cordon only: draining %v by %s, want no deadline", on, d)
	}
	s.SetDrain(DrainLocal, time.Time{}, false)
	if on, _ := s.Draining(); on {
		t.Fatal("still draining with every source revoked")
	}
}

// A drain evicts an idle instance at once and a busy one at the deadline
// in force (the earlier of two sources), not before, cutting its request.
func TestDrainEvictsBusyInstanceAtEarliestDeadline(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	activateIdle(t, srv, "/misc", "idle")
	// The busy instance served a stream before, now ended: streams are
	// counted down as they end, so its plain request alone keeps it.
	streamed(t, s, srv, "busy")
	done := busy(t, s, srv, "busy")

	deadline := time.Now().Add(1500 * time.Millisecond)
	s.SetDrain(DrainOperator, time.Now().Add(time.Minute), false)
	s.SetDrain(DrainLocal, deadline, false)

	evictedAtDeadline(t, s, deadline, done)
	testutil.WaitFor(t, 5*time.Second, "both evictions counted as drain", func() bool {
		return evictions(t, s, "/misc", "drain") == 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.WaitDrained(ctx); err != nil {
		t.Fatalf("drained node not reported drained: %v", err)
	}
}

// An operator's wind-down of a namespace evicts its idle instances at
// once and a busy one at the deadline, not before; other namespaces are
// untouched.
func TestWindDownEvictsBusyInstanceAtDeadline(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc", "/slowstop")
	activateIdle(t, srv, "/misc", "idle")
	activateIdle(t, srv, "/slowstop", "other")
	done := busy(t, s, srv, "busy")

	deadline := time.Now().Add(1500 * time.Millisecond)
	if n := s.WindDown(Key{Namespace: "/misc", ID: ""}, deadline); n != 2 {
		t.Fatalf("wind-down touched %d instances, want 2", n)
	}
	evictedAtDeadline(t, s, deadline, done)
	testutil.WaitFor(t, 5*time.Second, "both evictions counted as operator", func() bool {
		return evictions(t, s, "/misc", "operator") == 2
	})
	if !s.Live("/slowstop", "other") {
		t.Fatal("a wind-down of /misc evicted an instance of /slowstop")
	}
}

// A wind-down of one id touches that instance only, not its namespace.
func TestWindDownOfOneID(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	activateIdle(t, srv, "/misc", "one")
	activateIdle(t, srv, "/misc", "two")
	if n := s.WindDown(Key{Namespace: "/misc", ID: "one"}, time.Now().Add(time.Minute)); n != 1 {
		t.Fatalf("wind-down of /misc/one touched %d instances, want 1", n)
	}
	goneAt(t, s, "/misc", "one", 5*time.Second)
	if !s.Live("/misc", "two") {
		t.Fatal("a wind-down of /misc/one evicted /misc/two")
	}
	if n := s.WindDown(Key{Namespace: "/misc", ID: "absent"}, time.Now().Add(time.Minute)); n != 0 {
		t.Fatalf("wind-down of an id not live here touched %d instances", n)
	}
}

// A busy instance winding down says by when it goes, until the wind-down
// is revoked.
func TestWindingDownShowsItsDeadline(t *testing.T) {
	s, srv := startSupervisor(t, testutil.Bin(t, "testhost"), "/misc")
	busy(t, s, srv, "busy")
	deadlineOf := func() (int64, bool) {
		for _, in := range s.Instances() {
			if in.Namespace == "/misc" && in.ID == "busy" {
				return in.DeadlineMs, true
			}
		}
		return 0, false
	}
	if d, ok := deadlineOf(); !ok || d != 0 {
		t.Fatalf("before a wind-down: deadline %d (live %v)", d, ok)
	}
	deadline := time.Now().Add(time.Minute)
	if n := s.WindDown(Key{Namespace: "/misc", ID: "busy"}, deadline); n != 1 {
		t.Fatalf("wind-down touched %d instances", n)
	}
	if d, ok := deadlineOf(); !ok || d != deadline.UnixMilli() {
		t.Fatalf("winding down: deadline %d (live %v), want %d", d, ok, deadline.UnixMilli())
	}
	s.WindDown(Key{Namespace: "/misc", ID: "busy"}, time.Time{})
	if d, ok := deadlineOf(); !ok || d != 0 {
		t.Fatalf("after the revoke: deadline %d (live %v), want none", d, ok)
	}
}

// evictedAtDeadline checks /misc/idle goes before deadline and /misc/busy
// not before it, its open request (done) ending with it.
func evictedAtDeadline(t *testing.T, s *Supervisor, deadline time.Time, done <-chan error) {
	t.Helper()
	if at := goneAt(t, s, "/misc", "idle", 5*time.Second); !at.Before(deadline) {
		t.Fatalf("idle instance evicted %s after the deadline, want at once", at.Sub(deadline))
	}
	if at := goneAt(t, s, "/misc", "busy", 15*time.Second); at.Before(deadline) {
		t.Fatalf("busy instance evicted %s before its deadline", deadline.Sub(at))
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the busy request still open after its instance was evicted")
	}
}
