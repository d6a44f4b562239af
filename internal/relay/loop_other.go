//go:build !linux

package relay

import "log/slog"

// Supported reports whether this platform has a relay loop.
const Supported = false

// Loop is a stand-in where there is no relay loop: Add refuses, and
// callers keep streams on their ordinary path.
type Loop struct{}

// New returns a loop that takes no streams.
func New(*slog.Logger) *Loop { return &Loop{} }

// Len is always 0.
func (l *Loop) Len() int { return 0 }

// Add closes both connections and returns ErrUnsupported.
func (l *Loop) Add(s Stream) error {
	_ = s.Client.Close()
	_ = s.Upstream.Close()
	return ErrUnsupported
}

// Close does nothing.
func (l *Loop) Close() error { return nil }
