package procstat

import (
	"os"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	// Burn CPU until this process has used 150 ms of it (counted, not
	// timed: on a loaded machine a wall-clock spin gets less), so the
	// percentage and CPUOf have something to show.
	deadline := time.Now().Add(time.Minute)
	x := 0
	for cpuTime() < 150*time.Millisecond && time.Now().Before(deadline) {
		for i := 0; i < 1e5; i++ {
			x++
		}
	}
	s := Read()
	if s.RSSBytes < 1<<20 || s.UptimeMs < 0 || s.CPUPercent <= 0 || s.CPUPercent > 400 {
		t.Fatalf("implausible sample %+v (spun %d)", s, x)
	}
	if self, byPID := cpuTime(), CPUOf(os.Getpid()); byPID < 100*time.Millisecond || byPID < self {
		t.Fatalf("CPUOf(own pid) = %s, own CPU read before it %s", byPID, self)
	}
}
