package pinboard

import (
	"context"
	"log/slog"
	"time"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/statestore"
)

// DefaultFenceGCInterval is how often the leader collects the state store's fences of
// instances that never wrote.
const DefaultFenceGCInterval = time.Minute

// FenceCollectorStore is what the collector needs of a statestore.Store.
type FenceCollectorStore interface {
	CollectFences(ctx context.Context, below uint64, live []statestore.Live) (int, error)
}

// FenceCollector is the leader's collection of fences that fence nothing: every interval it
// hands the state store the directory's placements and its newest generation, and the store
// drops the fences of instances that hold no state, never wrote and are not placed (see
// statestore's "Collecting fences"). Without it every id a client ever named, by a read
// alone, keeps a fence row for ever.
type FenceCollector struct {
	dir   *Directory
	store FenceCollectorStore
	every time.Duration
	log   *slog.Logger
}

// NewFenceCollector returns the collector of store's fences, run every interval
// (DefaultFenceGCInterval when 0). store should bound its calls (statestore.Bounded).
func NewFenceCollector(dir *Directory, store FenceCollectorStore, every time.Duration, log *slog.Logger) *FenceCollector {
	if every <= 0 {
		every = DefaultFenceGCInterval
	}
	return &FenceCollector{dir: dir, store: store, every: every, log: log}
}

// Run collects every interval until ctx ends (leadership lost, or the store closes).
func (c *FenceCollector) Run(ctx context.Context) { everyTick(ctx, c.every, c.Collect) }

// Collect runs one collection. The directory is read before the store is called, so every
// placement granted after the read has a generation above what the store is told is the
// newest: a stale read only makes the store keep more.
func (c *FenceCollector) Collect(ctx context.Context) {
	ps, newest := c.dir.Machine().LivePlacements()
	live := make([]statestore.Live, len(ps))
	for i, p := range ps {
		live[i] = statestore.Live{Inst: statestore.InstanceKey{Namespace: plugins.StateNamespace(p.Key.Env, p.Key.Namespace), ID: p.Key.ID}, Generation: p.Generation}
	}
	total := 0
	for ctx.Err() == nil {
		n, err := c.store.CollectFences(ctx, newest+1, live)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("collect state store fences", "err", err)
			}
			break
		}
		total += n
		if n == 0 {
			break
		}
	}
	if total > 0 {
		c.log.Info("collected state store fences of instances that never wrote", "dropped", total)
	}
}
