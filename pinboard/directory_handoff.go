package pinboard

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// Hand-off: a follower writes through raftstore, which forwards each entry
// to the leader's POST /_raft/apply (token-authorized, bounded, cut short
// when the follower sees another leader). There raftstore hands it to the
// leader's Directory, whose flushers merge a follower's batch with every
// other node's commands, so the leader appends a few large entries instead
// of one per node per flush.

// forwardHost is an Applier that forwards a follower's commands to the
// leader (raftstore.Store): on the leader it hands them to a
// ForwardedFunc, and ApplyLocal commits on this node only.
type forwardHost interface {
	IsLeader() bool
	SetForwarded(raftstore.ForwardedFunc)
	ApplyLocal(ctx context.Context, cmd []byte) ([]byte, error)
}

// takeForwarded is this node's raftstore.ForwardedFunc. A forwarded Batch
// is a follower's group commit: its commands are queued with this node's
// own and answered with a Result holding one per command, a command the
// directory refuses as malformed as CodeError in its slot. If any command's
// outcome is unknown the whole batch's is, and the follower treats every
// command in it as unknown; if none was started the follower retries them
// with the next leader. A lone command is its own entry, as DoNow
// promises.
func (d *Directory) takeForwarded(ctx context.Context, raw []byte) ([]byte, error) {
	cmd, err := directory.DecodeCommand(raw) // refuses a batch inside a batch
	if err != nil {
		return nil, fmt.Errorf("%w: malformed directory command: %w", raftstore.ErrBadRequest, err)
	}
	b, ok := cmd.(directory.Batch)
	if !ok {
		return d.host.ApplyLocal(ctx, raw)
	}
	if len(b.Commands) == 0 || len(b.Commands) > MaxBatch {
		return nil, fmt.Errorf("%w: want a batch of 1 to %d commands, got %d", raftstore.ErrBadRequest, MaxBatch, len(b.Commands))
	}
	cmds := b.Commands
	d.mergedIn.Add(int64(len(cmds)))
	ps := make([]*pending, 0, len(cmds))
	var failed []error // of commands not answered by the machine
	for _, c := range cmds {
		p := &pending{ctx: ctx, cmd: c, done: make(chan outcome, 1), forwarded: true}
		if err := d.enqueue(ctx, p); err != nil {
			failed = append(failed, err)
			break
		}
		ps = append(ps, p)
	}
	results := make([]directory.Result, len(ps))
	answered := 0
	for i, p := range ps {
		var o outcome
		select {
		case o = <-p.done:
		case <-ctx.Done():
			// The follower gave up: commands not yet sent are dropped, any
			// already sent may still commit.
			return nil, fmt.Errorf("%w: %w", raftstore.ErrOutcomeUnknown, ctx.Err())
		}
		switch {
		case o.err == nil:
			results[i] = o.res
			answered++
		case errors.Is(o.err, ErrDirectory):
			results[i] = directory.Result{Code: directory.CodeError, Reason: o.res.Reason}
			if results[i].Reason == "" {
				results[i].Reason = o.err.Error()
			}
			answered++
		default:
			failed = append(failed, o.err)
		}
	}
	if len(failed) > 0 {
		return nil, forwardedFailure(answered, failed)
	}
	return directory.EncodeResult(directory.Result{Code: directory.CodeOK, Results: results}), nil
}

// forwardedFailure is the one error a forwarded entry answers with when
// some of its commands failed: not started only if none was answered and
// every failure was a not-started one, else outcome unknown.
func forwardedFailure(answered int, failed []error) error {
	for _, err := range failed {
		if answered > 0 || !notStarted(err) {
			if errors.Is(err, raftstore.ErrOutcomeUnknown) {
				return err
			}
			return fmt.Errorf("%w: %w", raftstore.ErrOutcomeUnknown, err)
		}
	}
	if errors.Is(failed[0], ErrClosed) {
		// The directory is closing: nothing was queued for good.
		return fmt.Errorf("%w: %w", raftstore.ErrClosed, failed[0])
	}
	return failed[0]
}

// notStarted reports whether err says a command never entered the log.
func notStarted(err error) bool {
	if errors.Is(err, raftstore.ErrOutcomeUnknown) {
		return false
	}
	return errors.Is(err, raftstore.ErrNotLeader) || errors.Is(err, raftstore.ErrNoLeader) ||
		errors.Is(err, raftstore.ErrClosed) || errors.Is(err, ErrClosed)
}
