package directory

import (
	"maps"
	"sync"
)

// placementTable is the directory's one record of placements, shared by the
// appliers (under Machine.mu's write side) and the lock-free readers.
//
// Readers see only committed placements, in a sync.Map whose loads take no
// lock. An entry's writes wait in pending until commit, which the Machine
// runs after publishing the workers the entry changed: a reader that finds
// a placement and then loads the workers sees them from the same entry or
// a later one, never a placement naming a session it cannot see yet.
type placementTable struct {
	committed sync.Map           // Key -> *Placement; a stored *Placement is never modified
	pending   map[Key]*Placement // the entry's writes; nil marks a delete
	n         int                // committed placements; written by commit only

	// owned indexes the placements by owner (client id), pending writes
	// included. Only appliers and readers holding Machine.mu use it.
	owned map[string]map[Key]struct{}
}

func newPlacementTable() *placementTable {
	return &placementTable{
		pending: make(map[Key]*Placement),
		owned:   make(map[string]map[Key]struct{}),
	}
}

// load returns the committed placement of k, without a lock.
func (t *placementTable) load(k Key) (Placement, bool) {
	v, ok := t.committed.Load(k)
	if !ok {
		return Placement{}, false
	}
	return *v.(*Placement), true
}

// get returns the placement of k including the writes of the entry being
// applied; callers hold Machine.mu.
func (t *placementTable) get(k Key) (Placement, bool) {
	if len(t.pending) != 0 {
		if p, ok := t.pending[k]; ok {
			if p == nil {
				return Placement{}, false
			}
			return *p, true
		}
	}
	return t.load(k)
}

// set records p as the placement of p.Key; callers hold Machine.mu's write
// side. Readers see it at the next commit.
func (t *placementTable) set(p Placement) {
	if old, ok := t.get(p.Key); ok && old.Owner != p.Owner {
		t.unown(old)
	}
	keys := t.owned[p.Owner]
	if keys == nil {
		keys = make(map[Key]struct{})
		t.owned[p.Owner] = keys
	}
	keys[p.Key] = struct{}{}
	t.pending[p.Key] = &p
}

// delete removes the placement p (as get returned it); callers hold
// Machine.mu's write side. Readers see it gone at the next commit.
func (t *placementTable) delete(p Placement) {
	t.unown(p)
	t.pending[p.Key] = nil
}

func (t *placementTable) unown(p Placement) {
	if keys := t.owned[p.Owner]; keys != nil {
		delete(keys, p.Key)
		if len(keys) == 0 {
			delete(t.owned, p.Owner)
		}
	}
}

// keysOf returns the keys owner holds, pending writes included. The map is
// the table's own: callers hold Machine.mu and must not modify it. An
// applier may range over it while it removes owner's placements or sets
// them again with the same owner: neither adds a key to it.
func (t *placementTable) keysOf(owner string) map[Key]struct{} { return t.owned[owner] }

// commit makes the entry's writes visible to readers, key by key.
func (t *placementTable) commit() {
	for k, p := range t.pending {
		if p == nil {
			if _, was := t.committed.LoadAndDelete(k); was {
				t.n--
			}
		} else if _, was := t.committed.Swap(k, p); !was {
			t.n++
		}
	}
	clear(t.pending)
}

// each calls fn for every committed placement, in no order; callers hold
// Machine.mu (so nothing is pending).
func (t *placementTable) each(fn func(Placement)) {
	t.committed.Range(func(_, v any) bool {
		fn(*v.(*Placement))
		return true
	})
}

// workerTable is the directory's one record of workers. The records the
// published view shares are never modified: edit hands an applier a copy
// of its own the first time an entry changes a worker, and publish gives
// readers a new map of the current records once the entry is done.
type workerTable struct {
	live    map[string]*Worker
	fresh   map[string]*Worker // records created or copied in this entry: not published yet
	changed bool               // live differs from the last published map
}

// newWorkerTable returns an empty table not yet published.
func newWorkerTable() *workerTable {
	return &workerTable{live: make(map[string]*Worker), fresh: make(map[string]*Worker), changed: true}
}

// get returns a copy of the record of id; callers hold Machine.mu.
func (t *workerTable) get(id string) (Worker, bool) {
	w, ok := t.live[id]
	if !ok {
		return Worker{}, false
	}
	return *w, true
}

// edit returns the record of id for the applier to change, creating an
// empty one (with the client id set) when there is none; callers hold
// Machine.mu's write side.
func (t *workerTable) edit(id string) *Worker {
	if w, ok := t.fresh[id]; ok {
		return w
	}
	w := &Worker{ClientID: id}
	if old, ok := t.live[id]; ok {
		*w = *old
	}
	t.live[id] = w
	t.fresh[id] = w
	t.changed = true
	return w
}

// remove forgets id; callers hold Machine.mu's write side.
func (t *workerTable) remove(id string) {
	if _, ok := t.live[id]; ok {
		delete(t.live, id)
		delete(t.fresh, id)
		t.changed = true
	}
}

func (t *workerTable) len() int { return len(t.live) }

// all returns the live records, in no order; callers hold Machine.mu and
// must not modify them.
func (t *workerTable) all() map[string]*Worker { return t.live }

// publish returns the map readers get from now on, and false when nothing
// changed since the last one. The records in it are never modified again.
func (t *workerTable) publish() (map[string]*Worker, bool) {
	if !t.changed {
		return nil, false
	}
	clear(t.fresh)
	t.changed = false
	return maps.Clone(t.live), true
}
