package pinboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
)

// maxRegistryBody bounds a registry request body.
const maxRegistryBody = 256 << 10

// decodeBody reads one JSON object into v; anything else is a 400.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRegistryBody))
	if err := dec.Decode(v); err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error(), 0)
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		httpx.WriteError(w, http.StatusBadRequest, "invalid JSON body: trailing data", 0)
		return false
	}
	return true
}

// registryError answers a Registry error with its status (REGISTRY.md):
// 400 bad request, 403 challenge failed, 409 advertise URL in use or
// register again, 404 unknown client, 503 no secret or no directory.
func (a *API) registryError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrBadRequest):
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
	case errors.Is(err, ErrChallengeFailed):
		httpx.WriteError(w, http.StatusForbidden, err.Error(), 0)
	case errors.Is(err, ErrAdvertiseInUse):
		httpx.WriteError(w, http.StatusConflict, err.Error(), 0)
	case errors.Is(err, ErrReregister):
		httpx.WriteJSON(w, http.StatusConflict, map[string]any{"error": "session unknown or lapsed: register again", "reregister": true})
	case errors.Is(err, ErrBindingConflict):
		var re *RouteError
		errors.As(err, &re)
		httpx.WriteJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "routes": re.Routes})
	case errors.Is(err, ErrUnknownClient):
		httpx.WriteError(w, http.StatusNotFound, err.Error()+": register first", 0)
	case errors.Is(err, ErrNoSecret):
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error()+"; nothing was registered", time.Second)
	case r.Context().Err() != nil:
		httpx.Abandon()
	default:
		a.cfg.Logger.Warn("registry request failed", "path", r.URL.Path, "err", err)
		httpx.WriteError(w, http.StatusServiceUnavailable, "directory unavailable", time.Second)
	}
}

func (a *API) registryRegister(w http.ResponseWriter, r *http.Request) {
	var req RegisterRequest
	if !decodeBody(w, r, &req) || !a.admitsRegistration(w, r, req) {
		return
	}
	ack, err := a.cfg.Registry.Register(r.Context(), req)
	if err != nil {
		a.registryError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, ack)
}

