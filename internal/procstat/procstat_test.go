package procstat

import (
	"os"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	// Burn some CPU so the percentage has something to show.
	deadline := time.Now().Add(150 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	s := Read()
	if s.RSSBytes < 1<<20 || s.UptimeMs < 0 || s.CPUPercent <= 0 || s.CPUPercent > 400 {
		t.Fatalf("implausible sample %+v (spun %d)", s, x)
	}
	if self, byPID := cpuTime(), CPUOf(os.Getpid()); byPID < 100*time.Millisecond || byPID < self {
		t.Fatalf("CPUOf(own pid) = %s, own CPU read before it %s", byPID, self)
	}
}
