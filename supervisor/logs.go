package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/pinnedd/pinnedd/internal/hclogslog"
)

// lineLogger re-logs a plugin's stderr through slog. The SDK writes JSON
// records (level, msg, attrs); anything else (a panic trace, a stray print)
// is logged as-is at WARN so it is never lost.
type lineLogger struct {
	logger *slog.Logger
	mu     sync.Mutex
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.logLine(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) logLine(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var rec map[string]any
	if line[0] != '{' || json.Unmarshal(line, &rec) != nil {
		l.logger.Warn(string(line), "stream", "stderr")
		return
	}
	// slog's JSON handler writes level/msg/time; go-plugin's own server
	// side (hclog) writes @level/@message/@timestamp.
	level := slog.LevelInfo
	lv, _ := rec["level"].(string)
	if lv == "" {
		lv, _ = rec["@level"].(string)
	}
	if lv != "" {
		_ = level.UnmarshalText([]byte(lv))
	}
	msg, _ := rec["msg"].(string)
	if msg == "" {
		msg, _ = rec["@message"].(string)
	}
	attrs := make([]slog.Attr, 0, len(rec))
	for k, v := range rec {
		switch k {
		case "level", "msg", "time", "@level", "@message", "@timestamp":
			continue
		}
		attrs = append(attrs, slog.Any(k, v))
	}
	l.logger.LogAttrs(context.Background(), level, msg, attrs...)
}

// hclogAdapter points go-plugin's own logging (hclog) at slog, at WARN and
// above: its INFO/DEBUG chatter about every stderr line is noise here.
func hclogAdapter(logger *slog.Logger) hclog.Logger {
	return hclogslog.New(logger, hclogslog.Options{Name: "go-plugin", MinLevel: hclog.Warn})
}

var _ io.Writer = (*lineLogger)(nil)
