// Package faulty wraps a statestore.Store for tests that need a commit to
// happen at a moment they choose, or not at all: a hook runs before every
// Commit and may hold it (block until the test lets it go) or fail it (an
// error, nothing applied). Everything else goes to the wrapped store. It is
// for tests only: nothing in pinnedd imports it.
package faulty

import (
	"context"
	"sync"

	"github.com/pinnedd/pinnedd/statestore"
)

// Hook runs before a Commit reaches the wrapped store. A non-nil error
// fails the commit with it, unapplied; returning nil lets it through.
type Hook func(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) error

// Store is a statestore.Store whose commits pass a Hook first.
type Store struct {
	statestore.Store

	mu   sync.Mutex
	hook Hook
}

// New wraps inner; with no hook set, it behaves exactly like inner.
func New(inner statestore.Store) *Store { return &Store{Store: inner} }

// SetHook sets the hook every later Commit passes (nil removes it).
func (s *Store) SetHook(h Hook) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

// Commit runs the hook, then the wrapped store's Commit.
func (s *Store) Commit(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) (statestore.CommitResult, error) {
	s.mu.Lock()
	h := s.hook
	s.mu.Unlock()
	if h != nil {
		if err := h(ctx, inst, gen, muts); err != nil {
			return statestore.CommitResult{}, err
		}
	}
	return s.Store.Commit(ctx, inst, gen, muts)
}

// Gate holds the commits a Hook sends to it until Open. Entered is closed
// when the first one arrives, so a test knows a commit is in flight and
// has not returned.
type Gate struct {
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
	opened  sync.Once
}

// NewGate returns a closed gate.
func NewGate() *Gate { return &Gate{entered: make(chan struct{}), open: make(chan struct{})} }

// Wait holds the caller (a Hook) until Open or ctx ends.
func (g *Gate) Wait(ctx context.Context) error {
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Entered is closed once a commit waits at the gate.
func (g *Gate) Entered() <-chan struct{} { return g.entered }

// Open lets every held and later commit through.
func (g *Gate) Open() { g.opened.Do(func() { close(g.open) }) }

// Touches reports whether muts write tray ns (any id) with an operation
// match accepts.
func Touches(muts []statestore.Mutation, ns string, match func(statestore.Mutation) bool) bool {
	for _, m := range muts {
		if statestore.TrayOf(m).NS == ns && match(m) {
			return true
		}
	}
	return false
}

// Appends matches AppendItems.
func Appends(m statestore.Mutation) bool { _, ok := m.(statestore.AppendItems); return ok }

// SetsField returns a matcher of SetField for field name.
func SetsField(name string) func(statestore.Mutation) bool {
	return func(m statestore.Mutation) bool { f, ok := m.(statestore.SetField); return ok && f.Name == name }
}
