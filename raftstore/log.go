package raftstore

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends hashicorp/raft's hclog output into slog. Raft is chatty at INFO
// (every election, every pipeline start), so its INFO and below become slog DEBUG; WARN and
// ERROR keep their level. raftstore logs the lifecycle events an operator needs at INFO itself.
// Raft repeats a WARN or ERROR for as long as its cause lasts (a down peer: "failed to
// heartbeat to" twice a second), so a repeated one is logged once, then as one summary line
// per repeatWindow while it keeps coming.
type hclogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
	repeats *repeats
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHCLogAdapter(l *slog.Logger) *hclogAdapter {
	return &hclogAdapter{l: l, repeats: newRepeats(repeatWindow, time.Now)}
}

// repeatWindow is how often a repeated raft WARN/ERROR is summarised.
const repeatWindow = 30 * time.Second

// repeats counts WARN/ERROR lines by what they are about (message and peer), so one
// cause gives one line and then a summary per window rather than a line per retry.
type repeats struct {
	window time.Duration
	now    func() time.Time
	mu     sync.Mutex
	seen   map[string]*repeat
}

type repeat struct {
	logged     time.Time // when a line for this key was last written
	last       time.Time // when one last came
	suppressed int       // lines dropped since logged
}

func newRepeats(window time.Duration, now func() time.Time) *repeats {
	return &repeats{window: window, now: now, seen: map[string]*repeat{}}
}

// admit reports whether a line for key is written now, and how many lines
// dropped before it this one stands for. A key that has not come for a window
// is forgotten: its cause ended, and its return is a new state change, logged
// at once.
func (r *repeats) admit(key string) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for k, v := range r.seen {
		if now.Sub(v.last) >= r.window {
			delete(r.seen, k)
		}
	}
	rp := r.seen[key]
	if rp == nil {
		r.seen[key] = &repeat{logged: now, last: now}
		return true, 0
	}
	rp.last = now
	if now.Sub(rp.logged) < r.window {
		rp.suppressed++
		return false, 0
	}
	n := rp.suppressed
	rp.logged, rp.suppressed = now, 0
	return true, n
}

// repeatKey names what a raft line is about: its logger, message and peer, not its
// changing details (backoff, error text).
func repeatKey(name, msg string, args []any) string {
	key := name + "\x00" + msg
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "peer" || k == "id" || k == "address" {
			key += "\x00" + fmt.Sprint(args[i+1])
		}
	}
	return key
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelDebug
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lvl := slogLevel(level)
	ctx := context.Background()
	if !a.l.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]any, 0, len(args)+4)
	if lvl >= slog.LevelWarn && a.repeats != nil {
		ok, suppressed := a.repeats.admit(repeatKey(a.name, msg, args))
		if !ok {
			return
		}
		if suppressed > 0 {
			attrs = append(attrs, "repeated", suppressed, "repeated_within", a.repeats.window.String())
		}
	}
	if a.name != "" {
		attrs = append(attrs, "raft", a.name)
	}
	// hclog args are alternating key/value pairs, like slog's.
	attrs = append(attrs, args...)
	a.l.Log(ctx, lvl, msg, attrs...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) IsTrace() bool { return a.l.Enabled(context.Background(), slog.LevelDebug-4) }
func (a *hclogAdapter) IsDebug() bool { return a.l.Enabled(context.Background(), slog.LevelDebug) }
func (a *hclogAdapter) IsInfo() bool  { return a.l.Enabled(context.Background(), slog.LevelDebug) }
func (a *hclogAdapter) IsWarn() bool  { return a.l.Enabled(context.Background(), slog.LevelWarn) }
func (a *hclogAdapter) IsError() bool { return a.l.Enabled(context.Background(), slog.LevelError) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{
		l:       a.l.With(args...),
		name:    a.name,
		implied: append(append([]any(nil), a.implied...), args...),
		repeats: a.repeats,
	}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	n := name
	if a.name != "" {
		n = a.name + "." + name
	}
	return &hclogAdapter{l: a.l, name: n, implied: a.implied, repeats: a.repeats}
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l, name: name, implied: a.implied, repeats: a.repeats}
}

// SetLevel is a no-op: the level is the slog handler's business.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

func (a *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case a.IsDebug():
		return hclog.Debug
	case a.IsWarn():
		return hclog.Warn
	default:
		return hclog.Error
	}
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{a}
}

// stdWriter turns standard-library log lines ("[WARN] raft: ...") into adapter calls.
type stdWriter struct{ a *hclogAdapter }

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := hclog.Info
	for prefix, l := range map[string]hclog.Level{
		"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info,
		"[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error,
	} {
		if strings.HasPrefix(line, prefix) {
			level = l
			line = strings.TrimSpace(strings.TrimPrefix(line, prefix))
			break
		}
	}
	w.a.Log(level, line)
	return len(p), nil
}
