package raftstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

func TestSingleNodeBootstrapApplyReopen(t *testing.T) {
	before, _ := goroutines()
	dir := t.TempDir()

	n := startNode(t, "n1", dir, "", true, nil)
	waitLeader(t, n)
	if !n.s.IsLeader() {
		t.Fatal("bootstrapped single node is not leader")
	}
	if n.s.HadExistingState() {
		t.Fatal("fresh directory reported existing state")
	}
	for i, cmd := range []string{"a", "b", "c"} {
		if got, want := mustApply(t, n, cmd), fmt.Sprint(i+1); got != want {
			t.Fatalf("apply %q returned %q, want %q", cmd, got, want)
		}
	}
	if id, api := n.s.Leader(); id != "n1" || api != n.srv.URL {
		t.Fatalf("Leader() = %q %q, want n1 %q", id, api, n.srv.URL)
	}
	applied := n.s.AppliedIndex()
	n.close()
	if err := n.s.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := n.s.Apply(context.Background(), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: %v, want ErrClosed", err)
	}

	// The same command line again: --bootstrap with existing state is a no-op.
	n2 := startNode(t, "n1", dir, "", true, nil)
	if !n2.s.HadExistingState() {
		t.Fatal("reopened directory reported no existing state")
	}
	waitLeader(t, n2)
	// Raft's applied index runs ahead of the state machine (it counts entries
	// handed to it), so the replay is judged by the state itself.
	testutil.WaitForErr(t, 5*time.Second, "log replayed", func() error {
		if got := n2.sm.list(); !slices.Equal(got, []string{"a", "b", "c"}) {
			return fmt.Errorf("state %v", got)
		}
		if got := n2.s.AppliedIndex(); got < applied {
			return fmt.Errorf("applied %d < %d", got, applied)
		}
		return nil
	})
	if got := mustApply(t, n2, "d"); got != "4" {
		t.Fatalf("apply after reopen returned %q, want 4", got)
	}
	if !n2.s.IsLeader() {
		t.Fatal("reopened node is not leader")
	}
	// The new API URL replaced the old one in the replicated metadata.
	testutil.WaitForErr(t, 5*time.Second, "api address updated", func() error {
		if _, api := n2.s.Leader(); api != n2.srv.URL {
			return fmt.Errorf("leader api %q, want %q", api, n2.srv.URL)
		}
		return nil
	})
	n2.close()

	// Everything Open started is gone after Close.
	testutil.WaitForErr(t, 5*time.Second, "no goroutine leak", func() error {
		if now, _ := goroutines(); now > before {
			return fmt.Errorf("%d goroutines, %d before", now, before)
		}
		return nil
	})
}

func TestOpenValidatesConfig(t *testing.T) {
	_, err := Open(context.Background(), Config{NodeID: "x", DataDir: t.TempDir(), RaftAddr: "127.0.0.1:0"}, &listSM{})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("missing APIAddr: %v, want ErrInvalidConfig", err)
	}
	_, err = Open(context.Background(), Config{NodeID: "x", DataDir: t.TempDir(), RaftAddr: "0.0.0.0:0", APIAddr: "http://x"}, &listSM{})
	if err == nil {
		t.Fatal("wildcard bind without AdvertiseRaftAddr was accepted")
	}
}

