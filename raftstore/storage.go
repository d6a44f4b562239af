package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// Storage faults are fail-stop; see "Storage faults" in DESIGN.md for why.

// faultStore fronts the log and stable store. The first write that fails is a storage fault:
// onFault hears of it once, and from then on every write is refused without touching the disk,
// because raft-wal's in-memory tail no longer matches its file after a failed append (it has
// counted the entries it could not write), so whatever a later write did would be wrong.
//
// A failed stable store write never returns: hashicorp/raft panics on one (setCurrentTerm), and
// acting on a term or vote that is not on disk could let this node vote twice in a term. The
// goroutine (raft's main loop) waits until the store shuts down and then ends through
// runtime.Goexit, which runs its defers, so raft's Shutdown still completes.
type faultStore struct {
	logStore
	onFault func(op string, err error)
	halt    <-chan struct{}
	failed  atomic.Bool
}

func (f *faultStore) write(op string, do func() error) error {
	if f.failed.Load() {
		return fmt.Errorf("%w: %s refused after an earlier failed write", ErrStorageFault, op)
	}
	err := do()
	if err == nil {
		return nil
	}
	if f.failed.CompareAndSwap(false, true) {
		f.onFault(op, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrStorageFault, op, err)
}

func (f *faultStore) StoreLog(l *raft.Log) error { return f.StoreLogs([]*raft.Log{l}) }

func (f *faultStore) StoreLogs(logs []*raft.Log) error {
	return f.write("append to the raft log", func() error { return f.logStore.StoreLogs(logs) })
}

func (f *faultStore) DeleteRange(min, max uint64) error {
	return f.write("delete from the raft log", func() error { return f.logStore.DeleteRange(min, max) })
}

func (f *faultStore) Set(key, val []byte) error {
	f.stable(f.write("write raft's stable store", func() error { return f.logStore.Set(key, val) }))
	return nil
}

func (f *faultStore) SetUint64(key []byte, val uint64) error {
	f.stable(f.write("write raft's stable store", func() error { return f.logStore.SetUint64(key, val) }))
	return nil
}

// stable parks the caller of a failed stable write until shutdown, then ends it (see faultStore).
func (f *faultStore) stable(err error) {
	if err == nil {
		return
	}
	<-f.halt
	runtime.Goexit()
}

// IsMonotonic passes the WAL's promise on (raft checks it on the store it is given).
func (f *faultStore) IsMonotonic() bool {
	m, ok := f.logStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// WAL sizing. A new WAL's segment is fitted to the disk: an eighth of the free space, whole MiB,
// between 1 and 64 MiB (raft-wal's default). The rest of the free space holds what the log
// needs besides its current segment: the next segment at rotation, the segments a snapshot has
// not yet compacted (TrailingLogs entries are kept behind it), snapshots, and the meta store.
const (
	walSegmentMax   = 64 << 20
	walSegmentMin   = 1 << 20
	walSpaceFactor  = 8
	walMinFreeSpace = walSegmentMin * walSpaceFactor
)

// raft's stable store keys: one of them is written before the first entry is stored.
var raftStableKeys = []string{"CurrentTerm", "LastVoteTerm", "LastVoteCand"}

func fitSegment(free uint64) int {
	s := free / walSpaceFactor &^ (1<<20 - 1)
	return int(min(max(s, walSegmentMin), walSegmentMax))
}

// freeBytes is the space available in dir's file system to an unprivileged writer.
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("raftstore: statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func noSpace(dir string, need, has uint64, what string) error {
	return fmt.Errorf("%w: needs %s free in %s, has %s (%s); free space there or give the node a bigger disk",
		ErrInsufficientSpace, mib(need), dir, mib(has), what)
}

// openWAL opens (or creates) the WAL in walDir. want is Config.WALSegmentSize (0: fitted).
//
// A new WAL is created only if the disk has room for it (else ErrInsufficientSpace, having
// created nothing). An existing WAL's current segment is re-reserved: raft-wal preallocates a
// segment only when it creates the file, so a segment whose preallocation failed (a start or a
// rotation on a full disk leaves it 0 bytes, recorded in the meta store) would be reused without
// reserved space. A WAL that never held an entry (a failed first start) is removed and created
// afresh, so its segment gets the size that fits now.
func openWAL(walDir string, want int, log hclog.Logger) (*raftwal.WAL, *metadb.BoltMetaDB, error) {
	meta := &metadb.BoltMetaDB{}
	fail := func(err error) (*raftwal.WAL, *metadb.BoltMetaDB, error) {
		_ = meta.Close()
		return nil, nil, err
	}
	_, err := os.Stat(filepath.Join(walDir, metadb.FileName))
	fresh := errors.Is(err, os.ErrNotExist)
	if !fresh {
		ps, err := meta.Load(walDir)
		if err != nil {
			return fail(fmt.Errorf("raftstore: reading WAL meta in %s: %w", walDir, err))
		}
		unused, err := walNeverUsed(walDir, meta, ps.Segments)
		if err != nil {
			return fail(err)
		}
		if unused {
			_ = meta.Close()
			meta = &metadb.BoltMetaDB{}
			if err := clearWAL(walDir); err != nil {
				return fail(err)
			}
			log.Warn("removed a raft log that never held an entry (left by a failed start); creating it again", "dir", walDir)
			fresh = true
		} else {
			if err := scrubTail(walDir, ps.Segments, log); err != nil {
				return fail(err)
			}
			if err := reserveTail(walDir, ps.Segments); err != nil {
				return fail(err)
			}
		}
	}
	free, err := freeBytes(walDir)
	if err != nil {
		return fail(err)
	}
	size := want
	if size <= 0 {
		size = fitSegment(free)
	}
	if fresh {
		need, what := uint64(walMinFreeSpace), "a new raft log fits its segment to an eighth of the free space, at least 1 MiB"
		if want > 0 {
			need, what = 2*uint64(want), fmt.Sprintf("a new raft log with %s segments needs room for two", mib(uint64(want)))
		}
		if free < need {
			return fail(noSpace(walDir, need, free, what))
		}
		log.Info("creating the raft log", "dir", walDir, "segment_size", size, "free_bytes", free)
	}
	w, err := raftwal.Open(walDir, raftwal.WithLogger(log), raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(size))
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			free, _ := freeBytes(walDir)
			return fail(noSpace(walDir, uint64(size), free, fmt.Sprintf("opening the raft log: %v", err)))
		}
		return fail(fmt.Errorf("raftstore: opening WAL log store: %w", err))
	}
	return w, meta, nil
}

