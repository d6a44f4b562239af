// Package memstore is the in-memory statestore.Store: the reference implementation, and the
// store for tests and for hosts that need no durability. Everything is lost with the process.
//
// One mutex guards all state; every call holds it for its whole duration, so the behaviour is
// the contract in its plainest form. It must never hand out memory it keeps: values are copied
// on the way in and on the way out.
package memstore

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/pinnedd/pinnedd/statestore"
)

// Store keeps instance state in memory.
type Store struct {
	mu     sync.Mutex
	closed bool
	insts  map[statestore.InstanceKey]*instance
	floor  uint64 // CollectFences' floor: an instance without a fence takes no older generation
}

type instance struct {
	gen     uint64
	lastSeq int64 // last seq handed out; kept when trays are deleted so seqs are never reused
	trays   map[statestore.TrayKey]*tray
}

type tray struct {
	fields map[string][]byte
	items  []statestore.Item
}

var _ statestore.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{insts: make(map[statestore.InstanceKey]*instance)}
}

// lock takes the mutex unless the store is closed or ctx is done; on success the caller
// must unlock.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return statestore.ErrClosed
	}
	return nil
}

// Setup has nothing to create.
func (s *Store) Setup(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: setup: %w", err)
	}
	s.mu.Unlock()
	return nil
}

// fence raises the generation or reports ErrFenced; it creates the instance so the fence
// outlives its trays. An instance without a fence (never seen, or collected) takes no
// generation below the floor. Callers hold mu.
func (s *Store) fence(inst statestore.InstanceKey, gen uint64) (*instance, error) {
	in := s.insts[inst]
	if in == nil {
		if gen < s.floor {
			return nil, statestore.FencedError(inst, gen, s.floor)
		}
		in = &instance{trays: make(map[statestore.TrayKey]*tray)}
		s.insts[inst] = in
	}
	if gen < in.gen {
		return nil, statestore.FencedError(inst, gen, in.gen)
	}
	in.gen = gen
	return in, nil
}

// Fence implements statestore.Store.
func (s *Store) Fence(ctx context.Context, inst statestore.InstanceKey, gen uint64) error {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return fmt.Errorf("memstore: fence: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: fence: %w", err)
	}
	defer s.mu.Unlock()
	if _, err := s.fence(inst, gen); err != nil {
		return fmt.Errorf("memstore: fence: %w", err)
	}
	return nil
}

// Load implements statestore.Store.
func (s *Store) Load(ctx context.Context, inst statestore.InstanceKey, gen uint64) ([]statestore.Tray, error) {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return nil, fmt.Errorf("memstore: load: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: load: %w", err)
	}
	defer s.mu.Unlock()
	in, err := s.fence(inst, gen)
	if err != nil {
		return nil, fmt.Errorf("memstore: load: %w", err)
	}
	out := make([]statestore.Tray, 0, len(in.trays))
	for k, t := range in.trays {
		ct := statestore.Tray{
			Key:    k,
			Fields: make(map[string][]byte, len(t.fields)),
			Items:  make([]statestore.Item, len(t.items)),
			Marked: len(t.items) > 0,
		}
		for name, v := range t.fields {
			ct.Fields[name] = clone(v)
		}
		for i, it := range t.items {
			ct.Items[i] = statestore.Item{Seq: it.Seq, Payload: clone(it.Payload), Applied: it.Applied}
		}
		out = append(out, ct)
	}
	slices.SortFunc(out, func(a, b statestore.Tray) int {
		return cmp.Or(cmp.Compare(a.Key.NS, b.Key.NS), cmp.Compare(a.Key.ID, b.Key.ID))
	})
	return out, nil
}

