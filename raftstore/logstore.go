package raftstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// Log store formats (Config.LogStore).
const (
	// LogStoreWAL is hashicorp/raft-wal: append-only segment files, one
	// fsync per appended batch. The default for a new data dir.
	LogStoreWAL = "wal"
	// LogStoreBolt is raft-boltdb/v2 (raft/raft.db): a B+tree whose
	// commits cost two fsyncs (pages, then meta). Data dirs created before
	// the WAL became the default keep it.
	LogStoreBolt = "bolt"
)

// ErrDataDirInUse: another process holds the data dir's lock.
var ErrDataDirInUse = errors.New("raftstore: data dir in use by another process")

// logStore is the Raft log and stable store in one, as both formats are.
type logStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// chooseLogStore picks the format for dir: the one the dir already holds,
// else want (default WAL). Asking for one format on a dir holding the
// other is refused: opening an empty log there would look like a new node,
// and a --bootstrap command line would found a second cluster.
func chooseLogStore(dir, want string) (string, error) {
	has := func(name string) bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	var found string
	switch {
	case has("wal") && has("raft.db"):
		return "", fmt.Errorf("%w: %s holds both a WAL and a raft.db log; remove the one not in use", ErrInvalidConfig, dir)
	case has("wal"):
		found = LogStoreWAL
	case has("raft.db"):
		found = LogStoreBolt
	}
	switch {
	case want != "" && want != LogStoreWAL && want != LogStoreBolt:
		return "", fmt.Errorf("%w: LogStore %q (want %q or %q)", ErrInvalidConfig, want, LogStoreWAL, LogStoreBolt)
	case found != "" && want != "" && want != found:
		return "", fmt.Errorf("%w: %s holds a %s log, not %s", ErrInvalidConfig, dir, found, want)
	case found != "":
		return found, nil
	case want != "":
		return want, nil
	}
	return LogStoreWAL, nil
}

// openLogStore opens dir's log store in the given format.
func openLogStore(dir, format string, segmentSize int, log hclog.Logger) (logStore, error) {
	if format == LogStoreBolt {
		s, err := raftboltdb.New(raftboltdb.Options{
			Path: filepath.Join(dir, "raft.db"),
			// The dir lock is taken first; this only guards against a
			// process that does not take it.
			BoltOptions: &bbolt.Options{Timeout: time.Second},
		})
		if err != nil {
			return nil, fmt.Errorf("raftstore: opening bolt log store: %w", err)
		}
		return s, nil
	}
	walDir := filepath.Join(dir, "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, fmt.Errorf("raftstore: creating %s: %w", walDir, err)
	}
	// The meta store is ours to close: WAL.Close leaves it (and its file
	// lock) open, so the dir could not be reopened in the same process.
	w, meta, err := openWAL(walDir, segmentSize, log)
	if err != nil {
		return nil, err
	}
	return walStore{w, meta}, nil
}

type walStore struct {
	*raftwal.WAL
	meta *metadb.BoltMetaDB
}

func (w walStore) Close() error {
	return errors.Join(w.WAL.Close(), w.meta.Close())
}

// lockDir takes an exclusive, non-blocking lock on dir/LOCK for the life
// of the process (or until the returned file is closed). It is what proves
// a data dir has one process: a second pinnedd on it fails at once, and a
// restarted node knows its predecessor is gone.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftstore: lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
		}
		return nil, fmt.Errorf("raftstore: locking %s: %w", dir, err)
	}
	return f, nil
}
