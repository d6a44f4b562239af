package raftstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory, unmounted at cleanup (after
// the nodes using it are closed: cleanups run last-registered first).
func mountTmpfs(t testing.TB, size int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs on %s (the test needs root): %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill allocates a file in dir leaving about leave bytes free, and returns its path.
func fill(t testing.TB, dir string, leave uint64) string {
	t.Helper()
	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if free > leave {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(free-leave)); err != nil {
			t.Fatalf("fallocate filler: %v", err)
		}
	}
	return path
}

// recordingHandler keeps the messages of records at ERROR.
type recordingHandler struct {
	mu   sync.Mutex
	errs []string
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, r.Message)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) count(sub string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.errs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

const faultMsg = "raft log storage failed"

// applyUntilFault applies 4 KiB commands through via until victim reports its storage fault,
// and returns every command that was acknowledged.
func applyUntilFault(t *testing.T, via, victim *testNode) ([]string, error) {
	t.Helper()
	var acked []string
	pad := strings.Repeat("x", 4<<10)
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		select {
		case err := <-victim.s.Fatal():
			return acked, err
		default:
		}
		cmd := fmt.Sprintf("%05d-%s", i, pad)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := via.s.Apply(ctx, []byte(cmd))
		cancel()
		if err == nil {
			acked = append(acked, cmd)
		}
	}
	t.Fatalf("%s reported no storage fault after %d commands", victim.id, len(acked))
	return nil, nil
}

// A follower whose disk fills reports a storage fault once (no silent wedge), refuses work and
// shuts down in bounded time while the others keep committing; after space is freed, the same
// data dir reopens (its current segment reserved again) and catches up.
func TestFollowerFullDiskIsFatal(t *testing.T) {
	rec := &recordingHandler{}
	n1 := startNode(t, "n1", t.TempDir(), "", true, nil)
	waitLeader(t, n1)
	tmp := mountTmpfs(t, 10<<20) // fitted segment: 1 MiB
	n2 := startNode(t, "n2", tmp, "", false, func(c *Config) { c.Logger = slog.New(rec) })
	join(t, n1.srv.URL, n2)
	n3 := startNode(t, "n3", t.TempDir(), "", false, nil)
	join(t, n1.srv.URL, n3)
	leader := leaderOf(t, []*testNode{n1, n2, n3})
	if leader != n1 {
		t.Fatalf("leader %s, want n1", leader.id)
	}
	filler := fill(t, tmp, 64<<10)

	acked, ferr := applyUntilFault(t, n1, n2)
	t.Logf("fault after %d commands: %v", len(acked), ferr)
	if !errors.Is(ferr, ErrStorageFault) || !strings.Contains(ferr.Error(), filepath.Join(tmp, "raft", "wal")) {
		t.Fatalf("fault %v: want ErrStorageFault naming the WAL dir", ferr)
	}
	if !errors.Is(n2.s.Fault(), ErrStorageFault) {
		t.Fatalf("Fault() = %v after the fatal report", n2.s.Fault())
	}
	// The faulty node refuses work; the others carry on.
	if _, err := n2.s.Apply(ctxTimeout(t, 5*time.Second), []byte("refused")); !errors.Is(err, ErrStorageFault) {
		t.Fatalf("apply on the faulty node: %v, want ErrStorageFault", err)
	}
	for i := range 20 {
		acked = append(acked, mustApply(t, n3, fmt.Sprintf("after-%d", i)))
	}
	if n := rec.count(faultMsg); n != 1 {
		t.Fatalf("%d %q ERROR lines, want 1: %q", n, faultMsg, rec.errs)
	}
	raftAddr := n2.s.RaftAddr()
	start := time.Now()
	n2.close()
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("closing the faulty node took %v", d)
	}

	// Free the space and restart with the same data dir.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n2b := startNode(t, "n2", tmp, raftAddr, false, nil)
	if !n2b.s.HadExistingState() {
		t.Fatal("restarted node lost its state")
	}
	want := n1.sm.list()
	if len(want) < len(acked)-20 { // acked holds Apply results for the "after" ones; compare counts only
		t.Fatalf("leader has %d entries, %d acknowledged", len(want), len(acked))
	}
	converged(t, []*testNode{n1, n3}, want)
	testutil.WaitForErr(t, 20*time.Second, "n2 caught up", func() error {
		if got := n2b.sm.list(); len(got) != len(want) {
			return fmt.Errorf("n2 has %d entries, want %d", len(got), len(want))
		}
		return nil
	})
	mustApply(t, n2b, "after-restart")
	converged(t, []*testNode{n1, n2b, n3}, n1.sm.list())
	assertTailReserved(t, filepath.Join(tmp, "raft", "wal"))
}