// Commit implements statestore.Store. Validation happens before anything is touched and
// nothing after it can fail, so holding the mutex makes the commit atomic.
func (s *Store) Commit(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) (statestore.CommitResult, error) {
	var res statestore.CommitResult
	if _, err := statestore.ValidateCommit(inst, gen, muts); err != nil {
		return res, fmt.Errorf("memstore: commit: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return res, fmt.Errorf("memstore: commit: %w", err)
	}
	defer s.mu.Unlock()
	in, err := s.fence(inst, gen)
	if err != nil {
		return res, fmt.Errorf("memstore: commit: %w", err)
	}
	for _, m := range muts {
		switch m := m.(type) {
		case statestore.SetField:
			t := in.tray(m.Tray)
			if m.Value == nil {
				delete(t.fields, m.Name)
			} else {
				t.fields[m.Name] = clone(m.Value)
			}
		case statestore.AppendItems:
			t := in.tray(m.Tray)
			seqs := make([]int64, len(m.Payloads))
			for i, p := range m.Payloads {
				in.lastSeq++
				seqs[i] = in.lastSeq
				t.items = append(t.items, statestore.Item{Seq: in.lastSeq, Payload: clone(p)})
			}
			res.Seqs = append(res.Seqs, seqs)
		case statestore.MarkApplied:
			if t := in.trays[m.Tray]; t != nil {
				for i := range t.items {
					if t.items[i].Seq <= m.UpTo {
						t.items[i].Applied = true
					}
				}
			}
		case statestore.RemoveItems:
			if t := in.trays[m.Tray]; t != nil {
				t.items = slices.DeleteFunc(t.items, func(it statestore.Item) bool { return it.Seq <= m.UpTo })
			}
		case statestore.DeleteTray:
			delete(in.trays, m.Tray)
		}
	}
	// A tray left without fields and items no longer exists.
	maps.DeleteFunc(in.trays, func(_ statestore.TrayKey, t *tray) bool {
		return len(t.fields) == 0 && len(t.items) == 0
	})
	return res, nil
}

// tray returns the tray, creating it empty.
func (in *instance) tray(k statestore.TrayKey) *tray {
	t := in.trays[k]
	if t == nil {
		t = &tray{fields: make(map[string][]byte)}
		in.trays[k] = t
	}
	return t
}

// ListMarked implements statestore.Store.
func (s *Store) ListMarked(ctx context.Context, after statestore.InstanceKey, limit int) ([]statestore.InstanceKey, error) {
	if err := statestore.ValidateAfter(after); err != nil {
		return nil, fmt.Errorf("memstore: list marked: %w", err)
	}
	if err := statestore.ValidateListLimit(limit); err != nil {
		return nil, fmt.Errorf("memstore: list marked: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: list marked: %w", err)
	}
	defer s.mu.Unlock()
	var keys []statestore.InstanceKey
	for k, in := range s.insts {
		if !after.Less(k) {
			continue
		}
		for _, t := range in.trays {
			if len(t.items) > 0 {
				keys = append(keys, k)
				break
			}
		}
	}
	slices.SortFunc(keys, func(a, b statestore.InstanceKey) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.ID, b.ID))
	})
	if len(keys) > limit {
		keys = keys[:limit]
	}
	return keys, nil
}

// Generation implements statestore.Store.
func (s *Store) Generation(ctx context.Context, inst statestore.InstanceKey) (uint64, error) {
	if err := statestore.ValidateInstance(inst); err != nil {
		return 0, fmt.Errorf("memstore: generation: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return 0, fmt.Errorf("memstore: generation: %w", err)
	}
	defer s.mu.Unlock()
	if in := s.insts[inst]; in != nil {
		return in.gen, nil
	}
	return 0, nil
}

// CollectFences implements statestore.Store.
func (s *Store) CollectFences(ctx context.Context, below uint64, live []statestore.Live) (int, error) {
	if err := statestore.ValidateCollect(below, live); err != nil {
		return 0, fmt.Errorf("memstore: collect fences: %w", err)
	}
	if err := s.lock(ctx); err != nil {
		return 0, fmt.Errorf("memstore: collect fences: %w", err)
	}
	defer s.mu.Unlock()
	floor := statestore.CollectFloor(below, live, func(k statestore.InstanceKey) bool { return s.insts[k] != nil })
	isLive := make(map[statestore.InstanceKey]bool, len(live))
	for _, l := range live {
		isLive[l.Inst] = true
	}
	n := 0
	for k, in := range s.insts {
		if statestore.Collectable(in.gen, in.lastSeq, len(in.trays) > 0, isLive[k], floor) {
			delete(s.insts, k)
			n++
		}
	}
	s.floor = max(s.floor, floor)
	return n, nil
}

// Close drops the state; later calls fail with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.insts = nil
	return nil
}

// clone copies b, keeping an empty value non-nil so it stays distinct from "no value".
func clone(b []byte) []byte {
	return append(make([]byte, 0, len(b)), b...)
}
