// Package boltstore is the embedded statestore.Store: one bbolt file (the agent uses
// <data-dir>/state.db) for a single node, as in `pinnedd agent --dev`.
//
// Every Commit is one bbolt read-write transaction, fsynced before it returns (bbolt's default),
// so acknowledged writes survive kill -9 and power loss. bbolt has a single writer, which makes
// fencing trivially serial. Calls that need no write (a Load or Fence with the generation already
// stored, Generation, ListMarked) run in read-only transactions and cost no fsync.
//
// The file is locked by its process; it must never be shared between nodes (that is what
// pgstore is for).
//
// Layout: top-level buckets keyed by names joined with NUL, which sorts exactly like the tuple
// (names hold no NUL, see statestore.ValidateName), so prefix scans return trays in key order:
//
//	meta   "schema"                        -> uint64 schema version
//	meta   "fence-floor"                   -> uint64 CollectFences' floor (absent: 0)
//	fence  ns 0 id                         -> generation uint64 | last seq uint64
//	tray   ns 0 id 0 trayNS 0 trayID       -> marked byte | generation uint64 | updated unix ns
//	marked ns 0 id 0 trayNS 0 trayID       -> empty; present iff the tray is marked
//	field  ns 0 id 0 trayNS 0 trayID 0 name -> value
//	item   ns 0 id 0 trayNS 0 trayID 0 seq  -> applied byte | payload (seq big-endian)
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/pinnedd/pinnedd/statestore"
)

// schemaVersion is the layout this code writes. A file with a newer version is refused rather
// than misread. 2: fences may be collected, under the floor in meta (a build that ignored the
// floor would let a collected instance's stale owner write).
const schemaVersion = 2

var (
	bucketMeta   = []byte("meta")
	bucketFence  = []byte("fence")
	bucketTray   = []byte("tray")
	bucketMarked = []byte("marked")
	bucketField  = []byte("field")
	bucketItem   = []byte("item")
	keySchema    = []byte("schema")
	keyFloor     = []byte("fence-floor")
)

// Store is a statestore.Store on a bbolt file.
type Store struct {
	db     *bolt.DB
	path   string
	closed atomic.Bool
}

var _ statestore.Store = (*Store)(nil)

// Open opens (creating if needed) the store file at path and sets up its buckets. It waits at
// most a second for another process holding the file, so a second agent on the same data
// directory fails instead of hanging.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s := &Store{db: db, path: path}
	if err := s.Setup(context.Background()); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// Path returns the file the store lives in.
func (s *Store) Path() string { return s.path }

// Setup creates the buckets and records the schema version; it is idempotent.
func (s *Store) Setup(ctx context.Context) error {
	err := s.update(ctx, func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketFence, bucketTray, bucketMarked, bucketField, bucketItem} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keySchema); v != nil {
			if got := binary.BigEndian.Uint64(v); got > schemaVersion {
				return fmt.Errorf("file has schema version %d, this build knows up to %d", got, schemaVersion)
			} else if got == schemaVersion {
				return nil
			}
		}
		return meta.Put(keySchema, binary.BigEndian.AppendUint64(nil, schemaVersion))
	})
	if err != nil {
		return fmt.Errorf("boltstore: setup: %w", err)
	}
	return nil
}

// view and update run fn in a transaction, mapping a closed database to ErrClosed.
func (s *Store) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	return s.mapClosed(s.db.View(fn))
}

func (s *Store) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	return s.mapClosed(s.db.Update(fn))
}

func (s *Store) usable(ctx context.Context) error {
	if s.closed.Load() {
		return statestore.ErrClosed
	}
	return ctx.Err()
}

// mapClosed turns bbolt's error for a call that raced with Close into ErrClosed.
func (s *Store) mapClosed(err error) error {
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("%w: %w", statestore.ErrClosed, err)
	}
	return err
}

