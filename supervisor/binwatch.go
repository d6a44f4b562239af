package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// binStat identifies one version of a binary on disk without reading it:
// a rename over the path (go build -o, install, mv) changes the inode, a
// rewrite in place the size or mtime, a chmod the mode. The zero value
// means the path was missing.
type binStat struct {
	dev, ino uint64
	size     int64
	modNs    int64
	mode     os.FileMode
}

func statBinary(path string) binStat {
	st, err := os.Stat(path)
	if err != nil {
		return binStat{}
	}
	return statOf(st)
}

func statOf(st os.FileInfo) binStat {
	b := binStat{size: st.Size(), modNs: st.ModTime().UnixNano(), mode: st.Mode()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		b.dev, b.ino = uint64(sys.Dev), sys.Ino
	}
	return b
}

func (b binStat) present() bool { return b != binStat{} }

func (b binStat) executable() bool { return b.mode.IsRegular() && b.mode&0o111 != 0 }

// binAction is what a poll of a watched binary asks for.
type binAction int

const (
	binNone        binAction = iota
	binReload                // a different binary has settled: hot-swap to it
	binSameContent           // the file changed but holds the running bytes
)

// binWatch decides, poll by poll, when a watched plugin binary has been
// replaced by a different one that is ready to run. A replacement is taken
// only once it is executable and its stat has not moved for settle (a copy
// or a build still writing it keeps moving); a path that disappears (a
// deploy deletes, then writes) is waited out, the running process keeping
// on; a replacement with the running bytes is no change; a version whose
// reload failed is not retried until the file changes again.
type binWatch struct {
	path   string
	settle time.Duration
	logger *slog.Logger

	seen    binStat   // a version other than the running one, settling
	since   time.Time // when seen was first observed
	tried   binStat   // the last version a reload was asked for
	missing bool      // the path was absent at the last poll
	notExec bool      // seen settled but is not executable (said once)
}

// poll looks at the path once; running is the binary the serving process
// was started from.
func (w *binWatch) poll(now time.Time, running binStat) (binStat, binAction) {
	st := statBinary(w.path)
	if !st.present() {
		if !w.missing {
			w.missing = true
			w.logger.Warn("plugin binary missing; the running process keeps serving until a new one appears", "path", w.path)
		}
		w.seen = binStat{}
		return st, binNone
	}
	w.missing = false
	if st == running {
		// Hash the running version while its file is still on disk (once,
		// cached), so a later replacement with the same bytes is known.
		versionOf(w.path, running)
		w.seen = binStat{}
		return st, binNone
	}
	if st == w.tried {
		return st, binNone
	}
	if st != w.seen {
		w.seen, w.since, w.notExec = st, now, false
		return st, binNone
	}
	if now.Sub(w.since) < w.settle {
		return st, binNone
	}
	if !st.executable() {
		if !w.notExec {
			w.notExec = true
			w.logger.Warn("new plugin binary is not an executable file; waiting", "path", w.path, "mode", st.mode.String())
		}
		return st, binNone
	}
	w.seen = binStat{}
	if old := cachedVersion(w.path, running); old != "" && old == versionOf(w.path, st) {
		w.logger.Debug("plugin binary replaced by the same content; not reloading", "path", w.path, "version", old)
		return st, binSameContent
	}
	w.tried = st
	return st, binReload
}

// versionOf is a content hash prefix of the binary at path, for `plugins
// list` and change detection ("" once the file on disk is no longer the
// one described by b). Hashing a 30 MB binary takes tens of milliseconds,
// so it is done when asked, not on the spawn (restart) path, and
// remembered per version.
func versionOf(path string, b binStat) string {
	if v := cachedVersion(path, b); v != "" {
		return v
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || statOf(st) != b {
		return ""
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	v := hex.EncodeToString(h.Sum(nil))[:12]
	if st, err := f.Stat(); err != nil || statOf(st) != b {
		// Written while hashed: the hash names no version.
		return ""
	}
	versionsMu.Lock()
	versions[versionKey{path, b}] = v
	versionsMu.Unlock()
	return v
}

func cachedVersion(path string, b binStat) string {
	versionsMu.Lock()
	defer versionsMu.Unlock()
	return versions[versionKey{path, b}]
}

type versionKey struct {
	path string
	bin  binStat
}

var (
	versionsMu sync.Mutex
	versions   = map[versionKey]string{}
)