// admitsRegistration answers 403 and reports false unless the key r came
// with admits every namespace req announces or keeps ids of, every
// namespace of the worker whose session it would replace (the same client
// id), and the address it advertises (claims allowedBackendHosts: an IP
// the claims' prefixes hold, unless they hold "*").
func (a *API) admitsRegistration(w http.ResponseWriter, r *http.Request, req RegisterRequest) bool {
	k := KeyOf(r)
	if k == nil {
		return true
	}
	namespaces := slices.Clone(req.Namespaces)
	for _, id := range req.LiveIDs {
		namespaces = append(namespaces, id.Namespace)
	}
	// Hostname-aware: the claims' hostnames and envs bound what the key
	// may register (a route the registry refuses anyway is its to answer).
	routes, _ := req.routes(a.cfg.Registry.IsHostnameAware())
	for _, rt := range routes {
		namespaces = append(namespaces, rt.Namespace)
		if !k.Claims.Hostname(rt.Hostname) || !k.Claims.Env(rt.Env) {
			refuseClaims(w, r, fmt.Sprintf("key %q may not register hostname %s in env %s: its claims hostnames and envs admit others", k.Name, rt.Hostname, rt.Env))
			return false
		}
	}
	for _, ns := range namespaces {
		if !admitsNamespace(w, r, ns) {
			return false
		}
	}
	// The answer names none of the namespaces of the worker it would
	// replace: a narrowed key learns nothing of another client id's.
	if wk, ok := a.cfg.Dir.Machine().Worker(req.ClientID); ok && (slices.ContainsFunc(wk.Namespaces, func(ns string) bool { return !k.Claims.Namespace(ns) }) ||
		slices.ContainsFunc(wk.Routes, func(rt directory.Route) bool {
			return !k.Claims.Namespace(rt.Namespace) || !k.Claims.Hostname(rt.Hostname) || !k.Claims.Env(rt.Env)
		})) {
		refuseClaims(w, r, fmt.Sprintf("key %q may not replace the registration of client id %q", k.Name, req.ClientID))
		return false
	}
	if k.Claims.AnyBackendHost() {
		return true
	}
	u, err := url.Parse(req.AdvertiseURL)
	if err != nil {
		return true // the registry refuses it, saying why
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil || !k.Claims.BackendHost(ip) {
		refuseClaims(w, r, fmt.Sprintf("key %q may not advertise %q: its claims allowedBackendHosts admit other addresses (an IP address they hold)", k.Name, u.Host))
		return false
	}
	return true
}

func (a *API) registryHeartbeat(w http.ResponseWriter, r *http.Request) {
	var req HeartbeatRequest
	if !decodeBody(w, r, &req) {
		return
	}
	ack, err := a.cfg.Registry.Heartbeat(r.Context(), req)
	var re *RouteError
	if errors.As(err, &re) && errors.Is(err, ErrSuperseded) {
		// The seeds' nack: the lease is renewed for the worker's other
		// routes, but these it must stop serving.
		httpx.WriteJSON(w, http.StatusConflict, map[string]any{"error": re.Error(), "superseded": true,
			"routes": re.Routes, "expiresInMs": ack.ExpiresInMs})
		return
	}
	if err != nil {
		a.registryError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, ack)
}

func (a *API) registryDeregister(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ClientID  string `json:"clientId"`
		SessionID string `json:"sessionId"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if req.ClientID == "" || req.SessionID == "" {
		httpx.WriteError(w, http.StatusBadRequest, "clientId and sessionId are required", 0)
		return
	}
	if err := a.cfg.Registry.Deregister(r.Context(), req.ClientID, req.SessionID); err != nil {
		a.registryError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// releaseRequest is POST /registry/release: a worker gives back one id.
type releaseRequest struct {
	ClientID   string `json:"clientId"`
	SessionID  string `json:"sessionId"`
	Env        string `json:"env,omitempty"`
	Namespace  string `json:"namespace"`
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
}

// registryRelease serves POST /registry/release (worker scope): 200
// {"released": true} when the placement went, {"released": false} when
// there was none (given back already); 409 with the placement in force
// when it is not this session's under that generation, 409 reregister for
// a session the directory replaced, 404 for an unknown client id.
func (a *API) registryRelease(w http.ResponseWriter, r *http.Request) {
	var req releaseRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Env != "" {
		httpx.WriteError(w, http.StatusBadRequest, "env requires hostname-aware mode", 0)
		return
	}
	res, err := a.cfg.Registry.GiveBack(r.Context(), GiveBack{
		ClientID: req.ClientID, SessionID: req.SessionID, Generation: req.Generation,
		Key: InstanceKey{Namespace: req.Namespace, ID: req.ID},
	})
	if errors.Is(err, ErrNotYours) {
		held := res.Held
		msg := fmt.Sprintf("%s/%s is placed under generation %d, not %d", req.Namespace, req.ID, held.Generation, req.Generation)
		if held.Owner != req.ClientID {
			msg = fmt.Sprintf("%s/%s is held by another worker", req.Namespace, req.ID)
		}
		httpx.WriteJSON(w, http.StatusConflict, map[string]any{
			"error": msg + ": nothing was released", "generation": held.Generation, "yours": held.Owner == req.ClientID,
		})
		return
	}
	if err != nil {
		a.registryError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "released": res.Released})
}

// windDownAnswer reads a worker's answer to POST /_pinned/wind_down: a
// 200 must carry {"instances": N}, the number of instances it now winds
// down (0 is a valid count). A 200 without it is an error naming what is
// missing, so an outside worker that acknowledges generically is reported
// as failed rather than counted as winding down nothing.
func windDownAnswer(status int, body []byte) (int, error) {
	var out struct {
		Instances *int   `json:"instances"`
		Error     string `json:"error"`
	}
	jerr := json.Unmarshal(body, &out)
	switch {
	case status != http.StatusOK && out.Error != "":
		return 0, fmt.Errorf("answered %d: %s", status, out.Error)
	case status != http.StatusOK:
		return 0, fmt.Errorf("answered %d", status)
	case jerr != nil || out.Instances == nil:
		return 0, errors.New(`answered 200 without {"instances": N} (pinboard/REGISTRY.md, wind_down)`)
	case *out.Instances < 0:
		return 0, fmt.Errorf("answered a negative instance count %d", *out.Instances)
	}
	return *out.Instances, nil
}

// WorkerView is one worker as GET /registry/workers shows it.
type WorkerView struct {
	ClientID     string   `json:"clientId"`
	AdvertiseURL string   `json:"advertiseUrl"`
	SessionID    string   `json:"sessionId"`
	NodeID       string   `json:"nodeId"`
	Namespaces   []string `json:"namespaces"`
	// Routes, in hostname-aware mode, in place of Namespaces.
	Routes        []RouteView `json:"routes,omitempty"`
	Headroom      int64       `json:"headroom"`
	Live          bool        `json:"live"`
	ExpiresInMs   int64       `json:"expiresInMs"`
	Degraded      bool        `json:"degraded"`
	Draining      bool        `json:"draining"`
	DrainSources  []string    `json:"drainSources,omitempty"` // "local", "operator"
	Cordoned      bool        `json:"cordoned,omitempty"`
	DrainDeadline int64       `json:"drainDeadline,omitempty"`
	RegisteredAt  int64       `json:"registeredAt"`
	Placements    int         `json:"placements"`
}

// RouteView is one route of a worker: what it registered, and whether a
// higher epoch superseded it since.
type RouteView struct {
	RouteSpec
	Superseded bool `json:"superseded,omitempty"`
}

// registryWorkers lists the live workers (a session whose lease has not
// lapsed; a lapsed owner drops out of the list), with their lease and
// drain state; ?all=1 adds the lapsed and deregistered ones the directory
// still remembers.
func (a *API) registryWorkers(w http.ResponseWriter, r *http.Request) {
	m := a.cfg.Dir.Machine()
	now := time.Now().UnixMilli()
	all := false
	switch v := r.URL.Query().Get("all"); v {
	case "", "0", "false":
	case "1", "true":
		all = true
	default:
		httpx.WriteError(w, http.StatusBadRequest, "all must be 1 or 0, not "+strconv.Quote(v), 0)
		return
	}
	out := []WorkerView{}
	for _, wk := range m.Workers() {
		if !all && !wk.Live(now) {
			continue
		}
		v := WorkerView{
			ClientID: wk.ClientID, AdvertiseURL: wk.AdvertiseURL, SessionID: wk.SessionID, NodeID: wk.NodeID,
			Namespaces: wk.Namespaces, Headroom: wk.Headroom, Live: wk.Live(now),
			ExpiresInMs: max(0, wk.LeaseExpiry-now), Degraded: wk.Degraded, RegisteredAt: wk.RegisteredAt,
			Placements: len(m.PlacementsOf(wk.ClientID)),
		}
		// A local drain's deadline stays on its node (its status); the
		// directory knows that it drains.
		if src, d := DrainSources(m, wk, now); len(src) > 0 {
			v.Draining, v.DrainSources, v.Cordoned, v.DrainDeadline = true, src, d.Cordon, d.Deadline
		}
		if v.Namespaces == nil {
			v.Namespaces = []string{}
		}
		for _, rt := range wk.Routes {
			v.Routes = append(v.Routes, RouteView{RouteSpec: specOf(rt), Superseded: rt.Superseded})
		}
		out = append(out, v)
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"workers": out})
}

// registryHealth reports the directory as this node sees it. Without a
// token it answers what a load balancer or a client waiting out the
// cold-start quarantine needs, and nothing an attacker could use: ok,
// ready and quarantineMs. With operator scope it adds the counts, the
// applied index and the consensus view the agent adds (term, leader, its
// address). A token that is sent but unknown gets 401, as anywhere.
func (a *API) registryHealth(w http.ResponseWriter, r *http.Request) {
	m := a.cfg.Dir.Machine()
	now := time.Now().UnixMilli()
	body := map[string]any{
		"ok":           true,
		"quarantineMs": m.QuarantineMs(now, a.cfg.Quarantine.Milliseconds()),
		"ready":        a.readiness()["ready"],
	}
	_, err := a.cfg.Tokens.AuthorizeFleet(r, ScopeOperator)
	switch {
	case errors.Is(err, ErrMissingScope), errors.Is(err, ErrMissingToken) && r.Header.Get("Authorization") == "":
		httpx.WriteJSON(w, http.StatusOK, body)
		return
	case err != nil:
		a.cfg.Tokens.Refuse(w, err)
		return
	}
	workers, placements := m.Len()
	live := 0
	for _, wk := range m.Workers() {
		if wk.Live(now) {
			live++
		}
	}
	body["workers"], body["liveWorkers"], body["placements"] = workers, live, placements
	body["appliedIndex"] = m.AppliedIndex()
	if a.cfg.Health != nil {
		for k, v := range a.cfg.Health() {
			body[k] = v
		}
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}
