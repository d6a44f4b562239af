package sdnotify

import (
	"syscall"
	"unsafe"
)

// clockMonotonic is CLOCK_MONOTONIC from <linux/time.h>.
const clockMonotonic = 1

// monotonicUsec reads CLOCK_MONOTONIC in microseconds, the clock systemd
// compares MONOTONIC_USEC against. Go's own monotonic readings are relative
// to process start, so the clock is read with clock_gettime(2) directly.
func monotonicUsec() (uint64, error) {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, errno
	}
	return uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3, nil
}
