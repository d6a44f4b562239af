package pinboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// Hand-off: a follower's flusher sends its batch to the leader's
// Directory, whose flushers merge it with every other node's commands, so
// the leader appends a few large entries instead of one per node per
// flush. Measured on BenchmarkClaims3Nodes (64 writers spread over three
// nodes): every node forwarding its own entries reached about half the
// claims/s of the same writers all on the leader.

// HandOffPath is the leader-side route that takes a follower's batch.
const HandOffPath = "/_pinned/directory/batch"

// leaderInfo is what the Directory needs to know of its Applier to hand
// off (raftstore.Store has it).
type leaderInfo interface {
	IsLeader() bool
	Leader() (id, apiAddr string)
	// WhileLeader: ctx, ended once this node sees another leader (or
	// none), so a batch handed to a leader that was cut off does not wait
	// out its whole timeout in the silence.
	WhileLeader(ctx context.Context, id string) (context.Context, context.CancelFunc)
}

// ErrHandOff: the leader could not take a handed-off batch; its commands'
// outcomes are unknown (each is safe to retry).
var ErrHandOff = errors.New("directory hand-off failed")

// errNoHandOffRoute: the leader does not know the route (an older release,
// mid rolling upgrade); nothing was applied, so the batch goes the usual way.
var errNoHandOffRoute = errors.New("leader has no hand-off route")

// maxHandOffBody bounds a handed-off batch: MaxBatch commands of a few
// hundred bytes each.
const maxHandOffBody = 8 << 20

// SetHandOff makes a follower's flushers hand their batches to the
// leader's Directory at <leader API>/_pinned/directory/batch, sending
// token as a bearer token. Call it before the Directory is used.
func (d *Directory) SetHandOff(client *http.Client, token string) {
	d.handOffClient, d.handOffToken = client, token
}

// handOffTarget is the leader (its id and API URL) if this batch should be handed off:
// hand-off is on, this node is a follower that knows the leader, and no
// command in the batch was itself handed here (a batch goes one hop, so
// two nodes that each think the other leads cannot pass it back and forth).
func (d *Directory) handOffTarget(batch []*pending) (li leaderInfo, id, api string) {
	if d.handOffClient == nil {
		return nil, "", ""
	}
	li, ok := d.applier.(leaderInfo)
	if !ok || li.IsLeader() {
		return nil, "", ""
	}
	for _, p := range batch {
		if p.remote {
			return nil, "", ""
		}
	}
	id, api = li.Leader()
	if id == "" || api == "" {
		return nil, "", ""
	}
	return li, id, api
}

// handOff sends cmds to the leader's Directory and returns one result per
// command.
func (d *Directory) handOff(ctx context.Context, api string, cmds []directory.Command) ([]directory.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(api, "/")+HandOffPath,
		bytes.NewReader(directory.Encode(directory.Batch{Commands: cmds})))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandOff, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if d.handOffToken != "" {
		req.Header.Set("Authorization", "Bearer "+d.handOffToken)
	}
	resp, err := d.handOffClient.Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrHandOff, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHandOffBody))
	if err != nil {
		return nil, fmt.Errorf("%w: reading the answer: %w", ErrHandOff, err)
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		// A leader from a release without the route took nothing.
		return nil, errNoHandOffRoute
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: leader answered %d: %s", ErrHandOff, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	res, err := directory.DecodeResult(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDirectory, err)
	}
	return res.Results, nil
}

// ServeHandOff takes a follower's batch (an encoded directory.Batch),
// queues its commands with this node's own and answers with their results
// (an encoded Result holding one per command). A command the directory
// refuses as malformed comes back as CodeError in its slot; if any
// command's outcome is unknown the whole batch answers 503, and the
// follower treats every command in it as unknown.
func (d *Directory) ServeHandOff(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHandOffBody))
	if err != nil {
		http.Error(w, "reading batch: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	cmd, err := directory.DecodeCommand(body) // refuses a batch inside a batch
	if err != nil {
		http.Error(w, "malformed batch: "+err.Error(), http.StatusBadRequest)
		return
	}
	b, ok := cmd.(directory.Batch)
	if !ok || len(b.Commands) == 0 || len(b.Commands) > MaxBatch {
		http.Error(w, fmt.Sprintf("want a batch of 1 to %d commands", MaxBatch), http.StatusBadRequest)
		return
	}
	d.handedIn.Add(int64(len(b.Commands)))
	ps := make([]*pending, len(b.Commands))
	for i, c := range b.Commands {
		ps[i] = &pending{ctx: r.Context(), cmd: c, done: make(chan outcome, 1), remote: true}
		if err := d.enqueue(r.Context(), ps[i]); err != nil {
			http.Error(w, "queueing: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	results := make([]directory.Result, len(ps))
	for i, p := range ps {
		var o outcome
		select {
		case o = <-p.done:
		case <-r.Context().Done():
			return // the follower gave up; its commands' outcomes are unknown to it
		}
		switch {
		case o.err == nil:
			results[i] = o.res
		case errors.Is(o.err, ErrDirectory):
			results[i] = directory.Result{Code: directory.CodeError, Reason: o.res.Reason}
			if results[i].Reason == "" {
				results[i].Reason = o.err.Error()
			}
		default:
			http.Error(w, o.err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(directory.EncodeResult(directory.Result{Code: directory.CodeOK, Results: results}))
}
