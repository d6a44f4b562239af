package pinboard

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// Applier commits an encoded directory command and returns the state
// machine's encoded result. raftstore.Store is the fleet's applier;
// LocalApplier serves a node that runs without Raft.
type Applier interface {
	Apply(ctx context.Context, cmd []byte) ([]byte, error)
}

// LocalApplier applies commands straight to a machine, numbering them like
// a log would. It is the single-node directory: same state machine, same
// commands, no replication.
type LocalApplier struct {
	mu    sync.Mutex
	m     *directory.Machine
	index uint64
}

// NewLocalApplier drives m, continuing from its applied index.
func NewLocalApplier(m *directory.Machine) *LocalApplier {
	return &LocalApplier{m: m, index: m.AppliedIndex()}
}

// Apply implements Applier.
func (a *LocalApplier) Apply(ctx context.Context, cmd []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.index++
	return a.m.Apply(a.index, cmd), nil
}

// ErrDirectory wraps a command the state machine could not apply at all
// (malformed, unknown type): a bug or a version skew, never a refusal.
var ErrDirectory = errors.New("directory command failed")

// Directory is the placement directory as this node uses it: reads from the
// local machine (possibly stale in a fleet), writes through the applier.
type Directory struct {
	m       *directory.Machine
	applier Applier
}

// NewDirectory reads from m and writes through a.
func NewDirectory(m *directory.Machine, a Applier) *Directory {
	return &Directory{m: m, applier: a}
}

// Machine is the local replica, for reads.
func (d *Directory) Machine() *directory.Machine { return d.m }

// Do applies one command and decodes its result.
func (d *Directory) Do(ctx context.Context, cmd directory.Command) (directory.Result, error) {
	out, err := d.applier.Apply(ctx, directory.Encode(cmd))
	if err != nil {
		return directory.Result{}, err
	}
	res, err := directory.DecodeResult(out)
	if err != nil {
		return directory.Result{}, fmt.Errorf("%w: %w", ErrDirectory, err)
	}
	if res.Code == directory.CodeError {
		return res, fmt.Errorf("%w: %s", ErrDirectory, res.Reason)
	}
	return res, nil
}
