package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// Storage faults with real disks: a data dir on a small tmpfs.

// mountTmpfs mounts a tmpfs of size bytes on dir (created if needed), unmounted at cleanup:
// registered after the node using dir, it runs after that node is stopped.
func mountTmpfs(t *testing.T, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs on %s (the test needs root): %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fillDisk allocates a file in dir leaving about leave bytes free; removing it frees the space.
func fillDisk(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if free > leave {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-leave); err != nil {
			t.Fatalf("fallocate filler: %v", err)
		}
	}
	return path
}

// storageFaultMsg starts raftstore's one ERROR line for a storage fault (the error it carries
// shows up in other lines too, e.g. raft's own "failed to commit logs").
const storageFaultMsg = `"msg":"raft log storage failed`

// longID is a new instance id per n, as long as ids go (256 bytes): each placement is a Raft
// entry, and long ones fill the log's segment sooner.
func longID(prefix string, n int64) string {
	s := fmt.Sprintf("%s-%08d-", prefix, n)
	return s + strings.Repeat("x", 256-len(s))
}

// placeUntilExit places new ids through the nodes in via (concurrently) until victim's
// process exits, and returns its exit code.
func placeUntilExit(t *testing.T, victim *node, via ...*node) int {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next, ok atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := via[w%len(via)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := testutil.Do(ctx, "GET", n.url()+"/counters/"+longID("fill", next.Add(1))+"/value", "",
					map[string]string{"Authorization": "Bearer " + testutil.Token})
				cancel()
				if err == nil && r.Code == 200 {
					ok.Add(1)
				}
			}
		}()
	}
	code, err := victim.a.Wait(3 * time.Minute)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("%s did not exit after its disk filled (%d ids placed): %v", victim.id, ok.Load(), err)
	}
	t.Logf("%s exited %d after %d ids placed", victim.id, code, ok.Load())
	return code
}

// servesNewIDs waits until a few new ids in a row answer 200 through n.
func servesNewIDs(t *testing.T, n *node, what string) {
	t.Helper()
	var i int64
	testutil.WaitFor(t, 30*time.Second, what, func() bool {
		for range 5 {
			i++
			r, err := n.a.Do("GET", "/counters/"+longID("serve-"+n.id, i)+"/value", "")
			if err != nil || r.Code != 200 {
				return false
			}
		}
		return true
	})
}

// caughtUp waits until n follows the same leader as ref and has applied about as much.
func caughtUp(t *testing.T, n, ref *node) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, n.id+" catches up", func() bool {
		h, hr := health(t, n), health(t, ref)
		if h == nil || hr == nil || h["leader"] == "" || h["leader"] != hr["leader"] {
			return false
		}
		a, _ := h["appliedIndex"].(float64)
		b, _ := hr["appliedIndex"].(float64)
		return a >= b-3
	})
}

// A follower whose data dir fills: its Raft log append fails, it says so once and exits
// non-zero (fail-stop, no silent wedge); the fleet serves through the other nodes; with space
// freed, the same command line brings it back, caught up and serving.
func TestFollowerDiskFullExitsAndRecovers(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap").start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url())
	mountTmpfs(t, n2.dir, 12<<20) // the log's segment is fitted to 1 MiB
	n2.start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFor(t, 20*time.Second, "3 voters", func() bool { return memberSummary(members(t, n1)) == "n1* n2 n3" })

	filler := fillDisk(t, n2.dir, 256<<10)
	code := placeUntilExit(t, n2, n1, n3)
	logs := n2.a.Logs()
	if code == 0 {
		t.Fatalf("a node whose log cannot be written exits non-zero, got 0")
	}
	if c := strings.Count(logs, storageFaultMsg); c != 1 {
		t.Fatalf("%q logged %d times, want once", storageFaultMsg, c)
	}
	line, _ := n2.a.WaitLog(time.Second, storageFaultMsg)
	if !strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, "free space in "+filepath.Join(n2.dir, "raft", "wal")) {
		t.Fatalf("the fault's line says neither ERROR nor what to do: %s", line)
	}
	servesNewIDs(t, n1, "the fleet serves new ids without n2")
	servesNewIDs(t, n3, "the fleet serves new ids through n3")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n2.start(t, true)
	caughtUp(t, n2, n1)
	servesNewIDs(t, n2, "n2 serves again")
	if got := memberSummary(members(t, n2)); got != "n1* n2 n3" {
		t.Fatalf("members after n2's restart: %s", got)
	}
}

// The leader's data dir fills: it says so, exits non-zero and so loses leadership; the others
// elect a leader and keep serving; with space freed it comes back as a member.
func TestLeaderDiskFullExitsAndRecovers(t *testing.T) {
	t.Parallel()
	n1 := newNode(t, "n1", "--bootstrap")
	mountTmpfs(t, n1.dir, 12<<20)
	n1.start(t, true)
	n2 := newNode(t, "n2", "--join", n1.url()).start(t, true)
	n3 := newNode(t, "n3", "--join", n1.url()).start(t, true)
	testutil.WaitFor(t, 20*time.Second, "3 voters", func() bool { return memberSummary(members(t, n2)) == "n1* n2 n3" })

	filler := fillDisk(t, n1.dir, 256<<10)
	if code := placeUntilExit(t, n1, n2, n3); code == 0 {
		t.Fatalf("a leader whose log cannot be written exits non-zero, got 0")
	}
	if c := strings.Count(n1.a.Logs(), storageFaultMsg); c != 1 {
		t.Fatalf("%q logged %d times, want once", storageFaultMsg, c)
	}
	testutil.WaitFor(t, 20*time.Second, "a new leader", func() bool {
		h := health(t, n2)
		return h != nil && (h["leader"] == "n2" || h["leader"] == "n3")
	})
	servesNewIDs(t, n2, "the fleet serves new ids after the leader's exit")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n1.start(t, true)
	caughtUp(t, n1, n2)
	servesNewIDs(t, n1, "n1 serves again")
}

// A fresh node on a disk too small for its Raft log fails at once with what it needs, and
// leaves nothing a later start misreads: with space freed, the same command line starts.
func TestSmallDiskStart(t *testing.T) {
	t.Parallel()
	n := newNode(t, "s1", "--bootstrap")
	mountTmpfs(t, n.dir, 16<<20)
	filler := fillDisk(t, n.dir, 4<<20)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Bin(t, "pinnedd"), append([]string{"agent"}, n.args...)...)
	cmd.Env = append(os.Environ(), fleetEnv...)
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState == nil || cmd.ProcessState.ExitCode() <= 0 {
		t.Fatalf("start on a disk with 4 MiB free: %v, want a non-zero exit\n%s", err, out)
	}
	walDir := filepath.Join(n.dir, "raft", "wal")
	if want := "needs 8.0 MiB free in " + walDir + ", has "; !strings.Contains(string(out), want) {
		t.Fatalf("the failed start does not say %q:\n%s", want, out)
	}
	if ents, _ := os.ReadDir(walDir); len(ents) != 0 {
		t.Fatalf("the failed start left %d files in %s", len(ents), walDir)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n.start(t, true)
	servesNewIDs(t, n, "the node starts once space is freed")
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments %v", segs)
	}
	if fi, err := os.Stat(segs[0]); err != nil || fi.Size() > 2<<20 {
		t.Fatalf("the log's segment on a 16 MiB disk: %v, want one fitted to it (2 MiB)", err)
	}
}
