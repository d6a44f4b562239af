package raftstore

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// lineRecorder keeps every record's level and message, with its string attributes.
type lineRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *lineRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *lineRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.Key + "=" + a.Value.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, line)
	return nil
}
func (h *lineRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lineRecorder) WithGroup(string) slog.Handler      { return h }

func (h *lineRecorder) matching(sub string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.lines {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// A restarted member replays the log's old configurations (n1 alone, then n1 and n2, ...)
// into its state machine. The members it checks connections against stay the latest
// configuration's: the replay neither drops a current member from the cluster port's checks
// nor closes the current leader's Raft connection as "no longer a member".
func TestRestartReplayKeepsCurrentMembers(t *testing.T) {
	nodes := tlsCluster(t, 3)
	n2, n3 := nodes[1], nodes[2]
	for _, n := range nodes {
		waitLeader(t, n)
	}
	// n2 leads: the log's first configuration (n1 alone) does not hold it.
	if leaderOf(t, nodes) != n2 {
		if err := leaderOf(t, nodes).s.raft.LeadershipTransferToServer(raft.ServerID(n2.id), raft.ServerAddress(n2.s.RaftAddr())).Error(); err != nil {
			t.Fatal(err)
		}
	}
	leader := leaderOf(t, nodes)
	if leader != n2 {
		t.Fatalf("leader %s after the transfer to n2", leader.id)
	}
	mustApply(t, leader, "a")
	converged(t, nodes, []string{"a"})

	// Restart n3: it replays n1's configuration, then n1 and n2's, then all three.
	rec := &lineRecorder{}
	addr := n3.s.RaftAddr()
	n3.close()
	back := startNode(t, n3.id, n3.dir, addr, false, func(c *Config) {
		tlsOn(c)
		c.Logger = slog.New(rec)
	})
	mustApply(t, leader, "b")
	converged(t, []*testNode{leader, back}, []string{"a", "b"})

	for _, n := range nodes {
		if _, ok := back.s.PeerAddr(n.id); !ok || !back.s.isMember(n.id) {
			t.Errorf("after the replay, %s is not a member on %s", n.id, back.id)
		}
	}
	if cut := rec.matching("no longer a member"); len(cut) > 0 {
		t.Fatalf("the replay cut current members' connections:\n%s", strings.Join(cut, "\n"))
	}
	// The leader's connection stayed: n3 keeps applying without a new one being refused.
	mustApply(t, leader, "c")
	converged(t, []*testNode{back}, []string{"a", "b", "c"})
}
