package pinboard

import (
	"context"
	"crypto/rand"
	"log/slog"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// DefaultHousekeepingInterval is how often the leader garbage-collects the
// directory.
const DefaultHousekeepingInterval = time.Minute

// Housekeeping is the leader's upkeep of the directory: it makes sure the
// cluster secret exists, then every interval garbage-collects workers whose
// lease lapsed long ago and drains that expired. It is leader-only work
// (raftstore's RunAsLeader): the times it proposes are read here, before
// the command enters the log.
type Housekeeping struct {
	dir   *Directory
	every time.Duration
	log   *slog.Logger
}

// NewHousekeeping returns the upkeep of dir, run every interval
// (DefaultHousekeepingInterval when 0).
func NewHousekeeping(dir *Directory, every time.Duration, log *slog.Logger) *Housekeeping {
	if every <= 0 {
		every = DefaultHousekeepingInterval
	}
	return &Housekeeping{dir: dir, every: every, log: log}
}

// Run keeps the directory until ctx ends (leadership lost, or the store
// closes).
func (h *Housekeeping) Run(ctx context.Context) {
	if len(h.dir.Machine().Secret()) == 0 {
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		if h.dir.sealSecret != nil {
			secret = h.dir.sealSecret(secret)
		}
		if _, err := h.dir.Do(ctx, directory.Init{Secret: secret}); err != nil && ctx.Err() == nil {
			h.log.Warn("init cluster secret", "err", err)
		}
	}
	h.resealSecret(ctx)
	everyTick(ctx, h.every, h.collect)
}

// resealSecret records the cluster secret again sealed under this leader's
// token when it opened with one being rotated out, so that the old token
// can go. Only leaders reseal, so once every node runs with the new token
// first, the secret ends up under it.
func (h *Housekeeping) resealSecret(ctx context.Context) {
	m := h.dir.Machine()
	plain := m.Secret()
	if h.dir.sealSecret == nil || len(plain) == 0 || !m.SecretStale() {
		return
	}
	res, err := h.dir.Do(ctx, directory.Reseal{Secret: h.dir.sealSecret(plain)})
	switch {
	case err != nil:
		if ctx.Err() == nil {
			h.log.Warn("sealing the cluster secret again under this node's token failed; trying again at the next housekeeping", "err", err)
		}
	case res.Code == directory.CodeOK:
		h.log.Info("sealed the cluster secret again under this node's token (it opened with a token being rotated out)")
	}
}

// LeasePreamble is the first command of every term a new leader commits
// (raftstore's SetLeaderPreamble): RenewLeases at the leader's clock with
// the lease TTL its registry grants (DefaultLeaseTTL when 0), naming the
// node that led before. It comes before any heartbeat, claim or GC of the
// term, so none judges a lease that lapsed only for want of a leader (the
// directory package's doc, "Leases").
func LeasePreamble(ttl time.Duration) raftstore.LeaderPreamble {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return func(formerLeader string) []byte {
		return directory.Encode(directory.RenewLeases{Now: time.Now().UnixMilli(), TTLMs: ttl.Milliseconds(), FormerLeader: formerLeader})
	}
}

// everyTick runs fn every interval until ctx ends: the leader-only parts'
// loop.
func everyTick(ctx context.Context, every time.Duration, fn func(context.Context)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// collect proposes one GC at the current time and logs what it removed.
func (h *Housekeeping) collect(ctx context.Context) {
	h.resealSecret(ctx) // a failed reseal is tried again, tick by tick
	res, err := h.dir.Do(ctx, directory.GC{Now: time.Now().UnixMilli()})
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("directory gc", "err", err)
		}
		return
	}
	if res.WorkersForgotten+res.DrainsExpired > 0 {
		h.log.Info("directory gc", "workers_forgotten", res.WorkersForgotten, "placements_dropped", res.PlacementsDropped, "drains_expired", res.DrainsExpired)
	}
}
