package pinboard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// Applier commits an encoded directory command and returns the state
// machine's encoded result: raftstore.Store, also for a one-node --dev
// cluster, so every node runs the same code path.
type Applier interface {
	Apply(ctx context.Context, cmd []byte) ([]byte, error)
}

// ErrDirectory wraps a command the state machine could not apply at all
// (malformed, unknown type): a bug or a version skew, never a refusal.
var ErrDirectory = errors.New("directory command failed")

// Directory is the placement directory as this node uses it: reads from the
// local machine (possibly stale in a fleet), writes through the applier.
//
// Writes are group-committed: Do queues the command, and a few flushers
// each take whatever has queued up (up to MaxBatch) and apply it as one
// Batch entry, so a burst of claims costs one Raft round trip (and one
// forward to the leader) per batch rather than per claim. An idle
// directory sends a lone command as itself, with no added wait. On a
// follower the applier forwards each entry to the leader, whose Directory
// queues its commands with its own (see directory_handoff.go), so the
// leader's flushers merge every node's commands into few entries.
type Directory struct {
	m       *directory.Machine
	applier Applier
	// host is the applier as the leader's end of forwarding; nil if it
	// is not one (then nothing is ever forwarded here).
	host forwardHost

	queue  chan *pending
	stop   chan struct{}
	ctx    context.Context // cancelled by Close: in-flight batches give up
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mergedIn atomic.Int64 // commands of followers' batches queued here

	sealSecret func([]byte) []byte // see SealSecretWith
}

// SealSecretWith sets how the cluster secret a leader draws is sealed
// before the log records it (the Machine's SecretOpener opens it). Set it
// before housekeeping runs; without it the secret is recorded in clear.
func (d *Directory) SealSecretWith(seal func(plain []byte) []byte) { d.sealSecret = seal }

type pending struct {
	ctx  context.Context
	cmd  directory.Command
	done chan outcome
	// forwarded: a follower forwarded it here; it is committed on this
	// node or not at all, never passed on again.
	forwarded bool
}

type outcome struct {
	res directory.Result
	err error
}

// Batching limits. Flushers bound the batches in flight at once; MaxBatch
// bounds one entry (its encoding stays well under raftstore's 4 MiB).
const (
	flushers     = 2 // measured: 1 leaves the link idle during decode, 4 splits bursts into small entries
	MaxBatch     = 1024
	batchTimeout = 10 * time.Second
)

// NewDirectory reads from m and writes through a. If a is the leader's
// end of forwarding (raftstore.Store), the commands followers forward to
// it are queued with this node's own from now until Close. Close stops
// its flushers.
func NewDirectory(m *directory.Machine, a Applier) *Directory {
	d := &Directory{m: m, applier: a, queue: make(chan *pending, 4*MaxBatch), stop: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	for range flushers {
		d.wg.Add(1)
		go d.flusher()
	}
	if h, ok := a.(forwardHost); ok {
		d.host = h
		h.SetForwarded(d.takeForwarded)
	}
	return d
}

// Close stops the flushers; commands still queued fail with ErrClosed.
// Commands forwarded to this node from then on go straight to its log.
func (d *Directory) Close() {
	if d.host != nil {
		d.host.SetForwarded(nil)
	}
	close(d.stop)
	d.cancel()
	d.wg.Wait()
	for {
		select {
		case p := <-d.queue:
			p.done <- outcome{err: ErrClosed}
		default:
			return
		}
	}
}

// ErrClosed: the directory was closed.
var ErrClosed = errors.New("directory closed")

// Machine is the local replica, for reads.
func (d *Directory) Machine() *directory.Machine { return d.m }

// Do applies one command (group-committed with concurrent ones) and
// decodes its result. If ctx ends first the command may still be applied;
// every command is safe to retry.
func (d *Directory) Do(ctx context.Context, cmd directory.Command) (directory.Result, error) {
	p := &pending{ctx: ctx, cmd: cmd, done: make(chan outcome, 1)}
	if err := d.enqueue(ctx, p); err != nil {
		return directory.Result{}, err
	}
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		return directory.Result{}, ctx.Err()
	}
}

func (d *Directory) enqueue(ctx context.Context, p *pending) error {
	select {
	case d.queue <- p:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.stop:
		return ErrClosed
	}
}

