package directory

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// chain returns the placements a reader walking from head sees, by key.
func chain(head *placementNode) map[Key]Placement {
	got := make(map[Key]Placement)
	for n := head; n != nil; n = n.next {
		got[n.p.Key] = n.p
	}
	return got
}

// With every key in one chain, stores and deletes anywhere in it keep the
// index equal to a plain map, and a reader that loaded the chain before a
// write still walks the chain as it was.
func TestPlacementIndexChains(t *testing.T) {
	x := newPlacementIndex(1)
	model := make(map[Key]Placement)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 5000 {
		k := Key{Env: []string{"", "e"}[rng.IntN(2)], Namespace: "/n", ID: fmt.Sprint(rng.IntN(12))}
		del := rng.IntN(3) == 0
		p := Placement{Key: k, Owner: fmt.Sprint("w", i), Generation: uint64(i)}

		before := x.buckets[0].Load()
		seen := chain(before)
		if !maps.Equal(seen, model) {
			t.Fatalf("step %d: chain %v, model %v", i, seen, model)
		}
		_, had := model[k]
		if was := x.store(k, p, del); was != had {
			t.Fatalf("step %d: store of %v reported present %v, model %v", i, k, was, had)
		}
		if del {
			delete(model, k)
		} else {
			model[k] = p
		}
		if !maps.Equal(chain(before), seen) {
			t.Fatalf("step %d: a write changed the chain a reader already held", i)
		}
		for mk, mp := range model {
			if got, ok := x.find(mk); !ok || got != mp {
				t.Fatalf("step %d: find %v = %+v (%v), model %+v", i, mk, got, ok, mp)
			}
		}
		if got, ok := x.find(Key{Namespace: "/n", ID: "absent"}); ok {
			t.Fatalf("step %d: found an absent key: %+v", i, got)
		}
	}
}

// The table grows while it fills, whether one entry adds many placements
// or many entries add a few: it never holds more placements than half its
// buckets, and every placement stays findable and is counted once.
func TestPlacementTableGrows(t *testing.T) {
	const n = 10 * minPlacementBuckets
	for _, every := range []int{n, 7} {
		tb := newPlacementTable()
		for i := range n {
			tb.set(Placement{Key: Key{Namespace: "/n", ID: fmt.Sprint(i)}, Owner: "w", Generation: uint64(i)})
			if (i+1)%every == 0 {
				tb.commit()
				if b := len(tb.index.Load().buckets); 2*tb.n > b {
					t.Fatalf("commit every %d: %d placements in %d buckets", every, tb.n, b)
				}
			}
		}
		tb.commit()
		count := 0
		tb.each(func(Placement) { count++ })
		if count != n || tb.n != n || len(tb.keysOf("w")) != n {
			t.Fatalf("commit every %d: each saw %d, count %d, owner index %d; want %d", every, count, tb.n, len(tb.keysOf("w")), n)
		}
		for i := range n {
			if p, ok := tb.load(Key{Namespace: "/n", ID: fmt.Sprint(i)}); !ok || p.Generation != uint64(i) {
				t.Fatalf("commit every %d: placement %d: %+v (%v)", every, i, p, ok)
			}
		}
	}
}
