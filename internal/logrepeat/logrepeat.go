// Package logrepeat summarises a WARN or ERROR that keeps coming for as long as its cause
// lasts: the first line is written, then at most one line per window saying how many were
// dropped since. It owns only that rule; what a line is about (its key) is the caller's to
// say, and where lines go is the slog.Logger's business.
package logrepeat

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Window is the summary window pinnedd's own repeated lines use: an outage
// of a minute is two or three lines, each with its count.
const Window = 30 * time.Second

// Repeats counts lines by what they are about. The zero value is not usable: see New.
type Repeats struct {
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

// New returns a Repeats that writes a key's line at most once per window.
func New(window time.Duration) *Repeats {
	return &Repeats{window: window, now: time.Now, seen: map[string]*repeat{}}
}

// Window is the summary window.
func (r *Repeats) Window() time.Duration { return r.window }

// SetClock replaces the clock (tests).
func (r *Repeats) SetClock(now func() time.Time) {
	r.mu.Lock()
	r.now = now
	r.mu.Unlock()
}

// Admit reports whether a line for key is written now, and how many dropped lines it stands
// for. A key that has not come for a window is forgotten: its cause ended, and its return is
// a new state change, written at once.
func (r *Repeats) Admit(key string) (ok bool, suppressed int) {
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

// Log writes msg with args to l at level unless Admit(key) holds it back; a line that stands
// for dropped ones says so ("repeated", "repeated_within"). A nil Repeats writes every line.
func (r *Repeats) Log(ctx context.Context, l *slog.Logger, level slog.Level, key, msg string, args ...any) {
	if !l.Enabled(ctx, level) {
		return
	}
	if r != nil {
		ok, suppressed := r.Admit(key)
		if !ok {
			return
		}
		if suppressed > 0 {
			args = append(args[:len(args):len(args)], "repeated", suppressed, "repeated_within", r.window.String())
		}
	}
	l.Log(ctx, level, msg, args...)
}