func (d *Directory) flusher() {
	defer d.wg.Done()
	batch := make([]*pending, 0, MaxBatch)
	for {
		select {
		case <-d.stop:
			return
		case p := <-d.queue:
			batch = append(batch[:0], p)
		}
	fill:
		for len(batch) < MaxBatch {
			select {
			case p := <-d.queue:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		// A command whose caller gave up before it was sent is dropped:
		// applied late it could act on a world that moved on (a heartbeat
		// stamped before a partition, applied after it).
		live := batch[:0]
		for _, p := range batch {
			if err := p.ctx.Err(); err != nil {
				p.done <- outcome{err: err}
				continue
			}
			live = append(live, p)
		}
		if len(live) > 0 {
			d.flush(live)
		}
	}
}

// flush applies batch as one entry and hands each command its result.
// A batch holding a forwarded command is committed on this node only; if
// this node no longer leads, its forwarded commands go back to their
// followers as not started (each retries with the next leader) and its own
// go on through the applier.
func (d *Directory) flush(batch []*pending) {
	ctx, cancel := context.WithTimeout(d.ctx, batchTimeout)
	defer cancel()
	apply := d.applier.Apply
	here := slices.ContainsFunc(batch, func(p *pending) bool { return p.forwarded })
	if here {
		apply = d.host.ApplyLocal
	}
	cmds := make([]directory.Command, len(batch))
	for i, p := range batch {
		cmds[i] = p.cmd
	}
	// A follower sends even a lone command as a batch: the leader merges
	// batches with its own commands (a lone command is its own entry).
	lone := len(cmds) == 1 && (d.host == nil || d.host.IsLeader())
	results, err := commit(ctx, apply, cmds, lone)
	if here && errors.Is(err, raftstore.ErrNotLeader) {
		own := batch[:0]
		for _, p := range batch {
			if p.forwarded {
				p.done <- outcome{err: err}
			} else {
				own = append(own, p)
			}
		}
		if len(own) > 0 {
			d.flush(own)
		}
		return
	}
	d.deliver(batch, results, err)
}

// commit applies cmds as one entry (with lone, the one command as itself)
// and returns one result per command.
func commit(ctx context.Context, apply func(context.Context, []byte) ([]byte, error), cmds []directory.Command, lone bool) ([]directory.Result, error) {
	if lone {
		res, err := applyOne(ctx, apply, cmds[0])
		return []directory.Result{res}, err
	}
	res, err := applyOne(ctx, apply, directory.Batch{Commands: cmds})
	if err == nil && res.Code == directory.CodeError {
		err = fmt.Errorf("%w: %s", ErrDirectory, res.Reason)
	}
	return res.Results, err
}

// deliver hands each command its result, or all of them err.
func (d *Directory) deliver(batch []*pending, results []directory.Result, err error) {
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("%w: batch of %d answered with %d results", ErrDirectory, len(batch), len(results))
	}
	for i, p := range batch {
		if err != nil {
			p.done <- outcome{err: err}
			continue
		}
		r := results[i]
		var rerr error
		if r.Code == directory.CodeError {
			rerr = fmt.Errorf("%w: %s", ErrDirectory, r.Reason)
		}
		p.done <- outcome{r, rerr}
	}
}

// DoNow applies one command as its own entry, bypassing group commit.
func (d *Directory) DoNow(ctx context.Context, cmd directory.Command) (directory.Result, error) {
	res, err := applyOne(ctx, d.applier.Apply, cmd)
	if err == nil && res.Code == directory.CodeError {
		err = fmt.Errorf("%w: %s", ErrDirectory, res.Reason)
	}
	return res, err
}

// applyOne commits cmd through apply and decodes the machine's result.
func applyOne(ctx context.Context, apply func(context.Context, []byte) ([]byte, error), cmd directory.Command) (directory.Result, error) {
	out, err := apply(ctx, directory.Encode(cmd))
	if err != nil {
		return directory.Result{}, err
	}
	res, err := directory.DecodeResult(out)
	if err != nil {
		return directory.Result{}, fmt.Errorf("%w: %w", ErrDirectory, err)
	}
	return res, nil
}