// walNeverUsed reports whether the WAL in walDir never held anything: raft's stable store has
// no term or vote (raft writes the term before it stores any entry), no segment is sealed, and
// every segment file is empty or all zeros (a committed entry is written with a non-zero header
// and fsynced before it is acknowledged).
func walNeverUsed(walDir string, meta *metadb.BoltMetaDB, segs []types.SegmentInfo) (bool, error) {
	for _, k := range raftStableKeys {
		v, err := meta.GetStable([]byte(k))
		if err != nil {
			return false, fmt.Errorf("raftstore: reading WAL stable store in %s: %w", walDir, err)
		}
		if len(v) > 0 {
			return false, nil
		}
	}
	for _, si := range segs {
		if !si.SealTime.IsZero() {
			return false, nil
		}
	}
	files, err := segmentFiles(walDir)
	if err != nil {
		return false, err
	}
	for _, name := range files {
		zero, err := allZero(filepath.Join(walDir, name))
		if err != nil || !zero {
			return false, err
		}
	}
	return true, nil
}

func segmentFiles(walDir string) ([]string, error) {
	ents, err := os.ReadDir(walDir)
	if err != nil {
		return nil, fmt.Errorf("raftstore: listing %s: %w", walDir, err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".wal") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func allZero(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("raftstore: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var zeros [1 << 20]byte
	for {
		n, err := f.Read(buf)
		if !bytes.Equal(buf[:n], zeros[:n]) {
			return false, nil
		}
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("raftstore: reading %s: %w", path, err)
		}
	}
}

// clearWAL removes a never-used WAL's files (the caller checked they hold nothing).
func clearWAL(walDir string) error {
	files, err := segmentFiles(walDir)
	if err != nil {
		return err
	}
	for _, name := range append(files, metadb.FileName, metadb.FileName+".tmp") {
		if err := os.Remove(filepath.Join(walDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("raftstore: removing an unused WAL file: %w", err)
		}
	}
	return syncDir(walDir)
}

// reserveTail makes sure the unsealed segment's space is allocated (fallocate with
// FALLOC_FL_KEEP_SIZE: contents and length unchanged, only blocks reserved), so appends into it
// cannot fail for want of space. A missing file is raft-wal's to create (preallocated).
func reserveTail(walDir string, segs []types.SegmentInfo) error {
	for _, si := range segs {
		if !si.SealTime.IsZero() || si.SizeLimit == 0 {
			continue
		}
		path := filepath.Join(walDir, segment.FileName(si))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("raftstore: opening the log's current segment: %w", err)
		}
		const keepSize = 0x1 // FALLOC_FL_KEEP_SIZE
		err = syscall.Fallocate(int(f.Fd()), keepSize, 0, int64(si.SizeLimit))
		_ = f.Close()
		switch {
		case err == nil, errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOTSUP):
		case errors.Is(err, syscall.ENOSPC):
			free, _ := freeBytes(walDir)
			return noSpace(walDir, uint64(si.SizeLimit), free, "to reserve the raft log's current segment, "+filepath.Base(path))
		default:
			return fmt.Errorf("raftstore: reserving %s: %w", path, err)
		}
	}
	return nil
}

// Segment file format (raft-wal v0.4 segment/format.go): a 32-byte file header, then frames of
// an 8-byte header (type; for entry and index frames the payload length in bytes 4-8) and a
// payload padded to 8 bytes. A commit frame ends each appended batch; the batch is acknowledged
// only once that frame is fsynced.
const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walFrameEntry     = 1
	walFrameIndex     = 2
	walFrameCommit    = 3
)

