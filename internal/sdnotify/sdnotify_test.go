package sdnotify

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// listen opens a unixgram socket at addr, points NOTIFY_SOCKET at it and
// returns a function that reads the next datagram, failing after a deadline.
func listen(t *testing.T, addr string) func() string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %q: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", addr)
	return func() string {
		t.Helper()
		if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			t.Fatalf("read datagram: %v", err)
		}
		return string(buf[:n])
	}
}

func TestSendsExactDatagramsToPathSocket(t *testing.T) {
	next := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	for _, tc := range []struct {
		name string
		send func() error
		want string
	}{
		{"Ready", Ready, "READY=1"},
		{"Status", func() error { return Status("serving 3 instances") }, "STATUS=serving 3 instances"},
		{"Status with newlines", func() error { return Status("draining\nREADY=1\r\n") }, "STATUS=draining READY=1 "},
		{"Watchdog", Watchdog, "WATCHDOG=1"},
		{"Stopping", Stopping, "STOPPING=1"},
		{"Send several", func() error { return Send("STATUS=x\nERRNO=5") }, "STATUS=x\nERRNO=5"},
	} {
		if err := tc.send(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := next(); got != tc.want {
			t.Errorf("%s sent %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestReloadingSendsMonotonicTimestamp(t *testing.T) {
	next := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	before, err := monotonicUsec()
	if err != nil {
		t.Fatalf("CLOCK_MONOTONIC unreadable (pinnedd targets Linux): %v", err)
	}
	if err := Reloading(); err != nil {
		t.Fatal(err)
	}
	after, _ := monotonicUsec()
	got := next()
	var usec uint64
	const prefix = "RELOADING=1\nMONOTONIC_USEC="
	if len(got) <= len(prefix) || got[:len(prefix)] != prefix {
		t.Fatalf("Reloading sent %q, want %q<usec>", got, prefix)
	}
	usec, err = strconv.ParseUint(got[len(prefix):], 10, 64)
	if err != nil {
		t.Fatalf("Reloading sent %q: %v", got, err)
	}
	if usec == 0 || usec < before || usec > after {
		t.Errorf("MONOTONIC_USEC=%d, want within [%d, %d]", usec, before, after)
	}
}

func TestLargeDatagramArrivesWhole(t *testing.T) {
	next := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	msg := make([]byte, 32<<10)
	for i := range msg {
		msg[i] = 'a' + byte(i%26)
	}
	if err := Status(string(msg)); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "STATUS="+string(msg) {
		t.Errorf("got %d bytes, want %d", len(got), len("STATUS=")+len(msg))
	}
}

func TestUnsetSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	for name, send := range map[string]func() error{
		"Ready": Ready, "Stopping": Stopping, "Reloading": Reloading, "Watchdog": Watchdog,
		"Status": func() error { return Status("x") }, "Send": func() error { return Send("READY=1") },
		"Send empty": func() error { return Send("") },
	} {
		if err := send(); err != nil {
			t.Errorf("%s with NOTIFY_SOCKET unset: %v, want nil", name, err)
		}
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Ready(); err != nil {
		t.Errorf("Ready with NOTIFY_SOCKET empty: %v, want nil", err)
	}
}

func TestErrors(t *testing.T) {
	t.Run("nobody listening", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "gone.sock")
		t.Setenv("NOTIFY_SOCKET", sock)
		err := Ready()
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Ready to a missing socket: %v, want an error wrapping fs.ErrNotExist", err)
		}
	})
	for _, bad := range []string{"relative.sock", "@", "vsock:2:1234"} {
		t.Run("bad address "+bad, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", bad)
			if err := Ready(); !errors.Is(err, ErrBadSocket) {
				t.Fatalf("Ready with NOTIFY_SOCKET=%q: %v, want ErrBadSocket", bad, err)
			}
		})
	}
	t.Run("empty state", func(t *testing.T) {
		listen(t, filepath.Join(t.TempDir(), "notify.sock"))
		if err := Send(""); !errors.Is(err, ErrEmptyState) {
			t.Fatalf("Send(\"\"): %v, want ErrEmptyState", err)
		}
	})
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	other := strconv.Itoa(os.Getpid() + 1)
	for _, tc := range []struct {
		name       string
		usec, pid  string // "-" leaves the variable unset
		want       time.Duration
		wantActive bool
	}{
		{"unset", "-", "-", 0, false},
		{"30s, no pid", "30000000", "-", 30 * time.Second, true},
		{"30s, our pid", "30000000", self, 30 * time.Second, true},
		{"500ms, empty pid", "500000", "", 500 * time.Millisecond, true},
		{"another process's watchdog", "30000000", other, 0, false},
		{"malformed pid", "30000000", "n1", 0, false},
		{"zero", "0", self, 0, false},
		{"malformed usec", "30s", self, 0, false},
		{"negative usec", "-1", "-", 0, false},
		{"overflowing usec", "18446744073709551615", "-", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setOrUnset(t, "WATCHDOG_USEC", tc.usec)
			setOrUnset(t, "WATCHDOG_PID", tc.pid)
			got, active := WatchdogInterval()
			if got != tc.want || active != tc.wantActive {
				t.Fatalf("WatchdogInterval() = %v, %v; want %v, %v", got, active, tc.want, tc.wantActive)
			}
		})
	}
}

func setOrUnset(t *testing.T, key, value string) {
	t.Setenv(key, value) // restores the old value after the test
	if value == "-" {
		os.Unsetenv(key)
	}
}
