package pinboard

import (
	"context"
	"log/slog"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/statestore"
)

// KeyWaker makes sure an instance runs somewhere, reporting whether it
// activated it; FrontDoor.Wake is one.
type KeyWaker interface {
	Wake(ctx context.Context, key directory.Key) (bool, error)
}

// MarkedLister lists the instances holding marked durable work, as
// statestore.Store's ListMarked does.
type MarkedLister interface {
	ListMarked(ctx context.Context, after statestore.InstanceKey, limit int) ([]statestore.InstanceKey, error)
}

// DefaultScanInterval is how often the leader looks for marked work.
const DefaultScanInterval = 5 * time.Second

// scanPage is how many marked instances one ListMarked call returns.
const scanPage = 256

// MarkedScanner is the leader's background scanner: every interval it
// walks the instances with marked durable work and wakes each one, so an
// instance whose id is unplaced or whose owner's lease lapsed resumes its
// interrupted work without any client. Waking one that is placed on a live
// worker is the waker's no-op.
type MarkedScanner struct {
	states MarkedLister
	waker  KeyWaker
	every  time.Duration
	page   int
	log    *slog.Logger
}

// NewMarkedScanner returns a scanner of states that wakes through w every
// interval (DefaultScanInterval when 0). states should bound its calls
// (statestore.Bounded): a scan must not hang on a store that stopped
// answering.
func NewMarkedScanner(states MarkedLister, w KeyWaker, every time.Duration, log *slog.Logger) *MarkedScanner {
	if every <= 0 {
		every = DefaultScanInterval
	}
	return &MarkedScanner{states: states, waker: w, every: every, page: scanPage, log: log}
}

// Run scans every interval until ctx ends (leadership lost, or the store
// closes).
func (s *MarkedScanner) Run(ctx context.Context) { everyTick(ctx, s.every, s.scan) }

// scan walks every marked instance once, a page at a time. A failed wake
// is logged and the walk goes on; a failed listing ends this pass (the
// next one starts over).
func (s *MarkedScanner) scan(ctx context.Context) {
	after := statestore.InstanceKey{}
	for ctx.Err() == nil {
		page, err := s.states.ListMarked(ctx, after, s.page)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("scan for marked work", "err", err)
			}
			return
		}
		for _, k := range page {
			env, ns := plugins.SplitStateNamespace(k.Namespace)
			woke, err := s.waker.Wake(ctx, directory.Key{Env: env, Namespace: ns, ID: k.ID})
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Debug("wake for marked work failed", "instance", k.String(), "err", err)
			case woke:
				s.log.Info("woke an instance to resume its marked work", "instance", k.String())
			}
		}
		if len(page) < s.page {
			return
		}
		after = page[len(page)-1]
	}
}
