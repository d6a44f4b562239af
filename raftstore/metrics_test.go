package raftstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// gauges is a scrape of reg's pinned_raft_* gauges: name, or name{peer}, -> value.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Every node exports its view of Raft: one leader, a leader known everywhere, one term, the
// commit and applied indices, and how long ago it heard from each member; a member that dies
// shows on the leader as a last contact that keeps growing.
func TestRaftGauges(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	nodes := newCluster(t, 3, func(c *Config) {
		r := prometheus.NewRegistry()
		regs[c.NodeID] = r
		c.Registerer = r
	})
	leader := leaderOf(t, nodes)
	mustApply(t, leader, "a")
	converged(t, nodes, []string{"a"})

	var term float64
	testutil.WaitForErr(t, 10*time.Second, "every node's gauges agree", func() error {
		leaders := 0
		for _, n := range nodes {
			g := gauges(t, regs[n.id])
			leaders += int(g["pinned_raft_leader"])
			if g["pinned_raft_has_leader"] != 1 {
				return fmt.Errorf("%s: pinned_raft_has_leader %v", n.id, g["pinned_raft_has_leader"])
			}
			if n == leader {
				term = g["pinned_raft_term"]
			}
			if c, a := g["pinned_raft_commit_index"], g["pinned_raft_applied_index"]; c == 0 || a != c {
				return fmt.Errorf("%s: commit index %v, applied %v", n.id, c, a)
			}
			want := []string{n.id, leader.id} // a follower hears from itself and the leader
			if n == leader {
				want = []string{"n1", "n2", "n3"}
			}
			for _, p := range want {
				v, ok := g["pinned_raft_peer_last_contact_seconds{"+p+"}"]
				if !ok || v > 5 {
					return fmt.Errorf("%s: last contact with %s %v (exported: %v)", n.id, p, v, ok)
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d nodes say they lead", leaders)
		}
		return nil
	})
	for _, n := range nodes {
		if g := gauges(t, regs[n.id]); g["pinned_raft_term"] != term || term == 0 {
			t.Fatalf("%s: term %v, the leader's %v", n.id, g["pinned_raft_term"], term)
		}
	}

	dead := followerOf(nodes, leader)
	dead.kill()
	testutil.WaitForErr(t, 20*time.Second, "the leader sees "+dead.id+" silent", func() error {
		if v := gauges(t, regs[leader.id])["pinned_raft_peer_last_contact_seconds{"+dead.id+"}"]; v < 1 {
			return fmt.Errorf("last contact %vs ago", v)
		}
		return nil
	})
}
