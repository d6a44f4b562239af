package pinboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// Operator routes of the api: the fleet-wide ones (/registry/drain,
// undrain, wind_down, overview) act through the directory or the owners;
// the node-local ones (/_pinned/drain, undrain, plugins/reload) act on
// this node; /_pinned/wind_down is the owner side of a wind-down, for
// attested callers.

// WindDownPath is the owner side of a wind-down.
const WindDownPath = "/_pinned/wind_down"

// optionalSeconds reads a JSON number of seconds or null. present reports
// whether the field was there at all.
func optionalSeconds(raw json.RawMessage) (d time.Duration, isNull, present bool, err error) {
	if raw == nil {
		return 0, false, false, nil
	}
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return 0, true, true, nil
	}
	var secs float64
	if err := json.Unmarshal(raw, &secs); err != nil || secs < 0 || secs > 365*24*3600 {
		return 0, false, true, fmt.Errorf("deadline must be a number of seconds (0 to one year) or null")
	}
	return time.Duration(secs * float64(time.Second)), false, true, nil
}

func (a *API) ttl() time.Duration {
	if a.cfg.Registry != nil {
		return a.cfg.Registry.TTL()
	}
	return DefaultLeaseTTL
}

// drainTarget is what an operator drain or undrain names: a node id (every
// worker that node registers, across restarts) or a client id (one worker
// process), exactly one of them.
type drainTarget struct {
	ClientID string `json:"clientId"`
	NodeID   string `json:"nodeId"`
}

// check answers a 400 when the request names no target or both.
func (t drainTarget) check(w http.ResponseWriter) bool {
	switch {
	case t.ClientID == "" && t.NodeID == "":
		httpx.WriteError(w, http.StatusBadRequest, "nodeId (or clientId, for one worker process) is required", 0)
		return false
	case t.ClientID != "" && t.NodeID != "":
		httpx.WriteError(w, http.StatusBadRequest, "give nodeId or clientId, not both", 0)
		return false
	}
	return true
}

// answer is the 200 body of a drain or undrain, naming its target.
func (t drainTarget) answer() map[string]any {
	if t.NodeID != "" {
		return map[string]any{"ok": true, "nodeId": t.NodeID}
	}
	return map[string]any{"ok": true, "clientId": t.ClientID}
}

