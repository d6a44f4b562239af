package statestore

import "time"

// NewTestMonitor is NewMonitor on a clock of the test's own.
func NewTestMonitor(cfg MonitorConfig, now func() time.Time) *Monitor {
	cfg.now = now
	return NewMonitor(cfg)
}
