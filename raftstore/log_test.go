package raftstore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// A down peer makes raft log "failed to heartbeat to" twice a second for as
// long as it is down: the adapter writes it once, then one summary per
// window, and a different peer or message is not held back by it.
func TestHCLogAdapterSummarisesRepeats(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	a := &hclogAdapter{
		l:       slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		repeats: newRepeats(30*time.Second, func() time.Time { return now }),
	}
	rep := a.Named("replication")
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	for i := 0; i < 60; i++ { // 30 s at two a second
		rep.Error("failed to heartbeat to", "peer", "127.0.0.1:8302", "backoff time", time.Duration(i)*time.Millisecond, "error", "connection refused")
		now = now.Add(500 * time.Millisecond)
	}
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "failed to heartbeat to") {
		t.Fatalf("first 30 s of one cause: want one line, got %d:\n%s", len(got), buf.String())
	}
	rep.Error("failed to heartbeat to", "peer", "127.0.0.1:8303", "error", "connection refused")
	rep.Warn("appendEntries rejected", "peer", "127.0.0.1:8302")
	if got := lines(); len(got) != 3 {
		t.Fatalf("another peer and another message are their own causes: want 3 lines, got %d:\n%s", len(got), buf.String())
	}
	rep.Error("failed to heartbeat to", "peer", "127.0.0.1:8302", "error", "connection refused")
	got := lines()
	if len(got) != 4 || !strings.Contains(got[3], "repeated=59") {
		t.Fatalf("after a window: want a summary line with repeated=59, got:\n%s", buf.String())
	}
	// Debug and info lines are never held back.
	for i := 0; i < 3; i++ {
		a.Log(hclog.Info, "entering follower state")
	}
	if n := len(lines()); n != 7 {
		t.Fatalf("info lines: want 7 lines in all, got %d:\n%s", n, buf.String())
	}
	// The cause ended (nothing for a window), then came back: logged at once.
	now = now.Add(31 * time.Second)
	rep.Error("failed to heartbeat to", "peer", "127.0.0.1:8302", "error", "connection refused")
	got = lines()
	if last := got[len(got)-1]; len(got) != 8 || strings.Contains(last, "repeated") {
		t.Fatalf("a cause that returns after a quiet window is a new line without a count:\n%s", buf.String())
	}
}
