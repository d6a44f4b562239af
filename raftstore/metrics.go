package raftstore

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// raftCollector is this node's view of Raft as Prometheus gauges, read at each scrape (no
// goroutine, nothing cached): who leads, the term, the commit and applied indices, and how long
// ago this node last heard from each member, as `pinnedd members` shows it.
type raftCollector struct {
	s *Store

	leader, hasLeader, term, commit, applied, lastContact *prometheus.Desc
}

func newRaftCollector(s *Store) *raftCollector {
	return &raftCollector{
		s:         s,
		leader:    prometheus.NewDesc("pinned_raft_leader", "1 while this node is the Raft leader.", nil, nil),
		hasLeader: prometheus.NewDesc("pinned_raft_has_leader", "1 while this node knows a Raft leader (0: an election, or no quorum).", nil, nil),
		term:      prometheus.NewDesc("pinned_raft_term", "This node's current Raft term; it rises with every election.", nil, nil),
		commit:    prometheus.NewDesc("pinned_raft_commit_index", "The highest Raft log index this node knows to be committed.", nil, nil),
		applied:   prometheus.NewDesc("pinned_raft_applied_index", "The highest Raft log index applied to this node's directory.", nil, nil),
		lastContact: prometheus.NewDesc("pinned_raft_peer_last_contact_seconds",
			"Seconds since this node last heard from the member peer: every member on the leader (0 while its heartbeats succeed), the leader and itself on a follower.",
			[]string{"peer"}, nil),
	}
}

func (c *raftCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.leader, c.hasLeader, c.term, c.commit, c.applied, c.lastContact} {
		ch <- d
	}
}

func (c *raftCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if s.closed.Load() {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	_, leaderID := s.raft.LeaderWithID()
	gauge(c.leader, boolGauge(s.raft.State() == raft.Leader))
	gauge(c.hasLeader, boolGauge(leaderID != ""))
	gauge(c.term, float64(s.raft.CurrentTerm()))
	gauge(c.commit, float64(s.raft.CommitIndex()))
	gauge(c.applied, float64(s.raft.AppliedIndex()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	members, err := s.Members(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, m := range members {
		if m.LastContact.IsZero() {
			continue // a follower does not hear from the other followers
		}
		gauge(c.lastContact, max(0, now.Sub(m.LastContact).Seconds()), m.ID)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
