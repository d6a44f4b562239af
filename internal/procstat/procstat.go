// Package procstat reads this process's resource use from /proc: uptime,
// resident memory and CPU, for the stats pinnedd reports per worker (and
// other processes' CPU, for benchmarks).
package procstat

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"time"
)

// clockTicks is USER_HZ, 100 on every Linux pinnedd targets.
const clockTicks = 100

var (
	start = time.Now()

	mu       sync.Mutex
	lastAt   time.Time
	lastCPU  time.Duration
	lastPerc float64
)

// Sample is one reading.
type Sample struct {
	UptimeMs   int64   `json:"uptimeMs"`
	RSSBytes   int64   `json:"rssBytes"`
	CPUPercent float64 `json:"cpuPercent"` // since the previous Read (or start), 100 = one core
}

// Read samples the process now.
func Read() Sample {
	now := time.Now()
	s := Sample{UptimeMs: now.Sub(start).Milliseconds(), RSSBytes: rss()}
	cpu := cpuTime()
	mu.Lock()
	defer mu.Unlock()
	from, fromCPU := lastAt, lastCPU
	if from.IsZero() {
		from, fromCPU = start, 0
	}
	if el := now.Sub(from); el >= 100*time.Millisecond {
		lastPerc = 100 * float64(cpu-fromCPU) / float64(el)
		lastAt, lastCPU = now, cpu
	}
	s.CPUPercent = lastPerc
	return s
}

func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * int64(os.Getpagesize())
}

func cpuTime() time.Duration { return cpuFrom("/proc/self/stat") }

// CPUOf is the user and system CPU time process pid has used, all its
// threads; 0 if it cannot be read (gone, or not Linux).
func CPUOf(pid int) time.Duration { return cpuFrom("/proc/" + strconv.Itoa(pid) + "/stat") }

func cpuFrom(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields overall.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
	st, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}
