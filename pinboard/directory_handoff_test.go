package pinboard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// claim places /b/<id> on the bench cluster's worker w1, now.
func claim(id string) directory.Claim {
	return directory.Claim{Key: directory.Key{Namespace: "/b", ID: id}, ClientID: "w1", Now: time.Now().UnixMilli()}
}

// roles waits for the cluster to have a leader and returns it and a
// follower. Leadership may move later (three nodes on two loaded cores
// hold elections): the tests below count on no particular node leading.
func roles(t *testing.T, nodes []*benchNode) (leader, follower *benchNode) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "a leader", func() bool {
		leader, follower = nil, nil
		for _, n := range nodes {
			if n.store.IsLeader() {
				leader = n
			} else if follower == nil {
				follower = n
			}
		}
		return leader != nil && follower != nil
	})
	return leader, follower
}

// mergedIn counts the commands of followers' batches the nodes but one
// queued with their own.
func mergedIn(nodes []*benchNode, but *benchNode) int64 {
	var n int64
	for _, nd := range nodes {
		if nd != but {
			n += nd.dir.mergedIn.Load()
		}
	}
	return n
}

// placed reports whether /b/<id> is placed in n's replica.
func placed(n *benchNode, id string) bool {
	_, ok := n.dir.Machine().Placement(directory.Key{Namespace: "/b", ID: id})
	return ok
}

