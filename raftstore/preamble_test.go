package raftstore

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// Each leader commits its preamble, naming the leader before it, once per
// term and before any other command of the term, whichever node the
// command came through.
func TestLeaderPreambleFirstInEachTerm(t *testing.T) {
	nodes := newCluster(t, 3, nil)
	for _, n := range nodes {
		id := n.id
		n.s.SetLeaderPreamble(func(former string) []byte { return []byte("pre " + id + " after " + former) })
	}
	old := leaderOf(t, nodes)
	mustApply(t, followerOf(nodes, old), "a")
	mustApply(t, old, "b")
	want := []string{"pre " + old.id + " after ", "a", "b"}
	converged(t, nodes, want)

	old.kill()
	var rest []*testNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	leader := leaderOf(t, rest)
	// At once after its barrier, before anyone applies anything.
	want = append(want, "pre "+leader.id+" after "+old.id)
	converged(t, rest, want)
	testutil.WaitForErr(t, 5*time.Second, "the follower sees the new leader", func() error {
		if id, _ := followerOf(rest, leader).s.Leader(); id != leader.id {
			return fmt.Errorf("it sees %q", id)
		}
		return nil
	})
	mustApply(t, followerOf(rest, leader), "c")
	mustApply(t, leader, "d")
	want = append(want, "c", "d")
	converged(t, rest, want)
	if got := rest[0].sm.list(); !slices.Equal(got, want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
}