func TestClusterJoinForwardLeave(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	if !n1.s.IsLeader() {
		t.Fatal("bootstrap node lost leadership during joins")
	}
	testutil.WaitForErr(t, 5*time.Second, "3 voters with api addresses", func() error {
		ms := membersByID(t, n2) // a follower's view
		for _, n := range nodes {
			m, ok := ms[n.id]
			if !ok || !m.Voter || m.APIAddr != n.srv.URL || m.RaftAddr != n.s.RaftAddr() {
				return fmt.Errorf("member %s = %+v", n.id, m)
			}
		}
		if len(ms) != 3 || !ms["n1"].Leader {
			return fmt.Errorf("members %+v", ms)
		}
		return nil
	})

	// A write on a follower is forwarded and its result comes back.
	if got := mustApply(t, n3, "from-n3"); got != "1" {
		t.Fatalf("forwarded apply returned %q", got)
	}
	if got := mustApply(t, n1, "from-n1"); got != "2" {
		t.Fatalf("leader apply returned %q", got)
	}
	converged(t, nodes, []string{"from-n3", "from-n1"})

	// A fourth node joins through a follower's handler and becomes a nonvoter.
	n4 := startNode(t, "n4", t.TempDir(), "", false, nil)
	join(t, n2.srv.URL, n4) // via a follower
	ms := membersByID(t, n1)
	if m := ms["n4"]; m.Voter || m.RaftAddr != n4.s.RaftAddr() || m.APIAddr != n4.srv.URL {
		t.Fatalf("n4 = %+v, want a nonvoter with addresses", m)
	}
	converged(t, []*testNode{n4}, []string{"from-n3", "from-n1"})

	// Re-joining an existing member writes nothing to the log. (A new term appends its own
	// entries, so a leadership change in between — a loaded machine — voids the comparison and
	// the check runs again. So does a new leader's barrier, which its leader loop appends a
	// little after the election: one of ours first puts it behind us.)
	for attempt := 0; ; attempt++ {
		leader := leaderOf(t, nodes)
		if err := leader.s.Barrier(ctxTimeout(t, 10*time.Second)); err != nil {
			if attempt == 5 {
				t.Fatalf("barrier on the leader: %v", err)
			}
			continue
		}
		term, lastIndex := leader.s.raft.CurrentTerm(), leader.s.raft.LastIndex()
		if err := JoinVia(ctxTimeout(t, 10*time.Second), nil, n3.srv.URL, "secret", "n2", n2.s.RaftAddr(), n2.srv.URL); err != nil {
			t.Fatalf("re-join n2: %v", err)
		}
		if leader.s.raft.CurrentTerm() != term || !leader.s.IsLeader() {
			if attempt == 5 {
				t.Fatal("leadership keeps changing")
			}
			continue
		}
		if got := leader.s.raft.LastIndex(); got != lastIndex {
			t.Fatalf("re-join wrote to the log: last index %d -> %d", lastIndex, got)
		}
		break
	}

	// Wrong token: 401, nothing changes.
	err := JoinVia(ctxTimeout(t, 5*time.Second), nil, n1.srv.URL, "wrong", "n9", "127.0.0.1:1", "")
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("join with bad token: %v, want ErrUnauthorized", err)
	}
	// Malformed input: 400.
	resp, err := http.Post(n1.srv.URL+"/_raft/join", "application/json", strings.NewReader(`{"id":`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unauthenticated join: HTTP %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, n1.srv.URL+"/_raft/join", strings.NewReader(`{"id":`))
	req.Header.Set("Authorization", "Bearer secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed join: HTTP %d, want 400", resp.StatusCode)
	}

	// A follower leaves: membership shrinks everywhere.
	if err := n4.s.Leave(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("n4 leave: %v", err)
	}
	n4.close()
	testutil.WaitForErr(t, 5*time.Second, "n4 gone", func() error {
		if ms := membersByID(t, n2); len(ms) != 3 {
			return fmt.Errorf("members %v", ms)
		}
		return nil
	})

	// The leader leaves: leadership moves first, then it is removed.
	if err := n1.s.Leave(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("leader leave: %v", err)
	}
	if n1.s.IsLeader() {
		t.Fatal("n1 still leader after leaving")
	}
	n1.close()
	rest := []*testNode{n2, n3}
	leader := leaderOf(t, rest)
	testutil.WaitForErr(t, 5*time.Second, "n1 gone", func() error {
		ms := membersByID(t, leader)
		if _, ok := ms["n1"]; ok || len(ms) != 2 {
			return fmt.Errorf("members %v", ms)
		}
		return nil
	})
	follower := n2
	if leader == n2 {
		follower = n3
	}
	waitLeader(t, follower)
	if got := mustApply(t, follower, "after-leave"); got != "3" {
		t.Fatalf("apply after leader left returned %q", got)
	}
	converged(t, rest, []string{"from-n3", "from-n1", "after-leave"})
}