// A follower's flushes, even of one command, reach the leader's group
// commit through raftstore's forwarding, its DoNow the leader's log as it
// is; the leader answers each forwarded entry in the shape the machine
// answers it; a forwarded command is never passed on again (a node that
// does not lead refuses it as not started); bad entries are refused
// without touching the directory.
func TestDirectoryHandOff(t *testing.T) {
	nodes := startBenchCluster(t, 3)
	_, follower := roles(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	res, err := follower.dir.Do(ctx, claim("via-follower"))
	if err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("claim through a follower: %v %v %s", err, res.Code, res.Reason)
	}
	// Counted over every node but the follower: whichever leads took them.
	if got := mergedIn(nodes, follower); got != 1 {
		t.Fatalf("the leader queued %d commands of the follower's flush, want 1", got)
	}
	batch := []*pending{
		{ctx: ctx, cmd: claim("batch-1"), done: make(chan outcome, 1)},
		{ctx: ctx, cmd: claim("batch-2"), done: make(chan outcome, 1)},
	}
	follower.dir.flush(batch)
	for i, p := range batch {
		if o := <-p.done; o.err != nil || o.res.Code != directory.CodeGranted {
			t.Fatalf("claim %d of a follower's batch: %v %v %s", i, o.err, o.res.Code, o.res.Reason)
		}
	}
	if got := mergedIn(nodes, follower); got != 3 {
		t.Fatalf("the leader queued %d commands of the follower's flushes, want 3", got)
	}
	if res, err := follower.dir.DoNow(ctx, claim("now")); err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("DoNow through a follower: %v %v %s", err, res.Code, res.Reason)
	}
	if got := mergedIn(nodes, follower); got != 3 {
		t.Fatalf("a follower's DoNow was queued on the leader (%d merged, want still 3), not its own entry", got)
	}
	if got := follower.dir.mergedIn.Load(); got != 0 {
		t.Fatalf("the follower queued %d forwarded commands, want 0", got)
	}

	// An entry forwarded to the follower itself (as to a node a stale
	// follower believed led) is refused as not started, not passed on to
	// the leader.
	_, err = follower.dir.takeForwarded(ctx, directory.Encode(directory.Batch{Commands: []directory.Command{claim("forwarded-to-follower")}}))
	if !errors.Is(err, raftstore.ErrNotLeader) || errors.Is(err, raftstore.ErrOutcomeUnknown) {
		t.Fatalf("batch forwarded to the follower: %v, want ErrNotLeader", err)
	}
	if got := mergedIn(nodes, follower); got != 3 {
		t.Fatalf("a forwarded batch was passed on: the other nodes took %d commands, want still 3", got)
	}
	// Its own command flushed with a forwarded one still reaches the
	// leader; only the forwarded one goes back.
	mine := &pending{ctx: ctx, cmd: claim("own-beside-forwarded"), done: make(chan outcome, 1)}
	theirs := &pending{ctx: ctx, cmd: claim("forwarded-beside-own"), done: make(chan outcome, 1), forwarded: true}
	follower.dir.flush([]*pending{theirs, mine})
	if o := <-theirs.done; !errors.Is(o.err, raftstore.ErrNotLeader) {
		t.Fatalf("forwarded command flushed on the follower: %v, want ErrNotLeader", o.err)
	}
	if o := <-mine.done; o.err != nil || o.res.Code != directory.CodeGranted {
		t.Fatalf("own command flushed beside a forwarded one: %v %v %s", o.err, o.res.Code, o.res.Reason)
	}

	// Placements read on the leader: a claim is applied there before it is
	// answered, so nothing still in flight moves the count.
	leader, _ := roles(t, nodes)
	for _, id := range []string{"forwarded-to-follower", "forwarded-beside-own"} {
		if placed(leader, id) {
			t.Fatalf("%s was placed: a command refused as not started was applied", id)
		}
	}

	// A lone forwarded command is its own entry, answered as itself; a
	// batch gets one result per command, a command the machine refuses as
	// CodeError in its slot.
	before := leader.dir.mergedIn.Load()
	out, err := leader.dir.takeForwarded(ctx, directory.Encode(claim("lone")))
	if err != nil {
		t.Fatalf("lone command forwarded to the leader: %v", err)
	}
	if r, err := directory.DecodeResult(out); err != nil || r.Code != directory.CodeGranted || len(r.Results) != 0 {
		t.Fatalf("lone command answered %+v, %v; want its own Granted result", r, err)
	}
	if got := leader.dir.mergedIn.Load(); got != before {
		t.Fatalf("a lone forwarded command was queued (%d merged, %d before)", got, before)
	}
	out, err = leader.dir.takeForwarded(ctx, directory.Encode(directory.Batch{Commands: []directory.Command{
		claim("in-batch"), directory.Opaque{Code: 0x70},
	}}))
	if err != nil {
		t.Fatalf("batch forwarded to the leader: %v", err)
	}
	r, err := directory.DecodeResult(out)
	if err != nil || r.Code != directory.CodeOK || len(r.Results) != 2 ||
		r.Results[0].Code != directory.CodeGranted || r.Results[1].Code != directory.CodeError || r.Results[1].Reason == "" {
		t.Fatalf("batch answered %+v, %v; want Granted, then CodeError with a reason", r, err)
	}

	_, placements := leader.dir.Machine().Len()
	tooMany := make([]directory.Command, MaxBatch+1)
	for i := range tooMany {
		tooMany[i] = claim("too-many")
	}
	for name, body := range map[string][]byte{
		"garbage":        []byte("not a command"),
		"empty batch":    directory.Encode(directory.Batch{}),
		"nested batch":   directory.Encode(directory.Batch{Commands: []directory.Command{claim("n1"), directory.Batch{}}}),
		"too many":       directory.Encode(directory.Batch{Commands: tooMany}),
		"unknown format": {0xfe, 0x01},
	} {
		if _, err := leader.dir.takeForwarded(ctx, body); !errors.Is(err, raftstore.ErrBadRequest) {
			t.Errorf("%s: %v, want ErrBadRequest", name, err)
		}
	}
	if _, after := leader.dir.Machine().Len(); after != placements {
		t.Fatalf("refused entries changed the directory: %d placements, %d before", after, placements)
	}
}