// scrubTail zeroes what follows the last commit frame of the unsealed segment when it holds an
// index frame. The batch that would have sealed the segment (an index frame, then a commit) was
// cut short, typically by ENOSPC: the seal goes past the segment's preallocated size. raft-wal's
// recovery ignores the entries after the last commit but not that index frame: it reopens the
// segment as sealed without rotating it, and every append then fails ("segment is sealed"), at
// every restart. Nothing after the last commit frame was acknowledged, and raft-wal's recovery
// discards it anyway, so zeroing it loses nothing.
func scrubTail(walDir string, segs []types.SegmentInfo, log hclog.Logger) error {
	for _, si := range segs {
		if !si.SealTime.IsZero() {
			continue
		}
		path := filepath.Join(walDir, segment.FileName(si))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("raftstore: opening the log's current segment: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("raftstore: %w", err)
		}
		size := fi.Size()
		committed, sealAfter := int64(walFileHeaderLen), false
		var hdr [walFrameHeaderLen]byte
		for off := int64(walFileHeaderLen); off+walFrameHeaderLen <= size; {
			if _, err := f.ReadAt(hdr[:], off); err != nil {
				return fmt.Errorf("raftstore: reading %s: %w", path, err)
			}
			typ, n := hdr[0], int64(binary.LittleEndian.Uint32(hdr[4:8]))
			if typ == walFrameCommit {
				off += walFrameHeaderLen
				committed, sealAfter = off, false
				continue
			}
			if typ != walFrameEntry && typ != walFrameIndex {
				break // zeros (the end) or a torn frame
			}
			sealAfter = sealAfter || typ == walFrameIndex
			off += walFrameHeaderLen + n + (walFrameHeaderLen-n%walFrameHeaderLen)%walFrameHeaderLen
		}
		if !sealAfter || committed >= size {
			continue
		}
		zeros := make([]byte, 1<<20)
		for off := committed; off < size; off += int64(len(zeros)) {
			if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
				return fmt.Errorf("raftstore: clearing the uncommitted seal of %s: %w", path, err)
			}
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("raftstore: clearing the uncommitted seal of %s: %w", path, err)
		}
		log.Warn("cleared an uncommitted seal after the last commit of the raft log's current segment", "segment", path, "from_offset", committed)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftstore: syncing %s: %w", dir, err)
	}
	return nil
}