func TestLeaderKilledFailoverAndRestart(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	var want []string
	for i := range 5 {
		cmd := fmt.Sprintf("e%d", i)
		mustApply(t, nodes[i%3], cmd)
		want = append(want, cmd)
	}
	converged(t, nodes, want)

	old := leaderOf(t, nodes)
	oldAddr := old.s.RaftAddr()
	old.kill()
	var rest []*testNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	start := time.Now()
	leader := leaderOf(t, rest)
	t.Logf("new leader %s after %v", leader.id, time.Since(start))
	for _, n := range rest {
		testutil.WaitForErr(t, 10*time.Second, "followers see the new leader", func() error {
			if id, api := n.s.Leader(); id != leader.id || api == "" {
				return fmt.Errorf("%s sees leader %q %q", n.id, id, api)
			}
			return nil
		})
	}
	converged(t, rest, want)
	for _, n := range rest {
		mustApply(t, n, "after-"+n.id)
		want = append(want, "after-"+n.id)
	}

	// Restart the killed node from its data directory with the same command line.
	back := startNode(t, old.id, old.dir, oldAddr, old.cfg.Bootstrap, nil)
	if !back.s.HadExistingState() {
		t.Fatal("restarted node has no state")
	}
	all := append(rest, back)
	converged(t, all, want)
	testutil.WaitForErr(t, 10*time.Second, "same applied index", func() error {
		li := leader.s.AppliedIndex()
		if bi := back.s.AppliedIndex(); bi != li {
			return fmt.Errorf("restarted node applied %d, leader %d", bi, li)
		}
		return nil
	})
	// It recorded its new API URL, and a write through it is forwarded.
	testutil.WaitForErr(t, 10*time.Second, "new api address recorded", func() error {
		if m := membersByID(t, leader)[back.id]; m.APIAddr != back.srv.URL || !m.Voter {
			return fmt.Errorf("member %+v, want api %s", m, back.srv.URL)
		}
		return nil
	})
	waitLeader(t, back)
	mustApply(t, back, "via-restarted")
	want = append(want, "via-restarted")
	converged(t, all, want)
}

func TestSnapshotRestoreOnRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, "n1", dir, "", true, nil)
	waitLeader(t, n)
	for i := range 40 {
		mustApply(t, n, fmt.Sprintf("s%d", i))
	}
	// A removal's membership fence, as removeServer records it.
	if _, err := n.s.applyLocal(ctxTimeout(t, 10*time.Second), encodeMeta(metaCommand{Op: metaFence, ID: "gone"})); err != nil {
		t.Fatal(err)
	}
	fence := n.s.fsm.membershipFence()
	if fence == 0 {
		t.Fatal("the fence entry set no fence")
	}
	if err := n.s.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for i := range 3 {
		mustApply(t, n, fmt.Sprintf("t%d", i))
	}
	want := n.sm.list()
	n.close()

	back := startNode(t, "n1", dir, "", true, nil)
	if back.sm.restoreCount() != 1 {
		t.Fatalf("state machine restored %d times at open, want 1", back.sm.restoreCount())
	}
	// Member metadata came back with the snapshot, before any new entry.
	if api := back.s.fsm.apiAddr("n1"); api == "" {
		t.Fatal("member metadata missing after restore")
	}
	if got := back.s.fsm.membershipFence(); got != fence {
		t.Fatalf("membership fence %d after restore, want %d", got, fence)
	}
	waitLeader(t, back)
	testutil.WaitForErr(t, 5*time.Second, "state restored", func() error {
		if got := back.sm.list(); !slices.Equal(got, want) {
			return fmt.Errorf("got %d entries, want %d", len(got), len(want))
		}
		return nil
	})
}

