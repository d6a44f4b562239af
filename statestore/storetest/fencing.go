package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/pinnedd/pinnedd/statestore"
)

// The fencing half of the suite: a generation fences every older one, and CollectFences drops
// the fences no live instance needs.

func testFencing(t *testing.T, h *harness) {
	s := h.store(t)
	ctx := t.Context()
	if err := s.Fence(ctx, inst1, 5); err != nil {
		t.Fatalf("Fence(5): %v", err)
	}
	commit(t, s, inst1, 5, statestore.SetField{Tray: logT, Name: "m", Value: []byte("by 5")})
	if err := s.Fence(ctx, inst1, 4); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Fence(4) after 5: err = %v, want ErrFenced", err)
	}
	if _, err := s.Load(ctx, inst1, 4); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Load(4) after 5: err = %v, want ErrFenced", err)
	}
	_, err := s.Commit(ctx, inst1, 4, []statestore.Mutation{
		statestore.SetField{Tray: logT, Name: "m", Value: []byte("by 4")},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("stale")},
	})
	if !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Commit(4) after 5: err = %v, want ErrFenced", err)
	}
	// Equal generation is the same activation: allowed.
	if err := s.Fence(ctx, inst1, 5); err != nil {
		t.Fatalf("Fence(5) again: %v", err)
	}
	expectState(t, s, inst1, 5, `[log:~ marked=false fields{m="by 5" } items{}]`)
	if g := generation(t, s, inst1); g != 5 {
		t.Fatalf("Generation = %d, want 5", g)
	}
	// A successor fences its predecessor before writing anything.
	if err := s.Fence(ctx, inst1, 9); err != nil {
		t.Fatalf("Fence(9): %v", err)
	}
	if _, err := s.Commit(ctx, inst1, 5, []statestore.Mutation{statestore.SetField{Tray: logT, Name: "m", Value: []byte("late")}}); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Commit(5) after Fence(9): err = %v, want ErrFenced", err)
	}
	// A newer commit raises the generation too, and a newer Load.
	commit(t, s, inst1, 12, statestore.SetField{Tray: logT, Name: "m", Value: []byte("by 12")})
	if g := generation(t, s, inst1); g != 12 {
		t.Fatalf("Generation after Commit(12) = %d, want 12", g)
	}
	load(t, s, inst1, 20)
	if err := s.Fence(ctx, inst1, 19); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Fence(19) after Load(20): err = %v, want ErrFenced", err)
	}
	expectState(t, s, inst1, 20, `[log:~ marked=false fields{m="by 12" } items{}]`)
	// Fenced errors say so in their text too, for logs.
	if err := s.Fence(ctx, inst1, 1); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("fenced error text = %v", err)
	}
}

func collect(t testing.TB, s statestore.Store, below uint64, live ...statestore.Live) int {
	t.Helper()
	n, err := s.CollectFences(context.Background(), below, live)
	if err != nil {
		t.Fatalf("CollectFences(%d): %v", below, err)
	}
	return n
}

// expectFenced checks that every call an owner of inst at gen makes is refused and changes
// nothing.
func expectFenced(t testing.TB, s statestore.Store, inst statestore.InstanceKey, gen uint64) {
	t.Helper()
	ctx := context.Background()
	if err := s.Fence(ctx, inst, gen); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Fence(%s, %d): err = %v, want ErrFenced", inst, gen, err)
	}
	if _, err := s.Load(ctx, inst, gen); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Load(%s, %d): err = %v, want ErrFenced", inst, gen, err)
	}
	if _, err := s.Commit(ctx, inst, gen, []statestore.Mutation{
		statestore.SetField{Tray: logT, Name: "m", Value: []byte("stale")},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("stale")},
	}); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Commit(%s, %d): err = %v, want ErrFenced", inst, gen, err)
	}
}

// testCollectFences: the fence of an instance that never wrote is dropped, and its stale owner
// is still refused: the floor fences it now.
func testCollectFences(t *testing.T, h *harness) {
	s := h.store(t)
	load(t, s, inst1, 5) // an activation that only read
	if err := s.Fence(t.Context(), inst2, 6); err != nil {
		t.Fatal(err)
	}
	if n := collect(t, s, 10); n != 2 {
		t.Fatalf("CollectFences dropped %d fences, want 2", n)
	}
	if g := generation(t, s, inst1); g != 0 {
		t.Fatalf("Generation after collection = %d, want 0 (no fence)", g)
	}
	if n := collect(t, s, 10); n != 0 {
		t.Fatalf("second CollectFences dropped %d, want 0", n)
	}
	expectFenced(t, s, inst1, 5)
	expectFenced(t, s, inst2, 9) // below the floor, though newer than what it had
	inst3 := statestore.InstanceKey{Namespace: "/threads", ID: "never-seen"}
	expectFenced(t, s, inst3, 9)
	if g := generation(t, s, inst1); g != 0 {
		t.Fatalf("Generation after refused calls = %d, want 0: a refusal must leave no fence", g)
	}
	// A placement granted after the collection passes, and its instance is fenced as before.
	if trays := load(t, s, inst1, 10); len(trays) != 0 {
		t.Fatalf("Load(10) = %s, want empty", describe(trays))
	}
	commit(t, s, inst1, 11, statestore.SetField{Tray: logT, Name: "m", Value: []byte("by 11")})
	expectFenced(t, s, inst1, 10)
	expectState(t, s, inst1, 11, `[log:~ marked=false fields{m="by 11" } items{}]`)
	// The floor never goes down.
	collect(t, s, 3)
	expectFenced(t, s, inst3, 9)
}

