// Package hclogslog is pinnedd's one bridge from hclog, the logger hashicorp/raft and
// hashicorp/go-plugin take, into log/slog. It owns how hclog's levels map onto slog's and how
// what a repeated line is about (logrepeat summarises it); it never decides where lines go
// (the slog.Logger it is given does).
//
// Levels: hclog INFO and below become slog DEBUG, WARN and ERROR keep their level. Both
// libraries announce routine events at INFO (every election, every pipeline start, every
// plugin start), and their callers log the events an operator needs at INFO themselves.
// A library that also logs routine events at WARN or ERROR (raft: a peer that restarts, a
// follower catching up) is given a Relevel table by its caller, which knows its messages
// (raftstore's raftLevels): the level a line is logged at is the table's, and what is left
// at WARN and ERROR is what an operator acts on.
package hclogslog

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/pinnedd/pinnedd/internal/logrepeat"
)

// Options say what a bridge drops and summarises.
type Options struct {
	// Name is the logger's hclog name. It, and what Named adds to it, is logged as the
	// attribute "logger".
	Name string
	// MinLevel drops lines below it (hclog.NoLevel keeps every line).
	MinLevel hclog.Level
	// RepeatWindow, if set, summarises a WARN or ERROR that keeps coming: the first line is
	// logged, then one line per window saying how many were dropped since. Lines are told
	// apart by logger name, message and the peer they are about (the args "peer", "id" and
	// "address"), not by details that change each time (a backoff, an error text).
	RepeatWindow time.Duration
	// Relevel, if set, gives the level a line is logged at (before MinLevel applies), from
	// the level its library chose, its message and its args.
	Relevel func(level hclog.Level, msg string, args []any) hclog.Level
}

// Levels is a Relevel table: a library's message -> the level it is logged at. A message not
// in it keeps its level.
type Levels map[string]func(args []any) hclog.Level

// Relevel is the table as an Options.Relevel.
func (t Levels) Relevel(level hclog.Level, msg string, args []any) hclog.Level {
	if f, ok := t[msg]; ok {
		return f(args)
	}
	return level
}

// Always is a Levels entry: the message is logged at level whatever its args.
func Always(level hclog.Level) func([]any) hclog.Level {
	return func([]any) hclog.Level { return level }
}

// Arg is the value of key in hclog args (alternating keys and values), nil if absent.
func Arg(args []any, key string) any {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == key {
			return args[i+1]
		}
	}
	return nil
}

// New returns an hclog.Logger that writes to l.
func New(l *slog.Logger, opts Options) hclog.Logger {
	b := &bridge{l: l, name: opts.Name, min: opts.MinLevel, relevel: opts.Relevel}
	if opts.RepeatWindow > 0 {
		b.repeats = logrepeat.New(opts.RepeatWindow)
	}
	return b
}

// bridge is one hclog.Logger (one name, one set of implied args) over a slog.Logger.
type bridge struct {
	l       *slog.Logger
	name    string
	min     hclog.Level
	implied []any
	relevel func(hclog.Level, string, []any) hclog.Level // nil: levels as the library chose
	repeats *logrepeat.Repeats                           // shared by every logger derived from one New; nil: off
}

var _ hclog.Logger = (*bridge)(nil)

// slogLevel maps an hclog level onto slog's.
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

func (b *bridge) enabled(level hclog.Level) bool {
	return level != hclog.Off && level >= b.min && b.l.Enabled(context.Background(), slogLevel(level))
}

func (b *bridge) Log(level hclog.Level, msg string, args ...any) {
	if b.relevel != nil && level != hclog.Off {
		level = b.relevel(level, msg, args)
	}
	if !b.enabled(level) {
		return
	}
	lvl := slogLevel(level)
	attrs := make([]any, 0, len(args)+6)
	if lvl >= slog.LevelWarn && b.repeats != nil {
		ok, suppressed := b.repeats.Admit(repeatKey(b.name, msg, args))
		if !ok {
			return
		}
		if suppressed > 0 {
			attrs = append(attrs, "repeated", suppressed, "repeated_within", b.repeats.Window().String())
		}
	}
	if b.name != "" {
		attrs = append(attrs, "logger", b.name)
	}
	// hclog args are alternating key/value pairs, like slog's.
	attrs = append(attrs, args...)
	b.l.Log(context.Background(), lvl, msg, attrs...)
}

func (b *bridge) Trace(msg string, args ...any) { b.Log(hclog.Trace, msg, args...) }
func (b *bridge) Debug(msg string, args ...any) { b.Log(hclog.Debug, msg, args...) }
func (b *bridge) Info(msg string, args ...any)  { b.Log(hclog.Info, msg, args...) }
func (b *bridge) Warn(msg string, args ...any)  { b.Log(hclog.Warn, msg, args...) }
func (b *bridge) Error(msg string, args ...any) { b.Log(hclog.Error, msg, args...) }

func (b *bridge) IsTrace() bool { return b.enabled(hclog.Trace) }
func (b *bridge) IsDebug() bool { return b.enabled(hclog.Debug) }
func (b *bridge) IsInfo() bool  { return b.enabled(hclog.Info) }
func (b *bridge) IsWarn() bool  { return b.enabled(hclog.Warn) }
func (b *bridge) IsError() bool { return b.enabled(hclog.Error) }

// GetLevel is the lowest level that is logged; callers (go-plugin) skip work below it.
func (b *bridge) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if b.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

// SetLevel does nothing: the level is MinLevel and the slog handler's business.
func (b *bridge) SetLevel(hclog.Level) {}

func (b *bridge) ImpliedArgs() []any { return b.implied }

func (b *bridge) With(args ...any) hclog.Logger {
	c := *b
	c.l = b.l.With(args...)
	c.implied = append(append([]any(nil), b.implied...), args...)
	return &c
}

func (b *bridge) Name() string { return b.name }

func (b *bridge) Named(name string) hclog.Logger {
	if b.name != "" {
		name = b.name + "." + name
	}
	return b.ResetNamed(name)
}

func (b *bridge) ResetNamed(name string) hclog.Logger {
	c := *b
	c.name = name
	return &c
}

func (b *bridge) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(b.StandardWriter(opts), "", 0)
}

func (b *bridge) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return stdWriter{b} }

// stdWriter turns standard-library log lines ("[WARN] raft: ...") into bridge calls.
type stdWriter struct{ b *bridge }

// stdPrefixes are the level prefixes hashicorp's libraries put on standard-library log lines.
var stdPrefixes = []struct {
	prefix string
	level  hclog.Level
}{
	{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info},
	{"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error},
}

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := hclog.Info
	for _, s := range stdPrefixes {
		if rest, ok := strings.CutPrefix(line, s.prefix); ok {
			level, line = s.level, strings.TrimSpace(rest)
			break
		}
	}
	w.b.Log(level, line)
	return len(p), nil
}

// repeatKey names what a line is about: its logger, message and peer.
func repeatKey(name, msg string, args []any) string {
	key := name + "\x00" + msg
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "peer" || k == "id" || k == "address" {
			key += "\x00" + fmt.Sprint(args[i+1])
		}
	}
	return key
}