func TestSnapshotInstallOnJoin(t *testing.T) {
	// The WAL compacts whole segments: small ones, and entries that fill a
	// few, so the compacted prefix is really gone.
	for _, format := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(format, func(t *testing.T) {
			small := func(c *Config) {
				c.TrailingLogs = 5
				c.SnapshotThreshold = 10
				c.LogStore = format
				c.WALSegmentSize = 16 << 10
			}
			nodes := newCluster(t, 1, small)
			n1 := nodes[0]
			var want []string
			for i := range 30 {
				cmd := fmt.Sprintf("x%d-%s", i, strings.Repeat("p", 2000))
				mustApply(t, n1, cmd)
				want = append(want, cmd)
			}
			if err := n1.s.raft.Snapshot().Error(); err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			// Log compaction keeps only TrailingLogs entries (the WAL: the
			// segments holding them), so a new member needs the snapshot.
			n2 := startNode(t, "n2", t.TempDir(), "", false, small)
			join(t, n1.srv.URL, n2)
			converged(t, []*testNode{n2}, want)
			if n2.sm.restoreCount() == 0 {
				t.Fatal("follower caught up without installing a snapshot")
			}
			waitLeader(t, n2)
			if got := mustApply(t, n2, "y"); got != "31" {
				t.Fatalf("apply via follower after snapshot install returned %q", got)
			}
		})
	}
}

func TestRunAsLeader(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	var mu sync.Mutex
	running := map[string]int{}
	cancelled := map[string]int{}
	register := func(n *testNode) {
		n.s.RunAsLeader("probe", func(ctx context.Context) {
			mu.Lock()
			running[n.id]++
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			running[n.id]--
			cancelled[n.id]++
			mu.Unlock()
		})
	}
	// Registered while already leading (n1) and on followers: both paths.
	for _, n := range nodes {
		register(n)
	}
	runningOn := func() ([]string, int) {
		mu.Lock()
		defer mu.Unlock()
		var on []string
		total := 0
		for id, c := range running {
			total += c
			if c > 0 {
				on = append(on, id)
			}
		}
		return on, total
	}
	leader := leaderOf(t, nodes)
	testutil.WaitForErr(t, 5*time.Second, "leader work on the leader only", func() error {
		if on, total := runningOn(); total != 1 || on[0] != leader.id {
			return fmt.Errorf("running on %v (total %d), leader %s", on, total, leader.id)
		}
		return nil
	})

	// Move leadership: the old leader's work is cancelled, the new leader's starts.
	if err := leader.s.raft.LeadershipTransfer().Error(); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	testutil.WaitForErr(t, 5*time.Second, "old leader's work cancelled", func() error {
		mu.Lock()
		defer mu.Unlock()
		if cancelled[leader.id] < 1 || running[leader.id] != 0 {
			return fmt.Errorf("old leader %s: running %d cancelled %d", leader.id, running[leader.id], cancelled[leader.id])
		}
		return nil
	})
	newLeader := leaderOf(t, nodes)
	if newLeader == leader {
		t.Fatal("leadership did not move")
	}
	testutil.WaitForErr(t, 5*time.Second, "leader work on the new leader only", func() error {
		if on, total := runningOn(); total != 1 || on[0] != newLeader.id {
			return fmt.Errorf("running on %v (total %d), leader %s", on, total, newLeader.id)
		}
		return nil
	})

	// Close stops leader work too.
	newLeader.close()
	testutil.WaitForErr(t, 5*time.Second, "closed leader's work cancelled", func() error {
		mu.Lock()
		defer mu.Unlock()
		if running[newLeader.id] != 0 {
			return fmt.Errorf("still running on %s", newLeader.id)
		}
		return nil
	})
}