// assertTailReserved checks that the newest segment file has its blocks allocated.
func assertTailReserved(t *testing.T, walDir string) {
	t.Helper()
	files, err := segmentFiles(walDir)
	if err != nil || len(files) == 0 {
		t.Fatalf("segments in %s: %v %v", walDir, files, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(walDir, files[len(files)-1]), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 < walSegmentMin {
		t.Fatalf("current segment %s has %d bytes allocated, want its whole size", files[len(files)-1], st.Blocks*512)
	}
}

// A leader whose disk fills reports the fault and loses leadership; the others elect a leader
// and keep committing.
func TestLeaderFullDiskIsFatal(t *testing.T) {
	tmp := mountTmpfs(t, 10<<20)
	n1 := startNode(t, "n1", tmp, "", true, nil)
	waitLeader(t, n1)
	n2 := startNode(t, "n2", t.TempDir(), "", false, nil)
	join(t, n1.srv.URL, n2)
	n3 := startNode(t, "n3", t.TempDir(), "", false, nil)
	join(t, n1.srv.URL, n3)
	waitLeader(t, n3)
	filler := fill(t, tmp, 64<<10)

	if _, err := applyUntilFault(t, n2, n1); !errors.Is(err, ErrStorageFault) {
		t.Fatalf("fault %v", err)
	}
	raftAddr := n1.s.RaftAddr()
	n1.close()
	leader := leaderOf(t, []*testNode{n2, n3})
	mustApply(t, leader, "after")
	mustApply(t, followerOf([]*testNode{n2, n3}, leader), "after-via-follower")

	// Restarted with space freed, it catches up and takes writes (a seal the full disk cut
	// short must not reopen as "segment is sealed").
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n1b := startNode(t, "n1", tmp, raftAddr, true, nil)
	mustApply(t, n1b, "after-restart")
	converged(t, []*testNode{n1b, n2, n3}, leader.sm.list())
	if err := n1b.s.Fault(); err != nil {
		t.Fatalf("restarted node: %v", err)
	}
}

// A fresh data dir on a disk too small for the log fails with what it needs and leaves nothing;
// with space freed the same dir starts, its segment fitted to the disk.
func TestSmallDiskStart(t *testing.T) {
	tmp := mountTmpfs(t, 16<<20)
	filler := fill(t, tmp, 4<<20)
	_, err := Open(context.Background(), fastConfig(Config{
		NodeID: "n1", RaftAddr: "127.0.0.1:0", APIAddr: "http://x", DataDir: tmp, Bootstrap: true,
	}), &listSM{})
	walDir := filepath.Join(tmp, "raft", "wal")
	if !errors.Is(err, ErrInsufficientSpace) || !strings.Contains(err.Error(), "needs 8.0 MiB free in "+walDir+", has ") {
		t.Fatalf("open on a small disk: %v, want ErrInsufficientSpace with what it needs", err)
	}
	if ents, _ := os.ReadDir(walDir); len(ents) != 0 {
		t.Fatalf("a failed start left %d files in %s", len(ents), walDir)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "n1", tmp, "", true, nil)
	waitLeader(t, n)
	mustApply(t, n, "a")
	files, _ := segmentFiles(walDir)
	if len(files) != 1 {
		t.Fatalf("segments %v", files)
	}
	fi, err := os.Stat(filepath.Join(walDir, files[0]))
	if err != nil || fi.Size() != 2<<20 {
		t.Fatalf("segment on a 16 MiB disk: %v %v, want 2 MiB", fi.Size(), err)
	}
}

// raft-wal's own failed first start (a segment it could not preallocate) leaves a meta store
// naming a 0-byte segment, which a later open would reuse unreserved. Open recognises a WAL
// that never held an entry and creates it afresh, fitted to the disk.
func TestFailedFirstStartLeavesNothingMisread(t *testing.T) {
	tmp := mountTmpfs(t, 16<<20)
	walDir := filepath.Join(tmp, "raft", "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// What raft-wal leaves when asked for a segment bigger than the disk.
	_, _, err := openWAL(walDir, 64<<20, hclog.NewNullLogger())
	if !errors.Is(err, ErrInsufficientSpace) {
		t.Fatalf("open with 64 MiB segments on 16 MiB: %v", err)
	}
	if ents, _ := os.ReadDir(walDir); len(ents) != 0 {
		t.Fatalf("refused open left %d files", len(ents))
	}
	leftover(t, walDir)
	files, _ := segmentFiles(walDir)
	if fi, err := os.Stat(filepath.Join(walDir, files[0])); err != nil || fi.Size() != 0 {
		t.Fatalf("left-over segment: %v", err)
	}

	n := startNode(t, "n1", tmp, "", true, nil)
	waitLeader(t, n)
	mustApply(t, n, "a")
	files, _ = segmentFiles(walDir)
	if len(files) != 1 {
		t.Fatalf("segments %v", files)
	}
	if fi, err := os.Stat(filepath.Join(walDir, files[0])); err != nil || fi.Size() != 2<<20 {
		t.Fatalf("segment after the failed start: %v, want a fresh 2 MiB one", err)
	}
	assertTailReserved(t, walDir)
}

// leftover runs raft-wal's own Open with a segment bigger than the disk, as pinnedd did before
// it checked: it fails with ENOSPC after recording the segment in its meta store.
func leftover(t *testing.T, walDir string) {
	t.Helper()
	meta := &metadb.BoltMetaDB{}
	_, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(64<<20))
	_ = meta.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("raft-wal open with 64 MiB segments on 16 MiB: %v, want ENOSPC", err)
	}
}

// A seal cut short (the index frame written after the last commit, the commit itself lost) must
// not reopen as a sealed segment: raft-wal's recovery would refuse every append. Open clears
// what follows the last commit; the committed entries stay.
func TestUncommittedSealIsCleared(t *testing.T) {
	walDir := t.TempDir()
	_, meta, err := openWAL(walDir, walSegmentMin, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	_ = meta.Close()
	w, meta, err := openWAL(walDir, walSegmentMin, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Data: []byte(fmt.Sprintf("entry-%d", i))})
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	_ = meta.Close()

	// Append an index frame after the data, as a seal whose commit never made it does.
	files, _ := segmentFiles(walDir)
	path := filepath.Join(walDir, files[len(files)-1])
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	end := int64(walFileHeaderLen)
	for end+walFrameHeaderLen <= int64(len(data)) && data[end] != 0 {
		n := int64(binary.LittleEndian.Uint32(data[end+4 : end+8]))
		if data[end] == walFrameCommit {
			n = 0
		}
		end += walFrameHeaderLen + n + (walFrameHeaderLen-n%walFrameHeaderLen)%walFrameHeaderLen
	}
	frame := make([]byte, walFrameHeaderLen+40)
	frame[0] = walFrameIndex
	binary.LittleEndian.PutUint32(frame[4:8], 40)
	for i := walFrameHeaderLen; i < len(frame); i++ {
		frame[i] = 0xab
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(frame, end); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	w, meta, err = openWAL(walDir, walSegmentMin, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	defer w.Close()
	if last, _ := w.LastIndex(); last != 10 {
		t.Fatalf("last index %d after reopen, want 10", last)
	}
	if err := w.StoreLogs([]*raft.Log{{Index: 11, Term: 1, Data: []byte("entry-11")}}); err != nil {
		t.Fatalf("append after a cut-short seal: %v", err)
	}
	var got raft.Log
	if err := w.GetLog(5, &got); err != nil || string(got.Data) != "entry-5" {
		t.Fatalf("entry 5: %q %v", got.Data, err)
	}
}
