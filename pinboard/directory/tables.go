package directory

import (
	"hash/maphash"
	"maps"
	"sync/atomic"
)

// placementTable is the directory's one record of placements, shared by the
// appliers (under Machine.mu's write side) and the readers, who take no
// lock at all: they find a placement in a hash index whose chains are
// immutable once published (a write replaces the nodes in front of the key
// it changes, then swaps the chain's head in one atomic store).
//
// An entry's writes wait in pending until commit, which the Machine runs
// after publishing the workers the entry changed: a reader that finds a
// placement and then loads the workers sees them from the same entry or a
// later one, never a placement naming a session it cannot see yet.
type placementTable struct {
	index   atomic.Pointer[placementIndex]
	pending map[Key]pendingPlacement // the entry's writes, by key
	n       int                      // committed placements; written by commit only

	// owned indexes the placements by owner (client id), pending writes
	// included. Only appliers and readers holding Machine.mu use it.
	owned map[string]map[Key]struct{}
}

type pendingPlacement struct {
	p       Placement
	deleted bool
}

func newPlacementTable() *placementTable {
	t := &placementTable{
		pending: make(map[Key]pendingPlacement),
		owned:   make(map[string]map[Key]struct{}),
	}
	t.index.Store(newPlacementIndex(minPlacementBuckets))
	return t
}

// load returns the committed placement of k, without a lock.
func (t *placementTable) load(k Key) (Placement, bool) {
	return t.index.Load().find(k)
}

// get returns the placement of k including the writes of the entry being
// applied; callers hold Machine.mu.
func (t *placementTable) get(k Key) (Placement, bool) {
	if len(t.pending) != 0 {
		if w, ok := t.pending[k]; ok {
			return w.p, !w.deleted
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
	t.pending[p.Key] = pendingPlacement{p: p}
}

// delete removes the placement p (as get returned it); callers hold
// Machine.mu's write side. Readers see it gone at the next commit.
func (t *placementTable) delete(p Placement) {
	t.unown(p)
	t.pending[p.Key] = pendingPlacement{p: Placement{Key: p.Key}, deleted: true}
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

// commit makes the entry's writes visible to readers, key by key; callers
// hold Machine.mu's write side.
func (t *placementTable) commit() {
	x := t.index.Load()
	if most := t.n + len(t.pending); 2*most > len(x.buckets) {
		// Grown before the writes, so that a large entry (or a restore)
		// never walks long chains. The grown index holds what readers
		// already see; they go on with the old one until it is whole.
		size := len(x.buckets)
		for 2*most > size {
			size *= 2
		}
		x = x.grown(size)
		t.index.Store(x)
	}
	for k, w := range t.pending {
		if x.store(k, w.p, w.deleted) {
			if w.deleted {
				t.n--
			}
		} else if !w.deleted {
			t.n++
		}
	}
	clear(t.pending)
}

// each calls fn for every committed placement, in no order; callers hold
// Machine.mu (so nothing is pending).
func (t *placementTable) each(fn func(Placement)) {
	x := t.index.Load()
	for i := range x.buckets {
		for n := x.buckets[i].Load(); n != nil; n = n.next {
			fn(n.p)
		}
	}
}

// placementIndex is a chained hash table for one writer and any number of
// lock-free readers. A node is never modified once a reader can reach it.
type placementIndex struct {
	seed    maphash.Seed
	buckets []atomic.Pointer[placementNode] // a power of two
}

type placementNode struct {
	hash uint64 // of p.Key, compared before the key
	next *placementNode
	p    Placement
}

// minPlacementBuckets is the size of an empty index; it doubles before it
// would hold more placements than half its buckets, so chains stay short.
const minPlacementBuckets = 64

func newPlacementIndex(buckets int) *placementIndex {
	return &placementIndex{seed: maphash.MakeSeed(), buckets: make([]atomic.Pointer[placementNode], buckets)}
}

func (x *placementIndex) bucket(k Key) (*atomic.Pointer[placementNode], uint64) {
	h := maphash.Comparable(x.seed, k)
	return &x.buckets[h&uint64(len(x.buckets)-1)], h
}

func (x *placementIndex) find(k Key) (Placement, bool) {
	b, h := x.bucket(k)
	for n := b.Load(); n != nil; n = n.next {
		if n.hash == h && n.p.Key == k {
			return n.p, true
		}
	}
	return Placement{}, false
}

// store sets p as k's placement, or removes k with del, and reports whether
// k was there before. A new key goes in front of its chain; changing or
// removing one copies the nodes in front of it, so a reader still walking
// the old chain sees it whole.
func (x *placementIndex) store(k Key, p Placement, del bool) bool {
	b, h := x.bucket(k)
	head := b.Load()
	at := head
	for at != nil && (at.hash != h || at.p.Key != k) {
		at = at.next
	}
	switch {
	case at == nil && del:
		return false
	case at == nil:
		b.Store(&placementNode{hash: h, next: head, p: p})
		return false
	}
	tail := at.next
	if !del {
		tail = &placementNode{hash: h, next: tail, p: p}
	}
	b.Store(copyBefore(head, at, tail))
	return true
}

// copyBefore returns a copy of the chain from n up to (not including) stop,
// followed by tail.
func copyBefore(n, stop, tail *placementNode) *placementNode {
	if n == stop {
		return tail
	}
	return &placementNode{hash: n.hash, next: copyBefore(n.next, stop, tail), p: n.p}
}

// grown returns a new index of the given size holding x's placements in
// new nodes (x's readers may still walk the old ones).
func (x *placementIndex) grown(buckets int) *placementIndex {
	g := newPlacementIndex(buckets)
	for i := range x.buckets {
		for n := x.buckets[i].Load(); n != nil; n = n.next {
			b, h := g.bucket(n.p.Key)
			b.Store(&placementNode{hash: h, next: b.Load(), p: n.p})
		}
	}
	return g
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