func TestApplyOutcomeErrors(t *testing.T) {
	// A follower that cannot reach any leader gives up with ErrNoLeader when ctx ends.
	n := startNode(t, "lonely", t.TempDir(), "", false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := n.s.Apply(ctx, []byte("x"))
	if !errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("apply without leader: %v", err)
	}
	if err := n.s.Barrier(ctxTimeout(t, time.Second)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("barrier on follower: %v, want ErrNotLeader", err)
	}

	// A forwarded request that reaches a non-leader is refused as not started, not retried there.
	_, err = doRPC(ctxTimeout(t, 5*time.Second), nil, n.srv.URL, bearer("secret"), http.MethodPost, "apply", "", []byte("x"), true)
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("forwarded apply on non-leader: %v, want ErrNotLeader", err)
	}

	// A leader whose HTTP address refuses connections: not started, so retryable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	_, err = doRPC(ctxTimeout(t, 5*time.Second), nil, dead, rpcAuth{}, http.MethodPost, "apply", "", []byte("x"), true)
	if !errors.Is(err, ErrNoLeader) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("dial failure: %v, want ErrNoLeader", err)
	}

	// Leaving as the only voter is refused.
	solo := startNode(t, "solo", t.TempDir(), "", true, nil)
	waitLeader(t, solo)
	if err := solo.s.Leave(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrLastVoter) {
		t.Fatalf("last voter leave: %v, want ErrLastVoter", err)
	}
	var calls atomic.Int32
	solo.s.RunAsLeader("late", func(ctx context.Context) { calls.Add(1) })
	testutil.WaitForErr(t, 5*time.Second, "late registration runs", func() error {
		if calls.Load() != 1 {
			return fmt.Errorf("ran %d times", calls.Load())
		}
		return nil
	})
}

func TestRemoveDeadMember(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	leader := leaderOf(t, nodes)
	var dead, asker *testNode
	for _, n := range nodes {
		if n != leader {
			if dead == nil {
				dead = n
			} else {
				asker = n
			}
		}
	}
	dead.kill()
	// The operator asks a follower; it forwards to the leader.
	ctx := ctxTimeout(t, 10*time.Second)
	if err := RemoveVia(ctx, nil, asker.srv.URL, "secret", dead.id); err != nil {
		t.Fatalf("remove %s: %v", dead.id, err)
	}
	// Removing it again names the member as unknown rather than reporting a
	// removal that did nothing (so does a typo'd id).
	for _, id := range []string{dead.id, "nosuchnode"} {
		if err := RemoveVia(ctx, nil, asker.srv.URL, "secret", id); !errors.Is(err, ErrUnknownMember) {
			t.Fatalf("remove %s (not a member): %v, want ErrUnknownMember", id, err)
		}
	}
	testutil.WaitForErr(t, 5*time.Second, "dead member gone everywhere", func() error {
		ms, err := MembersVia(ctx, nil, asker.srv.URL, "secret")
		if err != nil {
			return err
		}
		if len(ms) != 2 || asker.s.fsm.apiAddr(dead.id) != "" {
			return fmt.Errorf("members %+v", ms)
		}
		return nil
	})
	// Two voters left; writes still commit and the last voter cannot be removed.
	mustApply(t, asker, "after-remove")
	if err := RemoveVia(ctx, nil, leader.srv.URL, "secret", asker.id); err != nil {
		t.Fatalf("remove %s: %v", asker.id, err)
	}
	err := asker.s.Remove(ctx, leader.id)
	if err == nil {
		t.Fatal("removing the last voter succeeded")
	}
	if !errors.Is(err, ErrLastVoter) && !errors.Is(err, ErrNoLeader) && !errors.Is(err, ErrClosed) {
		t.Fatalf("remove the last voter via a removed node: %v", err)
	}
	if err := leader.s.Remove(ctx, leader.id); !errors.Is(err, ErrLastVoter) {
		t.Fatalf("leader removing itself as last voter: %v, want ErrLastVoter", err)
	}
}

func TestCloseUnderLoadLeaksNothing(t *testing.T) {
	before, droppedBefore := goroutines()
	n := startNode(t, "n1", t.TempDir(), "", true, nil)
	waitLeader(t, n)
	const writers = 32
	ctx := ctxTimeout(t, time.Minute) // longer than the test's deadlines below: Close ends the writes
	var wg sync.WaitGroup
	var applied atomic.Int64
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := n.s.Apply(ctx, []byte("x"))
				if err != nil {
					// Closing mid-flight: either nothing started or the outcome is unknown.
					if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, ErrNotLeader) {
						t.Errorf("apply during close: %v", err)
					}
					if ctx.Err() != nil {
						t.Errorf("an apply waited for its context, not for Close: %v", err)
					}
					return
				}
				applied.Add(1)
			}
		}()
	}
	testutil.WaitForErr(t, 10*time.Second, "writes flowing", func() error {
		if applied.Load() < 100 {
			return fmt.Errorf("%d applied", applied.Load())
		}
		return nil
	})
	n.close()
	wg.Wait()
	testutil.WaitForErr(t, 5*time.Second, "no goroutine leak", func() error {
		now, dropped := goroutines()
		dropped -= droppedBefore
		if now > before {
			return fmt.Errorf("%d goroutines, %d before", now, before)
		}
		// Raft drops at most what was in flight: each writer's entry, the barrier, the registrar's.
		if dropped > writers+2 {
			return fmt.Errorf("%d goroutines wait on futures raft dropped; at most %d were in flight", dropped, writers+2)
		}
		if dropped > 0 {
			t.Logf("raft dropped %d futures at shutdown", dropped)
		}
		return nil
	})
}

