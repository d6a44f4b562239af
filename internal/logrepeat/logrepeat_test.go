package logrepeat

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// One cause logged twice a second for a minute gives its first line and
// one summary per window; another key is never held back by it; a cause
// that went quiet for a window is new when it returns.
func TestLogSummarisesAKeyPerWindow(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	r := New(10 * time.Second)
	now := time.Unix(1000, 0)
	r.SetClock(func() time.Time { return now })
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	ctx := context.Background()

	for i := 0; i < 21; i++ { // 0 .. 10 s
		r.Log(ctx, l, slog.LevelWarn, "owner n2", "owner did not answer", "node", "n2")
		now = now.Add(500 * time.Millisecond)
	}
	got := lines()
	if len(got) != 2 || !strings.Contains(got[1], "repeated=19") || !strings.Contains(got[1], "repeated_within=10s") {
		t.Fatalf("want the first line and one summary of 19, got:\n%s", buf.String())
	}
	r.Log(ctx, l, slog.LevelWarn, "owner n3", "owner did not answer", "node", "n3")
	if n := len(lines()); n != 3 {
		t.Fatalf("another key is its own cause: want 3 lines, got %d:\n%s", n, buf.String())
	}
	now = now.Add(11 * time.Second)
	r.Log(ctx, l, slog.LevelWarn, "owner n2", "owner did not answer", "node", "n2")
	if got := lines(); len(got) != 4 || strings.Contains(got[3], "repeated") {
		t.Fatalf("a cause back after a quiet window is logged without a count:\n%s", buf.String())
	}

	// A nil Repeats writes everything; a disabled level writes nothing.
	buf.Reset()
	var none *Repeats
	for range 3 {
		none.Log(ctx, l, slog.LevelWarn, "k", "m")
	}
	r.Log(ctx, l, slog.LevelDebug, "k", "m")
	if n := len(lines()); n != 3 {
		t.Fatalf("nil Repeats: want 3 lines, got %d:\n%s", n, buf.String())
	}
}
