package pinboard

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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

// handedIn counts the commands the nodes but one took through their
// hand-off routes.
func handedIn(nodes []*benchNode, but *benchNode) int64 {
	var n int64
	for _, nd := range nodes {
		if nd != but {
			n += nd.dir.handedIn.Load()
		}
	}
	return n
}

// A follower's claims reach the leader's group commit through the
// hand-off; a batch handed to a node is never handed on (two nodes that
// each think the other leads cannot pass it back and forth); bad batches
// are refused without touching the directory.
func TestDirectoryHandOff(t *testing.T) {
	nodes := startBenchCluster(t, 3)
	_, follower := roles(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	res, err := follower.dir.Do(ctx, claim("via-follower"))
	if err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("claim through a follower: %v %v %s", err, res.Code, res.Reason)
	}
	// Counted over every node but the follower: whichever leads took it.
	if got := handedIn(nodes, follower); got != 1 {
		t.Fatalf("the leader took %d handed-off commands, want 1", got)
	}

	// A batch handed to the follower itself goes through its Raft
	// forwarding, not to the leader's hand-off route.
	body := directory.Encode(directory.Batch{Commands: []directory.Command{claim("handed-to-follower")}})
	rec := httptest.NewRecorder()
	follower.dir.ServeHandOff(rec, httptest.NewRequestWithContext(ctx, "POST", HandOffPath, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("batch handed to the follower: %d %s", rec.Code, rec.Body)
	}
	out, err := directory.DecodeResult(rec.Body.Bytes())
	if err != nil || len(out.Results) != 1 || out.Results[0].Code != directory.CodeGranted {
		t.Fatalf("batch handed to the follower answered %+v, %v", out, err)
	}
	if got := handedIn(nodes, follower); got != 1 {
		t.Fatalf("a handed-off batch was handed on: the other nodes took %d commands, want still 1", got)
	}

	// A leader running a release without the route (a rolling upgrade):
	// the follower's batch goes through Raft forwarding instead. Every
	// node but the follower is that release, whichever leads.
	for _, n := range nodes {
		n.noHandOffRoute.Store(n != follower)
	}
	if res, err := follower.dir.Do(ctx, claim("old-leader")); err != nil || res.Code != directory.CodeGranted {
		t.Fatalf("claim through a follower of a leader without the hand-off route: %v %v %s", err, res.Code, res.Reason)
	}
	for _, n := range nodes {
		n.noHandOffRoute.Store(false)
	}

	// Placements read on the leader: a claim is applied there before it is
	// answered, so nothing still in flight moves the count.
	leader, _ := roles(t, nodes)
	_, before := leader.dir.Machine().Len()
	for name, body := range map[string][]byte{
		"garbage":      []byte("not a command"),
		"not a batch":  directory.Encode(claim("single")),
		"empty batch":  directory.Encode(directory.Batch{}),
		"nested batch": directory.Encode(directory.Batch{Commands: []directory.Command{claim("n1"), directory.Batch{}}}),
	} {
		rec := httptest.NewRecorder()
		leader.dir.ServeHandOff(rec, httptest.NewRequestWithContext(ctx, "POST", HandOffPath, bytes.NewReader(body)))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, rec.Code, rec.Body)
		}
	}
	if _, after := leader.dir.Machine().Len(); after != before {
		t.Fatalf("refused batches changed the directory: %d placements, %d before", after, before)
	}
}

// A batch handed to a leader that then goes silent (cut off: no answer, not
// even an error) ends as soon as the follower sees another leader, not at
// the batch timeout; the follower's next batch reaches the new leader.
func TestHandOffToSilencedLeaderEndsOnLeaderChange(t *testing.T) {
	nodes := startBenchCluster(t, 3)
	_, follower := roles(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every node but the follower swallows batches: the one the batch
	// reaches is the leader, whichever that is by then.
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
		t.Fatal("the follower never handed its batch to the leader")
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
		if !errors.Is(err, ErrHandOff) || !errors.Is(err, raftstore.ErrLeaderChanged) {
			t.Fatalf("claim handed to the silenced leader: %v, want ErrHandOff caused by ErrLeaderChanged", err)
		}
	case <-ctx.Done():
		t.Fatal("the handed-off claim waited out the silence")
	}

	// The claim is safe to retry; a retry reaches whichever node leads now.
	// With two nodes left the election may take a round or two, and a
	// hand-off cut by another leader change is retried as a caller would.
	if err := follower.store.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForErr(t, 20*time.Second, "the retried claim granted", func() error {
		res, err := follower.dir.Do(ctx, claim("into-the-silence"))
		switch {
		case errors.Is(err, ErrHandOff) || errors.Is(err, raftstore.ErrLeaderChanged):
			return err
		case err != nil:
			t.Fatalf("retried claim: %v", err)
		case res.Code != directory.CodeGranted && res.Code != directory.CodeExisting:
			t.Fatalf("retried claim: %v %s", res.Code, res.Reason)
		}
		return nil
	})
}
