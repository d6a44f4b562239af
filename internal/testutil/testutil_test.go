package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// holdPortEnv makes this test binary a helper process (see TestMain):
// it takes the one port it names through freeAddr, prints it, and keeps it
// until its stdin closes.
const holdPortEnv = "TESTUTIL_HOLD_PORT"

func TestMain(m *testing.M) {
	if p := os.Getenv(holdPortEnv); p != "" {
		port, _ := strconv.Atoi(p)
		freePorts = func() (int, int) { return port, port + 1 }
		addr, err := freeAddr()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("held", addr)
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A port FreeAddr gave one test process is not given to another while the
// first runs (go test runs packages' binaries in parallel), and is free
// for others again once it ended.
func TestFreeAddrAcrossProcesses(t *testing.T) {
	lo, hi := freePorts()
	port := 0
	for p := lo + int(time.Now().UnixNano()%int64(hi-lo)); port == 0; p = lo + (p-lo+1)%(hi-lo) {
		lock, ok := lockPort(p) // no other test process's
		if !ok {
			continue
		}
		lock.Close()
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			ln.Close()
			port = p
		}
	}
	orig := freePorts
	freePorts = func() (int, int) { return port, port + 1 }
	defer func() { freePorts = orig }()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdPortEnv+"="+strconv.Itoa(port))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	want := "held " + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("helper process: %q %v, want %q", line, err, want)
	}

	if addr, err := freeAddr(); err == nil {
		t.Fatalf("FreeAddr gave %s, which another test process holds", addr)
	}

	stdin.Close() // the helper ends, and its claim with it
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper process: %v", err)
	}
	exited = true
	addr, err := freeAddr()
	if err != nil {
		t.Fatalf("the port is not free again once its holder ended: %v", err)
	}
	if addr != net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) {
		t.Fatalf("FreeAddr gave %s, want the only port of its range, %d", addr, port)
	}
}
