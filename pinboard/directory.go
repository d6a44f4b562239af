package pinboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
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
// directory sends a lone command as itself, with no added wait. With
// SetHandOff a follower's flushers hand their batches to the leader's
// Directory instead, whose flushers merge every node's commands.
type Directory struct {
	m       *directory.Machine
	applier Applier

	queue  chan *pending
	stop   chan struct{}
	ctx    context.Context // cancelled by Close: in-flight batches give up
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Hand-off to the leader's Directory (SetHandOff); nil client: off.
	handOffClient *http.Client
	handOffToken  string
	handedIn      atomic.Int64 // commands followers handed here
}

type pending struct {
	ctx  context.Context
	cmd  directory.Command
	done chan outcome
	// remote: handed here by a follower; never handed off again.
	remote bool
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

// NewDirectory reads from m and writes through a. Close stops its flushers.
func NewDirectory(m *directory.Machine, a Applier) *Directory {
	d := &Directory{m: m, applier: a, queue: make(chan *pending, 4*MaxBatch), stop: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	for range flushers {
		d.wg.Add(1)
		go d.flusher()
	}
	return d
}

// Close stops the flushers; commands still queued fail with ErrClosed.
func (d *Directory) Close() {
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
func (d *Directory) flush(batch []*pending) {
	ctx, cancel := context.WithTimeout(d.ctx, batchTimeout)
	defer cancel()
	cmds := make([]directory.Command, len(batch))
	for i, p := range batch {
		cmds[i] = p.cmd
	}
	if li, id, api := d.handOffTarget(batch); li != nil {
		hctx, stop := li.WhileLeader(ctx, id)
		results, err := d.handOff(hctx, api, cmds)
		stop()
		if !errors.Is(err, errNoHandOffRoute) {
			d.deliver(batch, results, err)
			return
		}
	}
	if len(batch) == 1 {
		res, err := d.DoNow(ctx, cmds[0])
		batch[0].done <- outcome{res, err}
		return
	}
	res, err := d.DoNow(ctx, directory.Batch{Commands: cmds})
	d.deliver(batch, res.Results, err)
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