// A claim forwarded to a leader that then goes silent (cut off: no answer,
// not even an error) ends as soon as the follower sees another leader, not
// at the batch timeout; the follower's next batch reaches the new leader.
func TestHandOffToSilencedLeaderEndsOnLeaderChange(t *testing.T) {
	nodes := startBenchCluster(t, 3)
	_, follower := roles(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every node but the follower swallows what is forwarded to it: the
	// one the claim reaches is the leader, whichever that is by then.
	var others []*benchNode
	for _, n := range nodes {
		if n != follower {
			n.silent.Store(true)
			others = append(others, n)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := follower.dir.Do(ctx, claim("into-the-silence"))
		done <- err
	}()
	var leader *benchNode
	select {
	case <-others[0].swallowed:
		leader = others[0]
	case <-others[1].swallowed:
		leader = others[1]
	case err := <-done:
		t.Fatalf("claim answered before reaching the leader: %v", err)
	case <-ctx.Done():
		t.Fatal("the follower never forwarded its batch to the leader")
	}
	for _, n := range others {
		if n != leader {
			n.silent.Store(false) // the next leader answers
		}
	}
	// The leader steps down (its HTTP side still swallows the batch).
	if err := leader.store.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, raftstore.ErrOutcomeUnknown) || !errors.Is(err, raftstore.ErrLeaderChanged) {
			t.Fatalf("claim forwarded to the silenced leader: %v, want ErrOutcomeUnknown caused by ErrLeaderChanged", err)
		}
	case <-ctx.Done():
		t.Fatal("the forwarded claim waited out the silence")
	}

	// The claim is safe to retry; a retry reaches whichever node leads now.
	// With two nodes left the election may take a round or two, and a
	// forward cut by another leader change is retried as a caller would.
	if err := follower.store.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForErr(t, 20*time.Second, "the retried claim granted", func() error {
		res, err := follower.dir.Do(ctx, claim("into-the-silence"))
		switch {
		case errors.Is(err, raftstore.ErrOutcomeUnknown) || errors.Is(err, raftstore.ErrNotLeader) || errors.Is(err, raftstore.ErrNoLeader):
			return err
		case err != nil:
			t.Fatalf("retried claim: %v", err)
		case res.Code != directory.CodeGranted && res.Code != directory.CodeExisting:
			t.Fatalf("retried claim: %v %s", res.Code, res.Reason)
		}
		return nil
	})
}

// A forwarded batch answers not started only if no command in it was
// answered and every failure was a not-started one; anything else is an
// unknown outcome.
func TestForwardedFailure(t *testing.T) {
	notLeader := fmt.Errorf("raftstore: apply: %w", raftstore.ErrNotLeader)
	unknown := fmt.Errorf("raftstore: apply: %w: leadership lost", raftstore.ErrOutcomeUnknown)
	for _, c := range []struct {
		name        string
		answered    int
		failed      []error
		notStarted  bool
		wantClosed  bool
		wantUnknown bool
	}{
		{"none started", 0, []error{notLeader, notLeader}, true, false, false},
		{"directory closing", 0, []error{ErrClosed}, true, true, false},
		{"some answered", 1, []error{notLeader}, false, false, true},
		{"one unknown", 0, []error{notLeader, unknown}, false, false, true},
		{"the follower gave up", 0, []error{context.Canceled}, false, false, true},
	} {
		err := forwardedFailure(c.answered, c.failed)
		if got := errors.Is(err, raftstore.ErrOutcomeUnknown); got != c.wantUnknown {
			t.Errorf("%s: %v: outcome unknown %v, want %v", c.name, err, got, c.wantUnknown)
		}
		if got := notStarted(err); got != c.notStarted {
			t.Errorf("%s: %v: not started %v, want %v", c.name, err, got, c.notStarted)
		}
		if got := errors.Is(err, raftstore.ErrClosed); got != c.wantClosed {
			t.Errorf("%s: %v: raftstore.ErrClosed %v, want %v", c.name, err, got, c.wantClosed)
		}
	}
}
