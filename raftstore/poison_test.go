package raftstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// A committed entry no node can decode (the bytes a forged AppendEntries
// once slipped in: a meta entry whose JSON is garbage, and a kind nobody
// knows) is skipped by every node alike, logged and counted; the group
// keeps committing, and a restarted node replays the entry without a
// panic.
func TestPoisonEntriesAreSkippedEverywhere(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	nodes := newCluster(t, 3, func(c *Config) {
		r := prometheus.NewRegistry()
		regs[c.NodeID] = r
		c.Registerer = r
	})
	leader := leaderOf(t, nodes)
	for _, poison := range [][]byte{{kindMeta, 'x'}, {0x07, 'y'}} {
		if err := leader.s.raft.Apply(poison, 5*time.Second).Error(); err != nil {
			t.Fatalf("commit %q: %v", poison, err)
		}
	}
	mustApply(t, leader, "after-poison")
	for _, n := range nodes {
		testutil.WaitForErr(t, 5*time.Second, n.id+" applied past the poison", func() error {
			if !strings.Contains(strings.Join(n.sm.list(), ","), "after-poison") {
				return fmt.Errorf("entries %v", n.sm.list())
			}
			return nil
		})
		for _, reason := range []string{skipUndecodable, skipUnknownKind} {
			if got := skippedCount(t, regs[n.id], reason); got != 1 {
				t.Fatalf("%s skipped %v entries as %s, want 1", n.id, got, reason)
			}
		}
	}

	// A follower restarted on its data dir replays the log, poison included.
	var f *testNode
	for _, n := range nodes {
		if n != leader {
			f = n
			break
		}
	}
	addr := f.s.RaftAddr()
	f.close()
	back := startNode(t, f.id, f.dir, addr, false, nil)
	mustApply(t, leader, "after-restart")
	testutil.WaitForErr(t, 10*time.Second, f.id+" applies after its restart", func() error {
		if !strings.Contains(strings.Join(back.sm.list(), ","), "after-restart") {
			return fmt.Errorf("entries %v", back.sm.list())
		}
		return nil
	})
}

// skippedCount reads pinned_raft_entries_skipped_total{reason} as a
// scrape of reg would.
func skippedCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "pinned_raft_entries_skipped_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}