// testCollectFencesKeeps: a fence that still matters stays, and its owner keeps writing under
// a generation below the floor.
func testCollectFencesKeeps(t *testing.T, h *harness) {
	s := h.store(t)
	withField := statestore.InstanceKey{Namespace: "/c", ID: "field"}
	wroteItems := statestore.InstanceKey{Namespace: "/c", ID: "items"}
	live := statestore.InstanceKey{Namespace: "/c", ID: "live"}
	newer := statestore.InstanceKey{Namespace: "/c", ID: "newer"}
	commit(t, s, withField, 2, statestore.SetField{Tray: logT, Name: "m", Value: []byte("v")})
	// Its items are settled and its trays gone, but it handed out seqs: dropping its fence
	// would let seqs be reused.
	res := commit(t, s, wroteItems, 3, statestore.AppendItems{Tray: cmdA, Payloads: payloads("a")})
	commit(t, s, wroteItems, 3, statestore.RemoveItems{Tray: cmdA, UpTo: res.Seqs[0][0]})
	load(t, s, live, 4)
	load(t, s, newer, 12)
	if n := collect(t, s, 10, statestore.Live{Inst: live, Generation: 4}); n != 0 {
		t.Fatalf("CollectFences dropped %d fences, want 0", n)
	}
	for inst, gen := range map[statestore.InstanceKey]uint64{withField: 2, wroteItems: 3, live: 4, newer: 12} {
		if g := generation(t, s, inst); g != gen {
			t.Fatalf("Generation(%s) = %d, want %d", inst, g, gen)
		}
		// The owner's fence row is below the floor: its row, not the floor, is what it must reach.
		if err := s.Fence(t.Context(), inst, gen); err != nil {
			t.Fatalf("Fence(%s, %d) after collection: %v", inst, gen, err)
		}
		commit(t, s, inst, gen, statestore.SetField{Tray: logT, Name: "n", Value: []byte("w")})
		expectFenced(t, s, inst, gen-1)
	}
	next := commit(t, s, wroteItems, 3, statestore.AppendItems{Tray: cmdA, Payloads: payloads("b")})
	if next.Seqs[0][0] <= res.Seqs[0][0] {
		t.Fatalf("seq %d after collection reuses or precedes %d", next.Seqs[0][0], res.Seqs[0][0])
	}
}

// testCollectFloorSparesUnloaded: a live placement whose owner has not loaded its instance yet
// keeps the floor at or below its generation, so its first Load passes.
func testCollectFloorSparesUnloaded(t *testing.T, h *harness) {
	s := h.store(t)
	pending := statestore.InstanceKey{Namespace: "/c", ID: "pending"}
	old := statestore.InstanceKey{Namespace: "/c", ID: "old"}
	mid := statestore.InstanceKey{Namespace: "/c", ID: "mid"}
	load(t, s, old, 3)
	load(t, s, mid, 8)
	// The directory granted pending at 7 and mid at 8 (now released); pending's owner has not
	// loaded it yet. The floor stays at 7, so mid's fence (8) is not below it and stays.
	if n := collect(t, s, 10, statestore.Live{Inst: pending, Generation: 7}); n != 1 {
		t.Fatalf("CollectFences dropped %d fences, want 1 (old's)", n)
	}
	if g := generation(t, s, mid); g != 8 {
		t.Fatalf("Generation(mid) = %d, want 8", g)
	}
	load(t, s, pending, 7)
	commit(t, s, pending, 7, statestore.SetField{Tray: logT, Name: "m", Value: []byte("v")})
	expectFenced(t, s, old, 3)
	expectFenced(t, s, statestore.InstanceKey{Namespace: "/c", ID: "other"}, 6)
}