// registryDrain serves POST /registry/drain {"nodeId" | "clientId",
// "deadline"}: deadline in seconds (under one lease TTL becomes one TTL),
// null cordons.
func (a *API) registryDrain(w http.ResponseWriter, r *http.Request) {
	var req struct {
		drainTarget
		Deadline json.RawMessage `json:"deadline"`
	}
	if !decodeBody(w, r, &req) || !req.check(w) {
		return
	}
	d, cordon, present, err := optionalSeconds(req.Deadline)
	switch {
	case err != nil:
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
		return
	case !present:
		httpx.WriteError(w, http.StatusBadRequest, "deadline is required: seconds, or null to cordon", 0)
		return
	case !a.admitsDrainTarget(w, r, req.drainTarget):
		return
	}
	now := time.Now()
	var deadline int64
	if !cordon {
		deadline = now.Add(max(d, a.ttl())).UnixMilli()
	}
	var cmd directory.Command = directory.DrainWorker{ClientID: req.ClientID, Deadline: deadline, Cordon: cordon, Now: now.UnixMilli()}
	if req.NodeID != "" {
		cmd = directory.DrainNode{NodeID: req.NodeID, Deadline: deadline, Cordon: cordon, Now: now.UnixMilli()}
	}
	res, err := a.cfg.Dir.Do(r.Context(), cmd)
	if err != nil {
		a.registryError(w, r, err)
		return
	}
	if res.Code == directory.CodeUnknownWorker {
		a.unknownDrainTarget(w, req.drainTarget)
		return
	}
	out := req.answer()
	out["deadline"] = nil
	if !cordon {
		out["deadline"] = deadline
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

// registryUndrain serves POST /registry/undrain {"nodeId" | "clientId"}.
// Undraining a node also clears the drains of its workers' client ids.
func (a *API) registryUndrain(w http.ResponseWriter, r *http.Request) {
	var req drainTarget
	if !decodeBody(w, r, &req) || !req.check(w) {
		return
	}
	if !a.admitsDrainTarget(w, r, req) {
		return
	}
	var cmd directory.Command = directory.UndrainWorker{ClientID: req.ClientID}
	if req.NodeID != "" {
		cmd = directory.UndrainNode{NodeID: req.NodeID}
	}
	res, err := a.cfg.Dir.Do(r.Context(), cmd)
	if err != nil {
		a.registryError(w, r, err)
		return
	}
	if res.Code == directory.CodeUnknownWorker {
		a.unknownDrainTarget(w, req)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, req.answer())
}

// admitsDrainTarget answers 403 and reports false unless the key r came
// with admits every namespace of the workers t names (a client id, or
// every worker of a node id). A key narrowed to some namespaces gets the
// same 403 for a target the directory does not know: it learns nothing of
// workers it may not touch.
func (a *API) admitsDrainTarget(w http.ResponseWriter, r *http.Request, t drainTarget) bool {
	k := KeyOf(r)
	if k == nil || k.Claims.AllNamespaces() {
		return true
	}
	found := false
	for _, wk := range a.cfg.Dir.Machine().Workers() {
		if wk.ClientID != t.ClientID && (t.NodeID == "" || wk.NodeID != t.NodeID) {
			continue
		}
		found = true
		for _, ns := range wk.Namespaces {
			if !k.Claims.Namespace(ns) {
				found = false
				break
			}
		}
		if !found {
			break
		}
	}
	if !found {
		refuseClaims(w, r, fmt.Sprintf("forbidden: key %q does not admit every namespace of that worker", k.Name))
	}
	return found
}

// unknownDrainTarget answers a drain or undrain of a node id no known
// worker has, or of a client id the directory has never registered (or
// has forgotten). A client id that is in fact a node id says so.
func (a *API) unknownDrainTarget(w http.ResponseWriter, t drainTarget) {
	if t.NodeID != "" {
		httpx.WriteError(w, http.StatusNotFound, fmt.Sprintf("unknown node id %q: no worker has registered with it (`pinnedd workers --all` lists the nodes)", t.NodeID), 0)
		return
	}
	msg := fmt.Sprintf("unknown client id %q: `pinnedd workers --all` lists the registered workers", t.ClientID)
	for _, wk := range a.cfg.Dir.Machine().Workers() {
		if wk.NodeID == t.ClientID {
			msg = fmt.Sprintf("unknown client id %q: that is a node id; drain the node with `pinnedd drain %s`", t.ClientID, t.ClientID)
			break
		}
	}
	httpx.WriteError(w, http.StatusNotFound, msg, 0)
}

type windDownReq struct {
	Namespace string `json:"namespace"`
	// ID absent winds the whole namespace down; present it must name an
	// id, so an empty one (an unset shell variable) is refused rather than
	// read as "every instance".
	ID       *string         `json:"id,omitempty"`
	Deadline json.RawMessage `json:"deadline"`
	Env      *string         `json:"env,omitempty"`
}

// registryWindDown serves POST /registry/wind_down: one id, or every id of
// the namespace when id is omitted; deadline in seconds (0: now), null
// revokes. Each owner gets an attested request.
func (a *API) registryWindDown(w http.ResponseWriter, r *http.Request) {
	var req windDownReq
	if !decodeBody(w, r, &req) {
		return
	}
	d, revoke, present, err := optionalSeconds(req.Deadline)
	// The validators' own words say what is wrong with a name.
	nsErr := plugins.ValidateNamespace(req.Namespace)
	var idErr error
	if req.ID != nil && *req.ID != "" {
		idErr = plugins.ValidateID(*req.ID)
	}
	switch {
	case req.Env != nil && !a.hostnameAware():
		httpx.WriteError(w, http.StatusBadRequest, "env requires hostname-aware mode", 0)
		return
	case req.Env == nil && a.hostnameAware():
		httpx.WriteError(w, http.StatusBadRequest, "env is required in hostname-aware mode", 0)
		return
	case req.Env != nil && !plugins.ValidEnv(*req.Env):
		httpx.WriteError(w, http.StatusBadRequest, "env must be 1-128 characters from a-z A-Z 0-9 . - _", 0)
		return
	case nsErr != nil:
		httpx.WriteError(w, http.StatusBadRequest, nsErr.Error()+" (e.g. /threads)", 0)
		return
	case req.ID != nil && *req.ID == "":
		httpx.WriteError(w, http.StatusBadRequest, "id is empty: name an id, or leave id out to wind down the whole namespace", 0)
		return
	case idErr != nil:
		httpx.WriteError(w, http.StatusBadRequest, idErr.Error(), 0)
		return
	case err != nil:
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
		return
	case !present:
		httpx.WriteError(w, http.StatusBadRequest, "deadline is required: seconds, or null to revoke", 0)
		return
	case !admitsNamespace(w, r, req.Namespace):
		return
	}
	var id, env string // id "": the whole namespace
	if req.ID != nil {
		id = *req.ID
	}
	if req.Env != nil {
		env = *req.Env
	}
	var at int64 // 0 revokes
	if !revoke {
		at = time.Now().Add(d).UnixMilli()
	}
	if !a.knownNamespace(req.Namespace) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace "+req.Namespace, 0)
		return
	}
	// Who to tell: the owner of the id, or every live worker serving ns.
	m := a.cfg.Dir.Machine()
	now := time.Now().UnixMilli()
	var targets []directory.Worker
	if id != "" {
		key := directory.Key{Env: env, Namespace: req.Namespace, ID: id}
		_, owner, ok := m.Owner(key)
		if !ok {
			httpx.WriteError(w, http.StatusNotFound, "no placement for "+key.String(), 0)
			return
		}
		if owner.Live(now) {
			targets = append(targets, owner)
		}
	} else {
		for _, wk := range m.Workers() {
			serves := wk.Serves(req.Namespace) || slices.ContainsFunc(wk.Routes, func(rt directory.Route) bool {
				return rt.Namespace == req.Namespace && rt.Env == env
			})
			if wk.Live(now) && serves {
				targets = append(targets, wk)
			}
		}
	}
	total, failed := 0, []string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, wk := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := a.windDownOn(r.Context(), wk, directory.Key{Env: env, Namespace: req.Namespace, ID: id}, at)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				failed = append(failed, wk.ClientID+": "+err.Error())
			}
		}()
	}
	wg.Wait()
	sort.Strings(failed)
	out := map[string]any{"ok": len(failed) == 0, "instances": total}
	if len(failed) > 0 {
		out["failed"] = failed
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

// windDownOn applies a wind-down on one worker: here, or at its owner side.
func (a *API) windDownOn(ctx context.Context, wk directory.Worker, key directory.Key, atMs int64) (int, error) {
	if wk.ClientID == a.cfg.Self.ID() {
		return a.localWindDown(key, atMs), nil
	}
	return WindDownOn(ctx, a.cfg.Peers, a.cfg.Dir, a.cfg.Self.ID(), wk, key, atMs)
}

// WindDownOn asks wk's node, over peers, to wind key down by atMs (unix
// ms; 0 revokes): its instance, or with key.ID "" every instance of its
// namespace in its env. caller is the asking node's id. It reports how
// many instances the owner set. The operator's wind-down and a
// hostname-aware takeover's both call it.
func WindDownOn(ctx context.Context, peers Peers, dir *Directory, caller string, wk directory.Worker, key directory.Key, atMs int64) (int, error) {
	fields := map[string]any{"namespace": key.Namespace, "id": key.ID, "deadlineUnixMs": atMs}
	if key.Env != "" {
		fields["env"] = key.Env // hostname-aware mode
	}
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, peers.Base(wk)+WindDownPath, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	gen := max(dir.Machine().AppliedIndex(), 1)
	req.Header.Set(AttestationHeader, SignFor(dir.Machine().Secret(), wk.SessionID, Attestation{Target: wk.ClientID, Caller: caller, Generation: gen, At: time.Now()}, http.MethodPost, WindDownPath))
	resp, err := peers.Client().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return windDownAnswer(resp.StatusCode, b)
}

func (a *API) localWindDown(key directory.Key, atMs int64) int {
	if a.cfg.WindDown == nil {
		return 0
	}
	var at time.Time
	if atMs != 0 {
		at = time.UnixMilli(atMs)
	}
	return a.cfg.WindDown(key, at)
}

// ownerWindDown serves the attested owner side of a wind-down.
func (a *API) ownerWindDown(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.cfg.Gate.Admit(w, r, WindDownPath); !ok {
		return
	}
	var req struct {
		Env            string `json:"env"`
		Namespace      string `json:"namespace"`
		ID             string `json:"id"`
		DeadlineUnixMs int64  `json:"deadlineUnixMs"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if plugins.ValidateNamespace(req.Namespace) != nil || (req.ID != "" && plugins.ValidateID(req.ID) != nil) || req.DeadlineUnixMs < 0 ||
		(req.Env != "" && !plugins.ValidEnv(req.Env)) {
		httpx.WriteError(w, http.StatusBadRequest, "invalid wind-down", 0)
		return
	}
	key := directory.Key{Env: req.Env, Namespace: req.Namespace, ID: req.ID}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"instances": a.localWindDown(key, req.DeadlineUnixMs)})
}

// localDrain serves POST /_pinned/drain {"deadline": seconds|null,
// "cordon": bool} for this node (`pinnedd drain`).
func (a *API) localDrain(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Deadline json.RawMessage `json:"deadline"`
		Cordon   bool            `json:"cordon"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	d, isNull, present, err := optionalSeconds(req.Deadline)
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
		return
	}
	cordon := req.Cordon || isNull
	if !cordon && !present {
		httpx.WriteError(w, http.StatusBadRequest, `give "deadline" in seconds, or "cordon": true`, 0)
		return
	}
	if a.cfg.Drain == nil {
		httpx.WriteError(w, http.StatusConflict, "this node hosts no instances", 0)
		return
	}
	var at time.Time
	if !cordon {
		at = time.Now().Add(d)
	}
	a.Drain(at, cordon)
	out := map[string]any{"draining": true, "cordon": cordon, "deadline": nil}
	if !cordon {
		out["deadline"] = at.UnixMilli()
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

func (a *API) localUndrain(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.Drain == nil {
		httpx.WriteError(w, http.StatusConflict, "this node hosts no instances", 0)
		return
	}
	a.Drain(time.Time{}, false)
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"draining": false})
}

// Drain drains this node by itself (source local) until deadline, or
// cordons it; a zero deadline and no cordon revoke. The worker records it
// (status, the log line, pinned_draining, its next heartbeat) before the
// node acts on it (APIConfig.Drain). Every local drain comes through
// here: POST /_pinned/drain and the agent's SIGTERM.
func (a *API) Drain(deadline time.Time, cordon bool) {
	if a.worker() != nil {
		a.worker().SetLocalDrain(deadline, cordon)
	}
	if a.cfg.Drain != nil {
		a.cfg.Drain(deadline, cordon)
	}
}

// DrainSources names the drains in force on wk at now, as the directory
// knows them: "local" (the worker reported draining by itself) and
// "operator" (a drain record of its node id or client id). Every listing
// and refusal reads drains here.
func DrainSources(m *directory.Machine, wk directory.Worker, now int64) (sources []string, d directory.Drain) {
	if wk.Draining {
		sources = append(sources, DrainSourceLocal)
	}
	if rec, ok := m.DrainFor(wk, now); ok {
		sources, d = append(sources, DrainSourceOperator), rec
	}
	return sources, d
}

func (a *API) pluginsReload(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Namespace string `json:"namespace"`
	}
	if r.ContentLength != 0 && !decodeBody(w, r, &req) {
		return
	}
	ns, ok := a.pluginRoute(w, req.Namespace, req.Namespace == "")
	if !ok {
		return
	}
	// Every namespace's plugins, or one: the key must admit what is named.
	if k := KeyOf(r); k != nil && req.Namespace == "" && !k.Claims.AllNamespaces() {
		refuseClaims(w, r, fmt.Sprintf("key %q is narrowed to some namespaces: name one", k.Name))
		return
	}
	if req.Namespace != "" && !admitsNamespace(w, r, ns) {
		return
	}
	if a.cfg.Reload == nil {
		httpx.WriteError(w, http.StatusConflict, "this node hosts no instances", 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	if err := a.cfg.Reload(ctx, req.Namespace); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, ErrUnknownNamespace) {
			code = http.StatusNotFound
		}
		httpx.WriteError(w, code, err.Error(), 0)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
}

// ErrUnknownNamespace is what a Reload hook wraps for a namespace this node
// does not serve.
var ErrUnknownNamespace = errors.New("unknown namespace")

// What the plugin hooks (AddPlugin, RemovePlugin) wrap besides
// ErrBadRequest and ErrUnknownNamespace: a binary the node may not start
// (403), and a plugin that conflicts with the node's (409).
var (
	ErrForbidden = errors.New("forbidden")
	ErrConflict  = errors.New("conflict")
)

// pluginsAdd serves POST /_pinned/plugins/add {"plugin": "/ns=/path"}: the
// node starts the plugin and serves its namespace (200 {"namespaces":
// [...]}), once its handshake passed.
func (a *API) pluginsAdd(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Plugin string `json:"plugin"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	route, _, _ := strings.Cut(req.Plugin, "=")
	ns, ok := a.pluginRoute(w, route, false)
	if !ok || !admitsNamespace(w, r, ns) {
		return
	}
	a.pluginsChange(w, r, a.cfg.AddPlugin, req.Plugin)
}

// pluginsRemove serves POST /_pinned/plugins/remove {"namespace": "/ns"}:
// the node evicts the instances of the plugin serving ns (each gets its
// grace), ends it, and lets its namespaces go (200 {"namespaces": [...]}).
func (a *API) pluginsRemove(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Namespace string `json:"namespace"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	ns, ok := a.pluginRoute(w, req.Namespace, false)
	if !ok || !admitsNamespace(w, r, ns) {
		return
	}
	a.pluginsChange(w, r, a.cfg.RemovePlugin, req.Namespace)
}

// pluginRoute checks the route an operator names a plugin by ("/NS", or
// in hostname-aware mode "HOST/NS"; "" if empty is allowed) and returns
// its namespace; a bad one is answered 400.
func (a *API) pluginRoute(w http.ResponseWriter, route string, empty bool) (string, bool) {
	if route == "" && empty {
		return "", true
	}
	host, ns, err := plugins.ParseRoute(route)
	switch {
	case err != nil:
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
	case host == "" && a.hostnameAware():
		httpx.WriteError(w, http.StatusBadRequest, "hostname-aware mode: name the plugin hostname/namespace", 0)
	case host != "" && !a.hostnameAware():
		httpx.WriteError(w, http.StatusBadRequest, "a hostname requires hostname-aware mode (--hostname-aware)", 0)
	default:
		return ns, true
	}
	return "", false
}

// pluginsChange runs an add or a remove and answers it.
func (a *API) pluginsChange(w http.ResponseWriter, r *http.Request, hook func(context.Context, string) ([]string, error), arg string) {
	if hook == nil {
		httpx.WriteError(w, http.StatusConflict, "this node hosts no instances", 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	nss, err := hook(ctx, arg)
	code := http.StatusInternalServerError
	switch {
	case err == nil:
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "namespaces": nss})
		return
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, ErrForbidden):
		code = http.StatusForbidden
	case errors.Is(err, ErrUnknownNamespace):
		code = http.StatusNotFound
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	}
	httpx.WriteError(w, code, err.Error(), 0)
}