// Fence implements statestore.Store.
func (s *Store) Fence(ctx context.Context, inst statestore.InstanceKey, gen uint64) error {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return fmt.Errorf("boltstore: fence: %w", err)
	}
	var current bool
	err := s.view(ctx, func(tx *bolt.Tx) error {
		var err error
		current, err = checkFence(tx, inst, gen)
		return err
	})
	if err == nil && !current {
		err = s.update(ctx, func(tx *bolt.Tx) error {
			_, err := raiseFence(tx, inst, gen, 0)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("boltstore: fence: %w", err)
	}
	return nil
}

// Load implements statestore.Store. When gen is already the stored generation the read runs in
// a read-only transaction: the snapshot it reads is one in which gen was current.
func (s *Store) Load(ctx context.Context, inst statestore.InstanceKey, gen uint64) ([]statestore.Tray, error) {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return nil, fmt.Errorf("boltstore: load: %w", err)
	}
	var trays []statestore.Tray
	var current bool
	err := s.view(ctx, func(tx *bolt.Tx) error {
		var err error
		if current, err = checkFence(tx, inst, gen); err != nil || !current {
			return err
		}
		trays = loadTrays(tx, inst)
		return nil
	})
	if err == nil && !current {
		err = s.update(ctx, func(tx *bolt.Tx) error {
			if _, err := raiseFence(tx, inst, gen, 0); err != nil {
				return err
			}
			trays = loadTrays(tx, inst)
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: load: %w", err)
	}
	return trays, nil
}

// Commit implements statestore.Store: one read-write transaction, so either all of muts and
// the raised fence are on disk when it returns, or none of it.
func (s *Store) Commit(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) (statestore.CommitResult, error) {
	var res statestore.CommitResult
	appended, err := statestore.ValidateCommit(inst, gen, muts)
	if err != nil {
		return res, fmt.Errorf("boltstore: commit: %w", err)
	}
	err = s.update(ctx, func(tx *bolt.Tx) error {
		res = statestore.CommitResult{} // bbolt does not rerun fn, but keep it self-contained
		first, err := raiseFence(tx, inst, gen, appended)
		if err != nil {
			return err
		}
		next := first
		touched := map[string]struct{}{}
		var order [][]byte
		for _, m := range muts {
			tk := trayKey(inst, statestore.TrayOf(m))
			if _, ok := touched[string(tk)]; !ok {
				touched[string(tk)] = struct{}{}
				order = append(order, tk)
			}
			switch m := m.(type) {
			case statestore.SetField:
				k := join(tk, []byte(m.Name))
				if m.Value == nil {
					err = tx.Bucket(bucketField).Delete(k)
				} else {
					err = tx.Bucket(bucketField).Put(k, m.Value)
				}
			case statestore.AppendItems:
				seqs := make([]int64, len(m.Payloads))
				for i, p := range m.Payloads {
					seqs[i] = next
					v := append([]byte{0}, p...)
					if err = tx.Bucket(bucketItem).Put(itemKey(tk, next), v); err != nil {
						break
					}
					next++
				}
				res.Seqs = append(res.Seqs, seqs)
			case statestore.MarkApplied:
				err = markApplied(tx.Bucket(bucketItem), tk, m.UpTo)
			case statestore.RemoveItems:
				err = removeItems(tx.Bucket(bucketItem), tk, m.UpTo)
			case statestore.DeleteTray:
				err = deleteTray(tx, tk)
			}
			if err != nil {
				return err
			}
		}
		now := time.Now().UnixNano()
		for _, tk := range order {
			if err := reindex(tx, tk, gen, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return statestore.CommitResult{}, fmt.Errorf("boltstore: commit: %w", err)
	}
	return res, nil
}

// ListMarked implements statestore.Store by walking the marked bucket and jumping past each
// instance it finds, so the cost follows the number of marked instances listed.
func (s *Store) ListMarked(ctx context.Context, after statestore.InstanceKey, limit int) ([]statestore.InstanceKey, error) {
	if err := statestore.ValidateAfter(after); err != nil {
		return nil, fmt.Errorf("boltstore: list marked: %w", err)
	}
	if err := statestore.ValidateListLimit(limit); err != nil {
		return nil, fmt.Errorf("boltstore: list marked: %w", err)
	}
	var out []statestore.InstanceKey
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketMarked).Cursor()
		var k []byte
		switch {
		case after.Namespace == "":
			k, _ = c.First()
		case after.ID == "":
			k, _ = c.Seek(append([]byte(after.Namespace), 0))
		default:
			k, _ = c.Seek(instanceSkip(statestore.InstanceKey(after)))
		}
		for k != nil && len(out) < limit {
			parts := bytes.SplitN(k, []byte{0}, 3)
			if len(parts) != 3 {
				return fmt.Errorf("corrupt marked key %q", k)
			}
			inst := statestore.InstanceKey{Namespace: string(parts[0]), ID: string(parts[1])}
			out = append(out, inst)
			k, _ = c.Seek(instanceSkip(inst))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: list marked: %w", err)
	}
	return out, nil
}

// Generation implements statestore.Store.
func (s *Store) Generation(ctx context.Context, inst statestore.InstanceKey) (uint64, error) {
	if err := statestore.ValidateInstance(inst); err != nil {
		return 0, fmt.Errorf("boltstore: generation: %w", err)
	}
	var gen uint64
	err := s.view(ctx, func(tx *bolt.Tx) error {
		gen, _, _ = readFence(tx, inst)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: generation: %w", err)
	}
	return gen, nil
}

// CollectFences implements statestore.Store in one read-write transaction, so no Commit runs
// between judging a fence and dropping it.
func (s *Store) CollectFences(ctx context.Context, below uint64, live []statestore.Live) (int, error) {
	if err := statestore.ValidateCollect(below, live); err != nil {
		return 0, fmt.Errorf("boltstore: collect fences: %w", err)
	}
	n := 0
	err := s.update(ctx, func(tx *bolt.Tx) error {
		n = 0
		fences := tx.Bucket(bucketFence)
		floor := statestore.CollectFloor(below, live, func(k statestore.InstanceKey) bool {
			return fences.Get(instanceKey(k)) != nil
		})
		isLive := make(map[string]bool, len(live))
		for _, l := range live {
			isLive[string(instanceKey(l.Inst))] = true
		}
		var drop [][]byte
		trays := tx.Bucket(bucketTray)
		err := fences.ForEach(func(k, v []byte) error {
			if len(v) != 16 {
				return fmt.Errorf("corrupt fence %q", k)
			}
			gen, last := binary.BigEndian.Uint64(v[:8]), int64(binary.BigEndian.Uint64(v[8:]))
			if statestore.Collectable(gen, last, hasPrefix(trays, append(bytes.Clone(k), 0)), isLive[string(k)], floor) {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := deleteKeys(fences, drop); err != nil {
			return err
		}
		n = len(drop)
		if floor > readFloor(tx) {
			return tx.Bucket(bucketMeta).Put(keyFloor, binary.BigEndian.AppendUint64(nil, floor))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: collect fences: %w", err)
	}
	return n, nil
}

// Close closes the file after the transactions in flight; later calls fail with ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: close: %w", err)
	}
	return nil
}

// --- fences ---

func instanceKey(inst statestore.InstanceKey) []byte {
	return join([]byte(inst.Namespace), []byte(inst.ID))
}

// instanceSkip is the smallest key after every key of inst's trays: they all continue the
// instance key with a NUL, and no name holds a NUL, so 0x01 comes next.
func instanceSkip(inst statestore.InstanceKey) []byte {
	return append(instanceKey(inst), 1)
}

func readFence(tx *bolt.Tx, inst statestore.InstanceKey) (gen uint64, lastSeq int64, ok bool) {
	v := tx.Bucket(bucketFence).Get(instanceKey(inst))
	if len(v) != 16 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(v[:8]), int64(binary.BigEndian.Uint64(v[8:])), true
}

func readFloor(tx *bolt.Tx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyFloor); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// storedFence is the generation gen must reach: the instance's fence, or the floor when it has
// none (never seen, or collected).
func storedFence(tx *bolt.Tx, inst statestore.InstanceKey) (gen uint64, lastSeq int64, ok bool) {
	gen, lastSeq, ok = readFence(tx, inst)
	if !ok {
		gen = readFloor(tx)
	}
	return gen, lastSeq, ok
}

// checkFence reports whether gen is the stored generation, or ErrFenced if it is older.
func checkFence(tx *bolt.Tx, inst statestore.InstanceKey, gen uint64) (current bool, err error) {
	stored, _, ok := storedFence(tx, inst)
	if gen < stored {
		return false, statestore.FencedError(inst, gen, stored)
	}
	return ok && gen == stored, nil
}

// raiseFence checks gen against the stored generation, stores the newer one and reserves n
// seqs, returning the first. The seq counter lives with the fence, which is only collected
// while it has handed out no seq, so seqs are never reused.
func raiseFence(tx *bolt.Tx, inst statestore.InstanceKey, gen uint64, n int) (first int64, err error) {
	stored, last, ok := storedFence(tx, inst)
	if gen < stored {
		return 0, statestore.FencedError(inst, gen, stored)
	}
	if !ok {
		stored = 0 // the floor is not this instance's fence: write one
	}
	if gen == stored && n == 0 {
		return last + 1, nil
	}
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 16), gen)
	v = binary.BigEndian.AppendUint64(v, uint64(last+int64(n)))
	return last + 1, tx.Bucket(bucketFence).Put(instanceKey(inst), v)
}

// --- trays ---

func trayKey(inst statestore.InstanceKey, t statestore.TrayKey) []byte {
	return join([]byte(inst.Namespace), []byte(inst.ID), []byte(t.NS), []byte(t.ID))
}

func itemKey(tk []byte, seq int64) []byte {
	k := append(append(make([]byte, 0, len(tk)+9), tk...), 0)
	return binary.BigEndian.AppendUint64(k, uint64(seq))
}

func join(parts ...[]byte) []byte {
	return bytes.Join(parts, []byte{0})
}

// scan calls fn for each key in b starting with prefix, in order. fn must not modify b.
func scan(b *bolt.Bucket, prefix []byte, fn func(k, v []byte)) {
	c := b.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		fn(k, v)
	}
}

func itemPrefix(tk []byte) []byte { return append(bytes.Clone(tk), 0) }

// markApplied collects first and writes after, because a bbolt cursor is not stable under
// writes to its bucket.
func markApplied(b *bolt.Bucket, tk []byte, upTo int64) error {
	type kv struct{ k, v []byte }
	var todo []kv
	scan(b, itemPrefix(tk), func(k, v []byte) {
		if seqOf(k) <= upTo && v[0] == 0 {
			nv := bytes.Clone(v)
			nv[0] = 1
			todo = append(todo, kv{bytes.Clone(k), nv})
		}
	})
	for _, e := range todo {
		if err := b.Put(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

func removeItems(b *bolt.Bucket, tk []byte, upTo int64) error {
	var todo [][]byte
	scan(b, itemPrefix(tk), func(k, _ []byte) {
		if seqOf(k) <= upTo {
			todo = append(todo, bytes.Clone(k))
		}
	})
	return deleteKeys(b, todo)
}

func deleteTray(tx *bolt.Tx, tk []byte) error {
	for _, name := range [][]byte{bucketField, bucketItem} {
		b := tx.Bucket(name)
		var todo [][]byte
		scan(b, itemPrefix(tk), func(k, _ []byte) { todo = append(todo, bytes.Clone(k)) })
		if err := deleteKeys(b, todo); err != nil {
			return err
		}
	}
	// The index entry is settled by reindex at the end of the commit.
	return nil
}

func deleteKeys(b *bolt.Bucket, keys [][]byte) error {
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func seqOf(itemKey []byte) int64 {
	return int64(binary.BigEndian.Uint64(itemKey[len(itemKey)-8:]))
}

func hasPrefix(b *bolt.Bucket, prefix []byte) bool {
	k, _ := b.Cursor().Seek(prefix)
	return k != nil && bytes.HasPrefix(k, prefix)
}

// reindex derives the tray's index entry from its content after a commit: gone when the tray
// holds nothing, marked iff it holds an item.
func reindex(tx *bolt.Tx, tk []byte, gen uint64, now int64) error {
	p := itemPrefix(tk)
	marked := hasPrefix(tx.Bucket(bucketItem), p)
	exists := marked || hasPrefix(tx.Bucket(bucketField), p)
	if !exists {
		if err := tx.Bucket(bucketTray).Delete(tk); err != nil {
			return err
		}
		return tx.Bucket(bucketMarked).Delete(tk)
	}
	v := make([]byte, 1, 17)
	if marked {
		v[0] = 1
	}
	v = binary.BigEndian.AppendUint64(v, gen)
	v = binary.BigEndian.AppendUint64(v, uint64(now))
	if err := tx.Bucket(bucketTray).Put(tk, v); err != nil {
		return err
	}
	if marked {
		return tx.Bucket(bucketMarked).Put(tk, []byte{})
	}
	return tx.Bucket(bucketMarked).Delete(tk)
}

// loadTrays reads every tray of inst, copying out of bbolt's memory map.
func loadTrays(tx *bolt.Tx, inst statestore.InstanceKey) []statestore.Tray {
	prefix := append(instanceKey(inst), 0)
	var trays []statestore.Tray
	scan(tx.Bucket(bucketTray), prefix, func(k, v []byte) {
		parts := bytes.SplitN(k[len(prefix):], []byte{0}, 2)
		t := statestore.Tray{
			Key:    statestore.TrayKey{NS: string(parts[0]), ID: string(parts[1])},
			Fields: map[string][]byte{},
			Marked: v[0] == 1,
		}
		fp := itemPrefix(k)
		scan(tx.Bucket(bucketField), fp, func(fk, fv []byte) {
			// An empty value is a value: keep it non-nil.
			t.Fields[string(fk[len(fp):])] = append([]byte{}, fv...)
		})
		scan(tx.Bucket(bucketItem), fp, func(ik, iv []byte) {
			t.Items = append(t.Items, statestore.Item{
				Seq:     seqOf(ik),
				Payload: append([]byte{}, iv[1:]...),
				Applied: iv[0] == 1,
			})
		})
		trays = append(trays, t)
	})
	return trays
}