// An apply forwarded to a leader that then goes silent (cut off: the request
// gets no answer, not even an error) ends with an unknown outcome as soon as
// the follower sees another leader, instead of at its timeout.
func TestForwardToSilencedLeaderEndsOnLeaderChange(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	leader := leaderOf(t, nodes)
	follower := followerOf(nodes, leader)
	swallowed := make(chan struct{}, 1)
	var silent http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only after the body
		select {
		case swallowed <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	})
	leader.handler.Store(&silent)

	ctx := ctxTimeout(t, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := follower.s.Apply(ctx, []byte("into-the-silence"))
		done <- err
	}()
	select {
	case <-swallowed:
	case err := <-done:
		t.Fatalf("apply answered before reaching the leader: %v", err)
	case <-ctx.Done():
		t.Fatal("the follower never forwarded to the leader")
	}
	// Its raft stops, its HTTP side stays silent; the followers elect another leader.
	if err := leader.s.shutdown(ctx, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrLeaderChanged) {
			t.Fatalf("apply forwarded to the silenced leader: %v, want ErrOutcomeUnknown caused by ErrLeaderChanged", err)
		}
	case <-ctx.Done():
		t.Fatal("the forwarded apply waited out the silence")
	}
	// The entry never reached the log: the next apply commits on the new leader alone.
	mustApply(t, follower, "after")
}

