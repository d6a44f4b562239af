package raftstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// forwarder calls the leader's RPCs from a follower: over the cluster port (peerClient, mutual
// TLS, no token) or the leader's public API with the deployment token; onLeader decides,
// per operation, to run it here or there.
type forwarder struct {
	s      *Store
	client *http.Client
	// closeClient closes the connections of a client Open made itself.
	closeClient func()
	// peerClient calls other nodes' cluster ports, with mutual TLS (nil without).
	peerClient *http.Client
}

// call sends one RPC to the node at baseURL. forwarded marks it as sent by a raftstore node to
// the leader.
func (fw *forwarder) call(ctx context.Context, baseURL, op string, body []byte, forwarded bool) ([]byte, error) {
	client, token := fw.clientFor()
	return doRPC(ctx, client, baseURL, bearer(token), http.MethodPost, op, "application/octet-stream", body, forwarded)
}

func (fw *forwarder) callJSON(ctx context.Context, baseURL, op string, in, out any, forwarded bool) error {
	client, token := fw.clientFor()
	return callJSON(ctx, client, baseURL, bearer(token), op, in, out, forwarded)
}

// clientFor is the client and bearer token for a call to another node: over mutual TLS to its
// cluster port, with no token (the certificate speaks for this node), or to its public port
// with the deployment token.
func (fw *forwarder) clientFor() (*http.Client, string) {
	if fw.peerClient != nil {
		return fw.peerClient, ""
	}
	return fw.client, fw.s.cfg.Token
}

// leaderBase is the current leader's id and the base URL its node-to-node RPCs take: its
// cluster port over TLS, else its public API. "" when no leader is known (or, without TLS,
// it has not recorded its API address).
func (fw *forwarder) leaderBase() (id, base string) {
	addr, lid := fw.s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	if fw.peerClient != nil {
		return string(lid), "https://" + string(addr)
	}
	return string(lid), fw.s.fsm.apiAddr(string(lid))
}

// whileLeader returns ctx, cut short with the cause ErrLeaderChanged once this node sees a
// leader other than id, or none. A request forwarded to a leader that was then cut off gets no
// answer, not even an error (a partition drops packets silently): without this it would wait
// out its whole timeout after the followers had already elected another leader, holding up
// whatever queued behind it. Cancel the returned func when done.
func (fw *forwarder) whileLeader(ctx context.Context, id string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		// The change channel is the fast path; the ticker covers observations raft dropped.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			changed := fw.s.lead.changes()
			if cur, _ := fw.s.Leader(); cur != id || fw.s.closed.Load() {
				cancel(ErrLeaderChanged)
				return
			}
			select {
			case <-changed:
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// onLeader runs local on the leader, or remote against the leader's API on a follower. It waits
// and retries while the attempt failed without starting (ErrNotLeader, ErrNoLeader), until ctx
// (or ApplyTimeout, if ctx has no deadline) ends. It never retries ErrOutcomeUnknown.
func (fw *forwarder) onLeader(ctx context.Context, op string, local func(context.Context) error, remote func(context.Context, string) error) error {
	if fw.s.closed.Load() {
		return fmt.Errorf("raftstore: %s: %w", op, ErrClosed)
	}
	if err := fw.s.Fault(); err != nil {
		return fmt.Errorf("raftstore: %s: %w", op, err)
	}
	ctx, cancel := withDefault(ctx, fw.s.cfg.ApplyTimeout)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		changed := fw.s.lead.changes()
		var err error
		if fw.s.IsLeader() {
			err = local(ctx)
		} else if id, api := fw.leaderBase(); id != "" && id != fw.s.cfg.NodeID && api != "" {
			rctx, stop := fw.whileLeader(ctx, id)
			err = remote(rctx, api)
			stop()
		} else {
			err = ErrNoLeader
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrOutcomeUnknown) || !(errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNoLeader)) {
			return err
		}
		if fw.s.closed.Load() {
			return fmt.Errorf("raftstore: %s: %w", op, ErrClosed)
		}
		t := time.NewTimer(backoff)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("raftstore: %s: %w: %w", op, err, ctx.Err())
		}
		t.Stop()
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// openForwardClient makes the client that forwards RPCs to the leader, unless the config
// brings one.
func (fw *forwarder) openForwardClient(undo *cleanups) {
	fw.client = fw.s.cfg.HTTPClient
	if fw.client != nil {
		return
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if fw.s.cfg.APIRoots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: fw.s.cfg.APIRoots, MinVersion: tls.VersionTLS12}
	}
	// Forwards to the leader run concurrently (group-commit flushers,
	// registrations); the default 2 idle connections per host would
	// make every extra one dial and close.
	tr.MaxIdleConnsPerHost = 64
	// Forwarded applies are small and on the claim path: written and
	// read on the caller's goroutine, without net/http's per-connection
	// goroutine hand-offs (large bodies and https go to tr).
	sync := &httpx.SyncTransport{Fallback: tr, MaxIdlePerHost: 64, DialTimeout: 5 * time.Second}
	fw.client = &http.Client{Transport: sync}
	fw.closeClient = func() { sync.Close(); tr.CloseIdleConnections() }
	undo.add(fw.closeClient)
}
