package harden

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// childEnv marks the re-executed test binary that hardens itself.
const childEnv = "PINNEDD_HARDEN_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// child makes itself non-dumpable and reports what the kernel then says:
// the setting, and who owns its /proc/self/environ.
func child() int {
	if err := NonDumpable(); err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	d, err := dumpable()
	if err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/environ", &st); err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	if d {
		os.Stdout.WriteString("dumpable ")
	}
	os.Stdout.WriteString("environ-uid=" + strconv.FormatUint(uint64(st.Uid), 10))
	return 0
}

// A process that calls NonDumpable is no longer dumpable, and the kernel
// hands its /proc entries to root. This test process itself stays as it
// was: the setting is process-wide, so a child takes it.
func TestNonDumpable(t *testing.T) {
	if d, err := dumpable(); err != nil || !d {
		t.Fatalf("the test process starts dumpable: %v %v", d, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
	if got := string(out); got != "environ-uid=0" {
		t.Errorf("child reports %q, want non-dumpable with /proc/self/environ owned by root (environ-uid=0)", got)
	}
}
