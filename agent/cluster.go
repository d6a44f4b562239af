package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/sdnotify"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/raftstore"
)

// raftHealth is what /healthz and /_pinned/status say of Raft.
func raftHealth(store *raftstore.Store) map[string]any {
	id, api := store.Leader()
	st := store.Stats()
	return map[string]any{
		"leader": id, "leaderUrl": api, "raftState": st["state"], "isLeader": store.IsLeader(),
		"term": st["term"], "lastContact": st["last_contact"],
	}
}

// memberAPIAddrs lists the Raft members' front-door addresses (the per-IP
// connection cap exempts them).
func memberAPIAddrs(store *raftstore.Store) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ms, err := store.Members(ctx)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.APIAddr)
	}
	return out
}

// joinUntilDone asks the member at url to add this node, retrying with
// backoff until it succeeds: on a restart it is harmless (join is
// idempotent), and the member may simply not be up yet.
func joinUntilDone(ctx context.Context, url string, store *raftstore.Store, client *http.Client, log *slog.Logger) {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		err := store.JoinCluster(ctx, client, url)
		if err == nil {
			log.Info("joined the cluster", "via", url)
			return
		}
		if errors.Is(err, raftstore.ErrUnauthorized) {
			log.Error("join refused: the member does not accept this node's token; every node of a cluster needs the same PINBOARD_TOKEN", "via", url, "retry_in", delay)
		} else if errors.Is(err, raftstore.ErrForbidden) {
			log.Error("join refused: a member of the cluster already has this node's id; if this node was rebuilt without its data dir, remove the old member first (`pinnedd remove <id>`)", "via", url, "err", err, "retry_in", delay)
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
func joinHandler(tokens *pinboard.Tokens, store *raftstore.Store, client *http.Client, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := tokens.AuthorizeFleet(r, pinboard.ScopeOperator); err != nil {
			tokens.Refuse(w, err)
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
		err := store.JoinCluster(ctx, client, req.URL)
		if err != nil {
			log.Warn("join failed", "via", req.URL, "err", err)
			httpx.WriteError(w, http.StatusBadGateway, "join via "+req.URL+": "+err.Error(), 0)
			return
		}
		log.Info("joined the cluster", "via", req.URL)
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "nodeId": store.NodeID()})
	})
}

// waitToBeJoined says, until this node has a leader, why it has none when
// an operator must act: a new node without --bootstrap or --join waits to
// be joined, and a node restarted on the data dir of a node that left (or
// was removed) is no member until it joins again. Without it such a node
// would only log failed lease renewals, or Raft's own words. A member that
// merely waits for its leader (a restart, a lost quorum) gets no hint.
func waitToBeJoined(ctx context.Context, store *raftstore.Store, advertise string, log *slog.Logger) {
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := store.WaitForLeader(wctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		if !store.HadExistingState() {
			log.Warn("not in a cluster yet: this node has neither --bootstrap nor --join and waits to be joined; run `pinnedd join --addr " + advertise + " <member url>`, or restart it with --join <member url>")
		} else if removed, others, err := store.Removed(ctx); err == nil && removed {
			member := "<member url>"
			for _, m := range others {
				if m.APIAddr != "" {
					member = m.APIAddr
					break
				}
			}
			log.Warn("this node left the cluster (or was removed from it) and serves nothing until it joins again; run `pinnedd join --addr "+advertise+" "+member+"`, or restart it with --join "+member,
				"members", memberIDs(others))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

func memberIDs(ms []raftstore.Member) []string {
	ids := make([]string, 0, len(ms))
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
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

// notifyReady tells systemd READY=1 once the node serves: Raft is open,
// the front door listens and the worker is registered (a node without
// hosts: once it follows a leader).
func (a *Agent) notifyReady(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ready := false
		if a.worker != nil {
			ready = a.worker.Lease(time.Now()) == pinboard.LeaseHealthy
		} else {
			id, _ := a.store.Leader()
			ready = id != ""
		}
		if ready {
			if err := sdnotify.Ready(); err != nil {
				a.log.Warn("sd_notify READY", "err", err)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// servePprof serves net/http/pprof under /_pinned/debug/pprof/ (its Index
// only knows /debug/pprof/, so named profiles are routed here).
func servePprof(w http.ResponseWriter, r *http.Request) {
	switch name := strings.TrimPrefix(r.URL.Path, "/_pinned/debug/pprof/"); name {
	case "":
		pprof.Index(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "trace":
		pprof.Trace(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "cmdline":
		pprof.Cmdline(w, r)
	default:
		pprof.Handler(name).ServeHTTP(w, r)
	}
}
