package raftstore

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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
		if _, ok := back.cfg.Cluster.PeerAddr(n.id); !ok || !back.cfg.Cluster.IsMember(n.id) {
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

// atLeast is the recorder's lines at level or above.
func (h *lineRecorder) atLeast(level slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.lines {
		var lv slog.Level
		name, _, _ := strings.Cut(l, " ")
		if lv.UnmarshalText([]byte(name)) == nil && lv >= level {
			out = append(out, l)
		}
	}
	return out
}

// Joins, a rolling restart (each node closed, as SIGTERM does, and reopened on its data dir,
// the leader among them) and a leave are routine: no node logs a WARN or an ERROR, though
// raft logs each peer that restarts and each follower that catches up at those levels
// (raftLevels). They used to log a dozen of each.
func TestRoutineMembershipLogsNoWarnings(t *testing.T) {
	rec := &lineRecorder{}
	logged := func(c *Config) {
		tlsOn(c)
		c.Logger = slog.New(rec)
		// hashicorp/raft's own timing (fastConfig's halves it): a leader that misses its
		// quorum for a lease under this machine's load steps down with a WARN, rightly.
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	}
	n1 := startNode(t, "n1", t.TempDir(), "", true, logged)
	waitLeader(t, n1)
	nodes := []*testNode{n1}
	for _, id := range []string{"n2", "n3"} {
		n := startNode(t, id, t.TempDir(), "", false, logged)
		joinTLS(t, n1.srv.URL, n)
		nodes = append(nodes, n)
	}
	want := []string{"a"}
	mustApply(t, n1, "a")
	converged(t, nodes, want)

	for i, n := range nodes {
		addr := n.s.RaftAddr()
		n.close()
		nodes[i] = startNode(t, n.id, n.dir, addr, false, logged)
		cmd := "after-" + n.id
		mustApply(t, leaderOf(t, nodes), cmd)
		want = append(want, cmd)
		converged(t, nodes, want)
	}

	n3 := nodes[2]
	if err := n3.s.Leave(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	n3.close()
	rest := nodes[:2]
	mustApply(t, leaderOf(t, rest), "after-leave")
	converged(t, rest, append(want, "after-leave"))

	// Issuing a certificate is an audit line at WARN on purpose (who was given the cluster's
	// trust, and from where): one a joining node, and nothing else.
	var lines []string
	issued := 0
	for _, l := range rec.atLeast(slog.LevelWarn) {
		if strings.HasPrefix(l, "WARN issued a cluster certificate") {
			issued++
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) > 0 {
		t.Fatalf("routine joins, restarts and a leave logged %d WARN/ERROR lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	if issued != 2 {
		t.Fatalf("%d certificates issued (logged at WARN) for 2 joining nodes", issued)
	}
}

// raftLevels keeps what an operator acts on (storage, quorum, losing a leader) at WARN and
// ERROR, and moves the routine lines below INFO; raft's ids arrive as raft.ServerID.
func TestRaftLevels(t *testing.T) {
	for _, c := range []struct {
		level hclog.Level
		msg   string
		args  []any
		want  hclog.Level
	}{
		{hclog.Error, "failed to appendEntries to", []any{"error", "EOF"}, hclog.Info},
		{hclog.Warn, "appendEntries rejected, sending older logs", nil, hclog.Debug},
		{hclog.Warn, "heartbeat timeout reached, starting election", []any{"last-leader-addr", raft.ServerAddress(""), "last-leader-id", raft.ServerID("")}, hclog.Info},
		{hclog.Warn, "heartbeat timeout reached, starting election", []any{"last-leader-addr", raft.ServerAddress("10.0.0.5:8300"), "last-leader-id", raft.ServerID("n1")}, hclog.Warn},
		{hclog.Warn, "failed to contact quorum of nodes, stepping down", nil, hclog.Warn},
		{hclog.Error, "failed to take snapshot", []any{"error", "disk full"}, hclog.Error},
		{hclog.Error, "failed to append to logs", []any{"error", "disk full"}, hclog.Error},
	} {
		if got := raftLevels.Relevel(c.level, c.msg, c.args); got != c.want {
			t.Errorf("%s %q %v: logged at %s, want %s", c.level, c.msg, c.args, got, c.want)
		}
	}
}