func testCollectFencesValidation(t *testing.T, h *harness) {
	s := h.store(t)
	load(t, s, inst1, 5)
	for name, live := range map[string][]statestore.Live{
		"generation 0":  {{Inst: inst2, Generation: 0}},
		"empty id":      {{Inst: statestore.InstanceKey{Namespace: "/threads"}, Generation: 3}},
		"NUL in the id": {{Inst: statestore.InstanceKey{Namespace: "/threads", ID: "a\x00b"}, Generation: 3}},
	} {
		if _, err := s.CollectFences(t.Context(), 10, live); !errors.Is(err, statestore.ErrInvalid) {
			t.Fatalf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := s.CollectFences(t.Context(), statestore.MaxGeneration+1, nil); !errors.Is(err, statestore.ErrInvalid) {
		t.Fatalf("below over MaxGeneration: err = %v, want ErrInvalid", err)
	}
	// Nothing was dropped, and no floor was set.
	if g := generation(t, s, inst1); g != 5 {
		t.Fatalf("Generation = %d, want 5", g)
	}
	load(t, s, inst2, 1)
}

func testCollectFencesReopen(t *testing.T, h *harness) {
	if h.reopen == nil {
		return
	}
	s := h.store(t)
	load(t, s, inst1, 5)
	collect(t, s, 10)
	s2 := h.reopen(t, s)
	t.Cleanup(func() { _ = s2.Close() })
	if err := s2.Setup(t.Context()); err != nil {
		t.Fatalf("Setup after reopen: %v", err)
	}
	expectFenced(t, s2, inst1, 5)
	load(t, s2, inst1, 10)
}

func testConcurrentFence(t *testing.T, h *harness) {
	s := h.store(t)
	stores := []statestore.Store{s}
	if h.attach != nil {
		o := h.attach(t, s)
		t.Cleanup(func() { _ = o.Close() })
		stores = append(stores, o)
	}
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = stores[i%len(stores)].Fence(context.Background(), inst1, uint64(i+1))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, statestore.ErrFenced) {
			t.Fatalf("Fence(%d): %v", i+1, err)
		}
	}
	if errs[n-1] != nil {
		t.Fatalf("Fence(%d), the newest, failed: %v", n, errs[n-1])
	}
	if g := generation(t, s, inst1); g != n {
		t.Fatalf("Generation after racing fences = %d, want %d", g, n)
	}
}

// testConcurrentGenerations races writers of an old generation against a successor that fences
// and then writes. Every item's seq records the order in which commits took effect, so the
// invariant reads directly off the final state: no item of the old generation after the first
// item of the new one, and every acknowledged commit present, every refused one absent.
func testConcurrentGenerations(t *testing.T, h *harness) {
	s := h.store(t)
	oldStore, newStore := s, s
	if h.attach != nil {
		o := h.attach(t, s)
		t.Cleanup(func() { _ = o.Close() })
		newStore = o // the successor runs on "another node"
	}
	const (
		oldGen, newGen = 10, 20
		oldWriters     = 3
		newWrites      = 20
	)
	commit(t, s, inst1, oldGen) // the predecessor is placed first
	started := make(chan struct{})
	var once sync.Once
	type outcome struct {
		payload string
		err     error
	}
	var (
		mu      sync.Mutex
		results []outcome
	)
	record := func(o outcome) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, o)
	}
	var wg sync.WaitGroup
	for w := range oldWriters {
		wg.Go(func() {
			for i := 0; ; i++ {
				p := fmt.Sprintf("old-%d-%d", w, i)
				_, err := oldStore.Commit(context.Background(), inst1, oldGen, []statestore.Mutation{
					statestore.AppendItems{Tray: cmdA, Payloads: payloads(p)},
					statestore.SetField{Tray: logT, Name: "last", Value: []byte(p)},
				})
				record(outcome{p, err})
				if err != nil {
					return
				}
				if i == 2 {
					once.Do(func() { close(started) })
				}
			}
		})
	}
	wg.Go(func() {
		<-started
		if err := newStore.Fence(context.Background(), inst1, newGen); err != nil {
			record(outcome{"fence", err})
			return
		}
		for i := range newWrites {
			p := fmt.Sprintf("new-%d", i)
			_, err := newStore.Commit(context.Background(), inst1, newGen, []statestore.Mutation{
				statestore.AppendItems{Tray: cmdA, Payloads: payloads(p)},
				statestore.SetField{Tray: logT, Name: "last", Value: []byte(p)},
			})
			record(outcome{p, err})
		}
	})
	wg.Wait()

	acked := map[string]bool{}
	for _, r := range results {
		switch {
		case r.err == nil:
			acked[r.payload] = true
		case strings.HasPrefix(r.payload, "old-") && errors.Is(r.err, statestore.ErrFenced):
		default:
			t.Fatalf("%s: %v", r.payload, r.err)
		}
	}
	trays := load(t, s, inst1, newGen)
	var items []statestore.Item
	var last string
	for _, tr := range trays {
		switch tr.Key {
		case cmdA:
			items = tr.Items
		case logT:
			last = string(tr.Fields["last"])
		}
	}
	seenNew := false
	stored := map[string]bool{}
	for _, it := range items {
		p := string(it.Payload)
		stored[p] = true
		if strings.HasPrefix(p, "new-") {
			seenNew = true
		} else if seenNew {
			t.Fatalf("stale write %s (seq %d) took effect after the successor's writes: %s", p, it.Seq, describe(trays))
		}
	}
	if !maps.Equal(acked, stored) {
		t.Fatalf("acknowledged commits %v differ from stored items %v", keys(acked), keys(stored))
	}
	if last != fmt.Sprintf("new-%d", newWrites-1) {
		t.Fatalf("field last = %q, want the successor's final write", last)
	}
}
