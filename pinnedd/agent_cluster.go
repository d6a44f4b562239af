package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
	"github.com/pinnedd/pinnedd/statestore"
)

// directoryLeader is the leader-only directory upkeep: it makes sure the
// cluster secret exists and garbage-collects lapsed workers and expired
// drains.
func directoryLeader(ctx context.Context, dir *pinboard.Directory, log *slog.Logger) {
	if len(dir.Machine().Secret()) == 0 {
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		if _, err := dir.Do(ctx, directory.Init{Secret: secret}); err != nil && ctx.Err() == nil {
			log.Warn("init cluster secret", "err", err)
		}
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			res, err := dir.Do(ctx, directory.GC{Now: time.Now().UnixMilli()})
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("directory gc", "err", err)
				}
				continue
			}
			if res.WorkersForgotten+res.DrainsExpired > 0 {
				log.Info("directory gc", "workers_forgotten", res.WorkersForgotten, "placements_dropped", res.PlacementsDropped, "drains_expired", res.DrainsExpired)
			}
		}
	}
}

func raftHealth(store *raftstore.Store) map[string]any {
	id, api := store.Leader()
	st := store.Stats()
	return map[string]any{
		"leader": id, "leaderUrl": api, "raftState": st["state"], "isLeader": store.IsLeader(),
		"term": st["term"], "lastContact": st["last_contact"],
	}
}

// joinUntilDone asks the member at url to add this node, retrying with
// backoff until it succeeds: on a restart it is harmless (join is
// idempotent), and the member may simply not be up yet.
func joinUntilDone(ctx context.Context, url, token string, store *raftstore.Store, log *slog.Logger) {
	client := &http.Client{Timeout: 15 * time.Second}
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		err := store.JoinCluster(ctx, client, url)
		if err == nil {
			log.Info("joined the cluster", "via", url)
			return
		}
		if errors.Is(err, raftstore.ErrUnauthorized) {
			log.Error("join refused: the member does not accept this node's token; every node of a cluster needs the same PINBOARD_TOKEN", "via", url, "retry_in", delay)
		} else if errors.Is(err, raftstore.ErrUntrustedCA) || errors.Is(err, raftstore.ErrNoClusterCA) {
			log.Error("join failed: no trusted cluster certificate", "via", url, "err", err, "retry_in", delay)
		} else {
			log.Warn("join failed; retrying", "via", url, "err", err, "retry_in", delay)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// joinHandler serves POST /_pinned/join {"url": ...}: `pinnedd join` asks
// the local agent to join the cluster through the member at url.
func joinHandler(tokens *pinboard.Tokens, cfg agentConfig, store *raftstore.Store, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := tokens.Check(r, pinboard.ScopeOperator); err != nil {
			pinboard.WriteAuthError(w, err)
			return
		}
		var req struct {
			URL string `json:"url"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.URL == "" {
			httpx.WriteError(w, http.StatusBadRequest, `body must be {"url": "http://member:port"}`, 0)
			return
		}
		if u, err := url.Parse(req.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			httpx.WriteError(w, http.StatusBadRequest, "url must be an absolute http(s) URL", 0)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		err := store.JoinCluster(ctx, &http.Client{}, req.URL)
		if err != nil {
			log.Warn("join failed", "via", req.URL, "err", err)
			httpx.WriteError(w, http.StatusBadGateway, "join via "+req.URL+": "+err.Error(), 0)
			return
		}
		log.Info("joined the cluster", "via", req.URL)
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "nodeId": store.NodeID()})
	})
}

// scanMarked is the leader's background scanner: instances with marked
// durable work whose id is unplaced or whose owner's lease lapsed are woken
// on a live worker, so interrupted work resumes without any client.
func scanMarked(ctx context.Context, states statestore.Store, fd *pinboard.FrontDoor, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		after := statestore.InstanceKey{}
		for ctx.Err() == nil {
			page, err := states.ListMarked(ctx, after, 256)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("scan for marked work", "err", err)
				}
				break
			}
			for _, k := range page {
				woke, err := fd.Wake(ctx, directory.Key{Namespace: k.Namespace, ID: k.ID})
				switch {
				case err != nil && ctx.Err() == nil:
					log.Debug("wake for marked work failed", "instance", k.String(), "err", err)
				case woke:
					log.Info("woke an instance to resume its marked work", "instance", k.String())
				}
			}
			if len(page) < 256 {
				break
			}
			after = page[len(page)-1]
		}
	}
}

// waitToBeJoined says, until this node has a leader, that it has neither
// --bootstrap nor --join and waits for an operator to join it: without it
// such a node would only log failed lease renewals.
func waitToBeJoined(ctx context.Context, store *raftstore.Store, advertise string, log *slog.Logger) {
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := store.WaitForLeader(wctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Warn("not in a cluster yet: this node has neither --bootstrap nor --join and waits to be joined; run `pinnedd join --addr " + advertise + " <member url>`, or restart it with --join <member url>")
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

// leaveHandler serves POST /_pinned/leave {"deadline": seconds}: the node
// drains (by the deadline, default --drain-deadline), deregisters, leaves
// the Raft cluster (handing leadership over first) and exits 0. It answers
// 202 at once; the caller watches the node go away.
func leaveHandler(store *raftstore.Store, defaultDeadline time.Duration, leave chan<- time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Deadline *float64 `json:"deadline"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			httpx.WriteError(w, http.StatusBadRequest, `body must be {"deadline": <seconds>} or empty`, 0)
			return
		}
		deadline := defaultDeadline
		if req.Deadline != nil {
			if *req.Deadline < 0 || *req.Deadline > 24*3600 {
				httpx.WriteError(w, http.StatusBadRequest, "deadline must be 0 to 86400 seconds", 0)
				return
			}
			deadline = time.Duration(*req.Deadline * float64(time.Second))
		}
		members, err := store.Members(r.Context())
		if err != nil {
			httpx.WriteError(w, http.StatusServiceUnavailable, "cannot read the cluster's members: "+err.Error(), time.Second)
			return
		}
		otherVoters, selfVoter := 0, false
		for _, m := range members {
			if m.ID == store.NodeID() {
				selfVoter = m.Voter
			} else if m.Voter {
				otherVoters++
			}
		}
		if selfVoter && otherVoters == 0 {
			httpx.WriteError(w, http.StatusConflict, "this node is the cluster's only voter: there is no cluster to leave; stop it instead", 0)
			return
		}
		select {
		case leave <- deadline:
		default: // already leaving
		}
		httpx.WriteJSON(w, http.StatusAccepted, map[string]any{"ok": true, "nodeId": store.NodeID(), "deadlineMs": deadline.Milliseconds()})
	}
}