// A leader whose replication is stuck on a peer that accepts connections
// and never answers: Close gives up on raft when its context ends (and the
// transport's close did not help within 2 s) instead of waiting for the
// transport's I/O deadline, here a minute.
func TestCloseBoundedWhenRaftIsStuck(t *testing.T) {
	nodes := newCluster(t, 3, func(c *Config) { c.TransportTimeout = time.Minute })
	leader := leaderOf(t, nodes)
	silent := followerOf(nodes, leader)
	addr := silent.s.RaftAddr()
	silent.kill()
	// The dead follower's raft address now takes connections and says nothing.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		// Unblocks raft's stuck RPCs, so its goroutines end with the test.
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	testutil.WaitForErr(t, 10*time.Second, "the leader's replication reaches the silent peer", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(held) == 0 {
			return errors.New("no connection yet")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	leader.closeErr = ErrShutdownStuck
	if err := leader.s.shutdown(ctx, false); !errors.Is(err, ErrShutdownStuck) {
		t.Fatalf("close with raft stuck on a silent peer: %v after %v, want ErrShutdownStuck", err, time.Since(start))
	}
}

// Raft's FSM goroutine returns on shutdown without answering the entries already queued to it,
// so a barrier or an apply committed just before Close is never answered. The leader loop waits
// for its barrier only until Close begins, and an Apply until Close has stopped raft: when the
// leader loop waited for the answer, Close waited for it for ever (a CI run hung for 20
// minutes). Each round queues the leader loop's barrier and an Apply behind a replayed entry the
// state machine holds, shuts raft down, then releases the entry; raft drops what is queued in
// about half the rounds.
func TestCloseEndsWhenRaftDropsQueuedEntries(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, "n1", dir, "", true, nil)
	waitLeader(t, n)
	mustApply(t, n, "held")
	n.close()
	committed := func(n *testNode) error {
		if st := n.s.Stats(); st["commit_index"] != st["last_log_index"] {
			return fmt.Errorf("commit index %s, last log index %s", st["commit_index"], st["last_log_index"])
		}
		return nil
	}
	for round := range 8 {
		hold := make(chan struct{})
		n := startNodeSM(t, "n1", dir, "", true, nil, &listSM{holdCmd: "held", hold: hold})
		testutil.WaitForErr(t, 10*time.Second, "the leader's barrier committed behind the held entry", func() error {
			if !testutil.GoroutineWith("raftstore.(*leadership).leaderBarrier") {
				return errors.New("the leader loop is not waiting for a barrier")
			}
			return committed(n)
		})
		// Longer than the deadlines below: the apply must end with Close, not with its context.
		actx := ctxTimeout(t, time.Minute)
		applied := make(chan error, 1)
		go func() {
			_, err := n.s.Apply(actx, []byte("queued"))
			applied <- err
		}()
		testutil.WaitForErr(t, 10*time.Second, "the apply committed behind the held entry", func() error {
			// This test's apply, not the registrar's (the API address is new each round).
			if !testutil.GoroutineWith("raftstore.(*preamble).applyUser", "raftstore.(*Store).await", "TestCloseEndsWhenRaftDropsQueuedEntries") {
				return errors.New("the apply is not waiting for raft")
			}
			return committed(n)
		})
		closed := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			closed <- n.s.Close(ctx)
		}()
		testutil.WaitForErr(t, 10*time.Second, "raft shutting down", func() error {
			if st := n.s.raft.State(); st != raft.Shutdown {
				return fmt.Errorf("raft is %v", st)
			}
			return nil
		})
		close(hold)
		select {
		case err := <-closed:
			if err != nil {
				t.Fatalf("round %d: close: %v", round, err)
			}
		case <-time.After(20 * time.Second):
			n.abandoned = true // the cleanup's Close would wait behind this one for ever
			t.Fatalf("round %d: Close did not return: the leader loop still waits for its barrier", round)
		}
		select {
		case err := <-applied:
			// Applied before raft stopped, or dropped: either way not left to its deadline.
			if err != nil && (!errors.Is(err, ErrOutcomeUnknown) || actx.Err() != nil) {
				t.Fatalf("round %d: apply queued at Close: %v", round, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: an apply queued at Close still waits after Close returned", round)
		}
	}
}

// goroutines counts the running goroutines, leaving out those parked on a future raft dropped
// when it shut down (see Store.await): raft never answers those, so they stay until the process
// exits. dropped is how many it left out.
func goroutines() (n, dropped int) {
	for _, g := range testutil.Goroutines() {
		if strings.Contains(g, "raft.(*deferError).Error") && strings.Contains(g, "raftstore.(*Store).await.func") {
			dropped++
			continue
		}
		n++
	}
	return n, dropped
}

// A follower's Apply reaches the leader's ForwardedFunc, which commits it with ApplyLocal and
// answers for it; the leader's own Apply does not pass through it. A not-started refusal from
// it is retried by the follower, a bad request is not. ApplyLocal on a follower starts nothing
// and forwards nothing; SetForwarded(nil) restores plain ApplyLocal.
func TestForwardedApply(t *testing.T) {
	nodes := newCluster(t, 2, nil)
	leader := leaderOf(t, nodes)
	follower := followerOf(nodes, leader)

	var calls atomic.Int32
	leader.s.SetForwarded(func(ctx context.Context, cmd []byte) ([]byte, error) {
		n := calls.Add(1)
		switch string(cmd) {
		case "refused-once":
			if n == 1 {
				return nil, fmt.Errorf("not yet: %w", ErrNotLeader)
			}
		case "malformed":
			return nil, fmt.Errorf("%w: not a command", ErrBadRequest)
		}
		res, err := leader.s.ApplyLocal(ctx, cmd)
		return append([]byte("via-hook:"), res...), err
	})

	if got := mustApply(t, leader, "own"); got != "1" || calls.Load() != 0 {
		t.Fatalf("the leader's own apply: %q, %d hook calls; want 1 and none", got, calls.Load())
	}
	if got := mustApply(t, follower, "forwarded"); got != "via-hook:2" || calls.Load() != 1 {
		t.Fatalf("forwarded apply: %q, %d hook calls; want via-hook:2 and one", got, calls.Load())
	}
	calls.Store(0)
	if got := mustApply(t, follower, "refused-once"); got != "via-hook:3" || calls.Load() != 2 {
		t.Fatalf("apply refused once as not started: %q, %d hook calls; want via-hook:3 after a retry", got, calls.Load())
	}
	calls.Store(0)
	if _, err := follower.s.Apply(ctxTimeout(t, 5*time.Second), []byte("malformed")); !errors.Is(err, ErrBadRequest) || calls.Load() != 1 {
		t.Fatalf("apply the hook refuses as malformed: %v after %d calls, want ErrBadRequest after one", err, calls.Load())
	}

	if _, err := follower.s.ApplyLocal(ctxTimeout(t, 5*time.Second), []byte("not-here")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ApplyLocal on a follower: %v, want ErrNotLeader", err)
	}
	// An apply sent to a follower, even unmarked, is not passed on to the leader.
	calls.Store(0)
	if _, err := doRPC(ctxTimeout(t, 5*time.Second), nil, follower.srv.URL, bearer("secret"), http.MethodPost, "apply", "", []byte("not-here"), false); !errors.Is(err, ErrNotLeader) || calls.Load() != 0 {
		t.Fatalf("unmarked apply sent to a follower: %v after %d hook calls, want ErrNotLeader and none", err, calls.Load())
	}
	if got, err := leader.s.ApplyLocal(ctxTimeout(t, 5*time.Second), []byte("here")); err != nil || string(got) != "4" {
		t.Fatalf("ApplyLocal on the leader: %q, %v; want 4", got, err)
	}

	leader.s.SetForwarded(nil)
	if got := mustApply(t, follower, "plain"); got != "5" {
		t.Fatalf("forwarded apply without a hook: %q, want 5", got)
	}
	converged(t, nodes, []string{"own", "forwarded", "refused-once", "here", "plain"})
}

// A node restarted on its data dir after leaving knows it is no member
// (Removed, with the members to join through), whatever its own log last
// saw; joining again clears it.
func TestRemovedAfterLeaveUntilJoined(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	n3 := nodes[2]
	if removed, _, err := n3.s.Removed(ctxTimeout(t, 5*time.Second)); err != nil || removed {
		t.Fatalf("a member reports removed=%v (%v)", removed, err)
	}
	// The leave records the members as n3 knows them: once it applied their addresses (a
	// node that leaves while still catching up records the ones it has).
	testutil.WaitFor(t, 10*time.Second, "n3 knows every member's address", func() bool {
		ms := membersByID(t, n3)
		return ms["n1"].APIAddr != "" && ms["n2"].APIAddr != ""
	})
	if err := n3.s.Leave(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("leave: %v", err)
	}
	raftAddr := n3.s.RaftAddr()
	n3.close()
	again := startNode(t, "n3", n3.dir, raftAddr, false, nil)
	removed, others, err := again.s.Removed(ctxTimeout(t, 5*time.Second))
	if err != nil || !removed {
		t.Fatalf("restarted after leave: removed=%v (%v)", removed, err)
	}
	var ids []string
	for _, m := range others {
		ids = append(ids, m.ID+"="+m.APIAddr)
	}
	if want := []string{"n1=" + nodes[0].srv.URL, "n2=" + nodes[1].srv.URL}; !slices.Equal(ids, want) {
		t.Fatalf("members to join through: %v, want %v", ids, want)
	}
	if err := again.s.JoinCluster(ctxTimeout(t, 10*time.Second), http.DefaultClient, nodes[0].srv.URL); err != nil {
		t.Fatalf("join again: %v", err)
	}
	testutil.WaitForErr(t, 10*time.Second, "a member again", func() error {
		if removed, _, err := again.s.Removed(ctxTimeout(t, 5*time.Second)); err != nil || removed {
			return fmt.Errorf("removed=%v (%v)", removed, err)
		}
		return nil
	})
}
