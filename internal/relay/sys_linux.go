//go:build linux

package relay

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loops' reads, writes and epoll polls go to the kernel without the
// scheduler's syscall bookkeeping (entersyscall/exitsyscall): every
// descriptor they touch is non-blocking, and a poll waits at most a held
// wait's bound (epollHold). Only an idle loop's wait (epollBlock) goes
// through the bookkeeping, so that its P can be taken back. The
// bookkeeping, and the sysmon wake-up a syscall entry costs, are a large
// share of a forwarded request's CPU (DESIGN.md).

func sysRead(fd int, p []byte) (int, error) { return rawIO(unix.SYS_READ, fd, p) }

func sysWrite(fd int, p []byte) (int, error) { return rawIO(unix.SYS_WRITE, fd, p) }

// rawIO is read(2) or write(2) (trap) of p on fd.
func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// epollNow returns the events ready now, without waiting.
func epollNow(epfd int, events []unix.EpollEvent) (int, error) { return epollHold(epfd, events, 0) }

// epollHold waits up to msec milliseconds for events in epoll_wait with
// the thread's P kept (see life).
func epollHold(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	return epollResult(unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0))
}

// epollBlock is epollHold through the scheduler's syscall path: the P can
// be taken back while the thread waits (see life).
func epollBlock(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	return epollResult(unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0))
}

func epollResult(n, _ uintptr, e syscall.Errno) (int, error) {
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
