// Package sdnotify speaks systemd's service notification protocol
// (sd_notify(3)) without libsystemd: it owns turning pinnedd's lifecycle
// (ready, reloading plugins, stopping, watchdog pings, a status line) into
// datagrams on the socket named by NOTIFY_SOCKET, and reading the watchdog
// interval systemd asks for.
//
// It must never decide when pinnedd is ready or stopping — the agent calls it
// at those moments — and it must never fail a process that is not running
// under systemd: with NOTIFY_SOCKET unset every call is a no-op returning nil.
//
// The environment is left alone, so plugin processes inherit NOTIFY_SOCKET;
// the unit's NotifyAccess=main makes systemd ignore anything they send.
package sdnotify

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrBadSocket: NOTIFY_SOCKET is set but names neither an absolute path
	// nor an abstract socket ('@' prefix). vsock addresses (systemd ≥ 253,
	// for services in VMs) are not supported.
	ErrBadSocket = errors.New("sdnotify: NOTIFY_SOCKET is neither an absolute path nor an abstract socket")
	// ErrEmptyState: Send was called with nothing to say.
	ErrEmptyState = errors.New("sdnotify: empty state")
)

// writeTimeout bounds one datagram: a wedged PID 1 must not stall a drain.
const writeTimeout = 2 * time.Second

// Send writes state — newline-separated KEY=VALUE assignments, e.g.
// "READY=1" — as one datagram to NOTIFY_SOCKET. It returns nil without doing
// anything when NOTIFY_SOCKET is unset or empty. Safe for concurrent use.
func Send(state string) error {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return nil
	}
	if state == "" {
		return ErrEmptyState
	}
	addr, err := socketAddr(sock)
	if err != nil {
		return err
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return fmt.Errorf("sdnotify: dial NOTIFY_SOCKET %q: %w", sock, err)
	}
	defer conn.Close()
	if err := conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return fmt.Errorf("sdnotify: set write deadline: %w", err)
	}
	n, err := conn.Write([]byte(state))
	if err != nil {
		return fmt.Errorf("sdnotify: send %q to %q: %w", firstLine(state), sock, err)
	}
	if n != len(state) {
		return fmt.Errorf("sdnotify: send %q to %q: wrote %d of %d bytes: %w", firstLine(state), sock, n, len(state), io.ErrShortWrite)
	}
	return nil
}

// socketAddr turns NOTIFY_SOCKET into a unixgram address. A leading '@'
// names an abstract socket; the net package maps it to the leading NUL byte.
func socketAddr(sock string) (*net.UnixAddr, error) {
	switch {
	case strings.HasPrefix(sock, "/"):
		return &net.UnixAddr{Name: sock, Net: "unixgram"}, nil
	case strings.HasPrefix(sock, "@") && len(sock) > 1:
		return &net.UnixAddr{Name: sock, Net: "unixgram"}, nil
	default:
		return nil, fmt.Errorf("%w: %q", ErrBadSocket, sock)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + "…"
	}
	return s
}

// Ready tells systemd start-up is finished (READY=1): for Type=notify units,
// systemctl start returns and ordered units start only after this.
func Ready() error { return Send("READY=1") }

// Stopping tells systemd the service has begun shutting down (STOPPING=1).
func Stopping() error { return Send("STOPPING=1") }

// Reloading tells systemd a reload has begun: RELOADING=1 together with
// MONOTONIC_USEC (CLOCK_MONOTONIC now, in µs), which systemd ≥ 253 requires
// for Type=notify-reload to match the later READY=1 to this reload. Send
// Ready once the reload is done.
func Reloading() error {
	usec, err := monotonicUsec()
	if err != nil {
		return fmt.Errorf("sdnotify: read CLOCK_MONOTONIC: %w", err)
	}
	return Send("RELOADING=1\nMONOTONIC_USEC=" + strconv.FormatUint(usec, 10))
}

// Status sets the free-form status line shown by systemctl status
// (STATUS=msg). Newlines in msg would start a new assignment, so they become
// spaces.
func Status(msg string) error {
	return Send("STATUS=" + strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(msg))
}

// Watchdog pings the service watchdog (WATCHDOG=1). Call it at about half of
// WatchdogInterval, and only from a loop that proves the service works.
func Watchdog() error { return Send("WATCHDOG=1") }

// WatchdogInterval reports the watchdog timeout systemd set for this process
// (WatchdogSec= in the unit, passed as WATCHDOG_USEC) and whether the watchdog
// is on. It is off when WATCHDOG_USEC is unset, zero or malformed, or when
// WATCHDOG_PID is set and names another process (the variables were inherited
// from a parent). Ping at half the interval, as sd_watchdog_enabled(3) advises.
func WatchdogInterval() (time.Duration, bool) {
	usecStr := os.Getenv("WATCHDOG_USEC")
	if usecStr == "" {
		return 0, false
	}
	usec, err := strconv.ParseUint(usecStr, 10, 64)
	if err != nil || usec == 0 || usec > uint64(1<<63-1)/uint64(time.Microsecond) {
		return 0, false
	}
	if pidStr := os.Getenv("WATCHDOG_PID"); pidStr != "" {
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid != os.Getpid() {
			return 0, false
		}
	}
	return time.Duration(usec) * time.Microsecond, true
}
