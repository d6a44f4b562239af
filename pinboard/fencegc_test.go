package pinboard

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// The collector tells the store what the directory holds: the fences of placed ids stay (also
// one whose owner has not loaded it yet, which must still load), those of released ids that
// never wrote go, and their stale owners stay fenced.
func TestFenceCollectorKeepsPlacedIds(t *testing.T) {
	_, dir := oneNodeDirectory(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	if res, err := dir.Do(ctx, directory.Register{
		ClientID: "w", SessionID: "s", NodeID: "n1", AdvertiseURL: "http://w", Namespaces: []string{"/c"},
		Headroom: 10, TTLMs: 3_600_000, Now: now,
	}); err != nil || res.Code != directory.CodeOK {
		t.Fatalf("register: %v %v", res.Code, err)
	}
	claim := func(id string) uint64 {
		t.Helper()
		res, err := dir.Do(ctx, directory.Claim{Key: directory.Key{Namespace: "/c", ID: id}, ClientID: "w", Now: time.Now().UnixMilli()})
		if err != nil || !res.HasPlacement() {
			t.Fatalf("claim %s: %v %v", id, res.Code, err)
		}
		return res.Placement.Generation
	}
	key := func(id string) statestore.InstanceKey { return statestore.InstanceKey{Namespace: "/c", ID: id} }
	store := memstore.New()
	defer store.Close()
	// Claimed in this order: the floor stays at or below the unloaded placement's generation,
	// so only fences below it can go.
	released, placed, unloaded := claim("released"), claim("placed"), claim("unloaded")
	for id, gen := range map[string]uint64{"placed": placed, "released": released} {
		if _, err := store.Load(ctx, key(id), gen); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := dir.Do(ctx, directory.Release{Key: directory.Key{Namespace: "/c", ID: "released"}, ClientID: "w", Generation: released}); err != nil || res.Code != directory.CodeOK {
		t.Fatalf("release: %v %v", res.Code, err)
	}

	NewFenceCollector(dir, store, 0, slog.New(slog.DiscardHandler)).Collect(ctx)

	if g, _ := store.Generation(ctx, key("placed")); g != placed {
		t.Fatalf("a placed id's fence: generation %d, want %d", g, placed)
	}
	if g, _ := store.Generation(ctx, key("released")); g != 0 {
		t.Fatalf("a released id that never wrote keeps its fence (generation %d)", g)
	}
	if _, err := store.Load(ctx, key("released"), released); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("the released id's old owner: err = %v, want ErrFenced", err)
	}
	if _, err := store.Load(ctx, key("unloaded"), unloaded); err != nil {
		t.Fatalf("a placement not loaded before the collection: %v", err)
	}
	if _, err := store.Load(ctx, key("released"), claim("released")); err != nil {
		t.Fatalf("the released id placed again: %v", err)
	}
}
