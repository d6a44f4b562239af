package hclogslog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func jsonLogger(buf *bytes.Buffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level}))
}

func records(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON record: %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// A down peer makes raft log "failed to heartbeat to" twice a second for as
// long as it is down: the bridge writes it once, then one summary per
// window, and a different peer or message is not held back by it.
func TestRepeatsAreSummarised(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	b := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Options{RepeatWindow: 30 * time.Second}).(*bridge)
	b.repeats.SetClock(func() time.Time { return now })
	rep := b.Named("replication")
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
		b.Log(hclog.Info, "entering follower state")
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
	// Without a window nothing is held back.
	buf.Reset()
	plain := New(slog.New(slog.NewTextHandler(&buf, nil)), Options{})
	for range 3 {
		plain.Error("failed to heartbeat to", "peer", "127.0.0.1:8302")
	}
	if n := len(lines()); n != 3 {
		t.Fatalf("no RepeatWindow: want 3 lines, got %d:\n%s", n, buf.String())
	}
}

// Levels, names and args land in slog as a reader of the JSON log expects:
// INFO and below at DEBUG, WARN and ERROR as they are, the hclog name as
// "logger", the args and implied args as attributes.
func TestLevelsNamesAndArgs(t *testing.T) {
	var buf bytes.Buffer
	l := New(jsonLogger(&buf, slog.LevelDebug), Options{Name: "go-plugin"}).Named("echo").With("plugin", "/echo")
	l.Trace("trace line")
	l.Info("plugin started", "pid", 42)
	l.Warn("slow", "after", "5s")
	l.Error("plugin process exited", "error", "exit status 2")
	recs := records(t, &buf)
	if len(recs) != 4 {
		t.Fatalf("want 4 records, got %d:\n%s", len(recs), buf.String())
	}
	for i, want := range []struct{ level, msg string }{
		{"DEBUG", "trace line"}, {"DEBUG", "plugin started"}, {"WARN", "slow"}, {"ERROR", "plugin process exited"},
	} {
		if recs[i]["level"] != want.level || recs[i]["msg"] != want.msg {
			t.Errorf("record %d: %v %v, want %s %q", i, recs[i]["level"], recs[i]["msg"], want.level, want.msg)
		}
		if recs[i]["logger"] != "go-plugin.echo" || recs[i]["plugin"] != "/echo" {
			t.Errorf("record %d: logger %v plugin %v, want go-plugin.echo and /echo", i, recs[i]["logger"], recs[i]["plugin"])
		}
	}
	if recs[1]["pid"] != float64(42) || recs[3]["error"] != "exit status 2" {
		t.Errorf("args lost: %v, %v", recs[1], recs[3])
	}
	if got := l.ImpliedArgs(); len(got) != 2 || got[0] != "plugin" {
		t.Errorf("implied args: %v", got)
	}
	if l.Name() != "go-plugin.echo" || l.ResetNamed("x").Name() != "x" {
		t.Errorf("names: %q, %q", l.Name(), l.ResetNamed("x").Name())
	}
}

// MinLevel drops what is below it, and GetLevel tells callers (go-plugin
// skips parsing a plugin's lines below it) the lowest level that is written,
// MinLevel or the slog handler's, whichever is higher.
func TestMinLevelAndGetLevel(t *testing.T) {
	var buf bytes.Buffer
	l := New(jsonLogger(&buf, slog.LevelDebug), Options{MinLevel: hclog.Warn})
	l.Debug("chatter")
	l.Info("chatter")
	l.Warn("kept")
	if recs := records(t, &buf); len(recs) != 1 || recs[0]["msg"] != "kept" {
		t.Fatalf("MinLevel warn: %s", buf.String())
	}
	if got := l.GetLevel(); got != hclog.Warn {
		t.Errorf("GetLevel with MinLevel warn: %v", got)
	}
	if l.IsInfo() || !l.IsWarn() {
		t.Errorf("IsInfo %v IsWarn %v, want false true", l.IsInfo(), l.IsWarn())
	}
	for _, c := range []struct {
		slog slog.Level
		want hclog.Level
	}{
		{slog.LevelDebug, hclog.Trace}, // trace, debug and info all land at slog DEBUG
		{slog.LevelInfo, hclog.Warn},
		{slog.LevelError, hclog.Error},
		{slog.LevelError + 4, hclog.Off},
	} {
		if got := New(jsonLogger(&buf, c.slog), Options{}).GetLevel(); got != c.want {
			t.Errorf("slog level %v: GetLevel %v, want %v", c.slog, got, c.want)
		}
	}
}

// Standard-library log lines keep the level their prefix names.
func TestStandardLogger(t *testing.T) {
	var buf bytes.Buffer
	std := New(jsonLogger(&buf, slog.LevelDebug), Options{}).StandardLogger(nil)
	std.Print("[WARN] raft: heartbeat timeout reached")
	std.Print("[ERR] raft: failed to contact")
	std.Print("no prefix")
	recs := records(t, &buf)
	if len(recs) != 3 {
		t.Fatalf("want 3 records:\n%s", buf.String())
	}
	for i, want := range []struct{ level, msg string }{
		{"WARN", "raft: heartbeat timeout reached"}, {"ERROR", "raft: failed to contact"}, {"DEBUG", "no prefix"},
	} {
		if recs[i]["level"] != want.level || recs[i]["msg"] != want.msg {
			t.Errorf("line %d: %v %q, want %s %q", i, recs[i]["level"], recs[i]["msg"], want.level, want.msg)
		}
	}
}

// A Relevel table sets the level a library's message is logged at, from its args if it
// says so; a message it does not name keeps its level; MinLevel applies to the new level.
func TestRelevel(t *testing.T) {
	var buf bytes.Buffer
	levels := Levels{
		"failed to appendEntries to": Always(hclog.Info),
		"heartbeat timeout reached": func(args []any) hclog.Level {
			if Arg(args, "last-leader-id") == "" {
				return hclog.Info
			}
			return hclog.Warn
		},
		"entering follower state": Always(hclog.Warn),
	}
	l := New(jsonLogger(&buf, slog.LevelDebug), Options{MinLevel: hclog.Info, Relevel: levels.Relevel})
	l.Error("failed to appendEntries to", "peer", "n2", "error", "EOF")
	l.Warn("heartbeat timeout reached", "last-leader-id", "")
	l.Warn("heartbeat timeout reached", "last-leader-id", "n1")
	l.Error("failed to take snapshot", "error", "disk full")
	l.Debug("entering follower state") // raised past MinLevel
	l.Debug("appendEntries rejected")  // not in the table: below MinLevel, dropped
	want := []struct{ level, msg string }{
		{"DEBUG", "failed to appendEntries to"},
		{"DEBUG", "heartbeat timeout reached"},
		{"WARN", "heartbeat timeout reached"},
		{"ERROR", "failed to take snapshot"},
		{"WARN", "entering follower state"},
	}
	recs := records(t, &buf)
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d:\n%s", len(recs), len(want), buf.String())
	}
	for i, w := range want {
		if recs[i]["level"] != w.level || recs[i]["msg"] != w.msg {
			t.Errorf("record %d: %v %v, want %s %s", i, recs[i]["level"], recs[i]["msg"], w.level, w.msg)
		}
	}
}