// registryOverview summarises the fleet for an operator (and the console).
func (a *API) registryOverview(w http.ResponseWriter, _ *http.Request) {
	m := a.cfg.Dir.Machine()
	now := time.Now().UnixMilli()
	type nsView struct {
		Workers    int `json:"workers"`
		Placements int `json:"placements"`
	}
	nss := map[string]*nsView{}
	var total, live, draining, degraded, placements int
	for _, wk := range m.Workers() {
		if !wk.Registered() {
			continue
		}
		total++
		if wk.Live(now) {
			live++
		}
		if src, _ := DrainSources(m, wk, now); len(src) > 0 {
			draining++
		}
		if wk.Degraded {
			degraded++
		}
		served := slices.Clone(wk.Namespaces)
		for _, rt := range wk.Routes {
			if !rt.Superseded && !slices.Contains(served, rt.Namespace) {
				served = append(served, rt.Namespace)
			}
		}
		for _, ns := range served {
			if nss[ns] == nil {
				nss[ns] = &nsView{}
			}
			if wk.Live(now) {
				nss[ns].Workers++
			}
		}
		for _, p := range m.PlacementsOf(wk.ClientID) {
			placements++
			if v := nss[p.Key.Namespace]; v != nil {
				v.Placements++
			}
		}
	}
	body := map[string]any{
		"workers":      map[string]int{"registered": total, "live": live, "draining": draining, "degraded": degraded},
		"placements":   placements,
		"namespaces":   nss,
		"quarantineMs": m.QuarantineMs(now, a.cfg.Quarantine.Milliseconds()),
	}
	if a.cfg.Health != nil {
		body["raft"] = a.cfg.Health()
	}
	httpx.WriteJSON(w, http.StatusOK, body)
}
