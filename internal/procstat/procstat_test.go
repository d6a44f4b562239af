package procstat

import (
	"os"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	// Burn CPU until this process has used 150 ms more of it (counted,
	// not timed: on a loaded machine a wall-clock spin gets less; and
	// more, not in all: with -count or -cpu each run must spin), so the
	// percentage since the previous Read and CPUOf have something to show.
	deadline := time.Now().Add(time.Minute)
	x := 0
	for base := cpuTime(); cpuTime()-base < 150*time.Millisecond && time.Now().Before(deadline); {
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
