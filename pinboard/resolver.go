package pinboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// maxRetryBody: a request body up to this size is buffered so the request
// can be retried once on another worker after an in-band refusal.
const maxRetryBody = 1 << 20

// ownerRoutePrefix is the owner-side route forwarded requests arrive on.
const ownerRoutePrefix = "/_pinned/i"

// route is one request's way through resolution.
type route struct {
	key       directory.Key
	rest      string // escaped instance path, e.g. "/increment"
	body      []byte // buffered body when retryable
	retryable bool
	attempt   int
	exclude   string // a worker that refused in-band
	viaLeader bool   // the replica named a wrong owner: ask the leader
	caller    string // this node's worker, on a cluster call from one of its instances
}

// resolve finds (or makes) the placement of key and serves the request
// there: locally, or forwarded to the owner.
func (f *FrontDoor) resolve(w http.ResponseWriter, r *http.Request, key directory.Key, rest string) {
	rt := &route{key: key, rest: rest}
	switch ok, err := f.clusterCall(r); {
	case err != nil:
		httpx.WriteError(w, http.StatusForbidden, err.Error(), 0)
		return
	case ok:
		rt.caller = f.selfID()
	}
	switch {
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 && r.Header.Get("Transfer-Encoding") == "":
		rt.retryable = true
	case r.ContentLength > 0 && r.ContentLength <= maxRetryBody:
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRetryBody+1))
		if err != nil {
			httpx.WriteError(w, http.StatusBadRequest, "reading request body: "+err.Error(), 0)
			return
		}
		rt.body, rt.retryable = body, true
	}
	f.route(w, r, rt)
}

// bodyRead: nothing of the request body is left on the connection (none,
// or all of it buffered).
func (rt *route) bodyRead() bool { return rt.retryable }

// withBody gives r a fresh copy of the buffered body for this attempt.
func (rt *route) withBody(r *http.Request) *http.Request {
	if !rt.retryable || rt.body == nil {
		return r
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(rt.body))
	r2.ContentLength = int64(len(rt.body))
	return r2
}

// withQuery is path with query, if there is one.
func withQuery(path, query string) string {
	if query == "" {
		return path
	}
	return path + "?" + query
}

func (f *FrontDoor) selfID() string {
	if f.cfg.Worker == nil {
		return ""
	}
	return f.cfg.Worker.ClientID()
}

func (f *FrontDoor) route(w http.ResponseWriter, r *http.Request, rt *route) {
	key, now := rt.key, time.Now()
	// A live local instance is this node's own record of a placement it
	// was granted; the local replica may not have applied the grant yet
	// (or ever, if the leader died right after committing it). Serving it
	// is as safe as the lease allows.
	if _, live := f.liveHere(key); live {
		if lease := f.cfg.Worker.Lease(now); !servesLive(lease) {
			f.refuse(w, lease)
			return
		}
		if c, err := f.cfg.Local.Open(r.Context(), key.Namespace, key.ID, 0, supervisor.IfLive, nil); err == nil {
			f.resolvedLocal.Inc()
			noteServed(r, "here", "")
			f.serveAdopting(w, r, rt.bodyRead, func(w http.ResponseWriter) { c.ServeHTTP(w, rt.withBody(r), rt.rest) })
			return
		}
	}
	if !rt.viaLeader {
		if p, owner, ok := f.placedOn(key, rt.exclude, now); ok {
			f.dispatch(w, r, rt, p, owner)
			return
		}
	}
	p, owner, err := f.claim(r, rt)
	if err != nil {
		f.claimFailed(w, r, rt.key, err)
		return
	}
	f.dispatch(w, r, rt, p, owner)
}

// liveHere reports the generation key runs under on this node, if it is
// live here: the first question for a request, from net/http or the
// kept-alive loop alike.
func (f *FrontDoor) liveHere(key directory.Key) (uint64, bool) {
	if f.cfg.Worker == nil || f.cfg.Local == nil {
		return 0, false
	}
	return f.cfg.Local.LiveGeneration(key.Namespace, key.ID)
}

// placedOn is key's placement on a live worker other than exclude, as
// this node's replica shows it (without waiting on an apply): the second
// question, for an id not live here.
func (f *FrontDoor) placedOn(key directory.Key, exclude string, now time.Time) (directory.Placement, directory.Worker, bool) {
	p, owner, ok := f.cfg.Dir.Machine().Owner(key)
	if !ok || !owner.Live(now.UnixMilli()) || owner.ClientID == exclude {
		return directory.Placement{}, directory.Worker{}, false
	}
	return p, owner, true
}

// dispatch serves on this node or forwards to the owner.
func (f *FrontDoor) dispatch(w http.ResponseWriter, r *http.Request, rt *route, p directory.Placement, owner directory.Worker) {
	if p.Owner == f.selfID() {
		f.resolvedLocal.Inc()
		noteServed(r, "here", "")
		f.serveAdopting(w, r, rt.bodyRead, func(w http.ResponseWriter) { f.serveLocal(w, rt.withBody(r), p, rt.rest) })
		return
	}
	noteServed(r, "forwarded", owner.NodeID)
	f.forward(w, r, rt, p, owner)
}

// Claim outcomes that are not placements.
var (
	errNoBackends = errors.New("no live workers for namespace")
	errQuarantine = errors.New("cold start quarantine")
)

type quarantineError struct{ remaining time.Duration }

func (e quarantineError) Error() string { return errQuarantine.Error() }
func (e quarantineError) Unwrap() error { return errQuarantine }

// claim asks the leader (linearizably) to place key on a candidate the
// policy picks, and returns the placement the directory holds afterwards:
// ours, or whoever already held it.
func (f *FrontDoor) claim(r *http.Request, rt *route) (directory.Placement, directory.Worker, error) {
	return f.claimFor(r.Context(), rt, ClientIP(r.RemoteAddr, r.Header, f.cfg.TrustedProxies), f.affinityKey(r), rt.caller)
}

// claimFor is claim without a request: clientIP and affinity are the
// placement hints ("" and nil when there is no client, as for the scanner).
func (f *FrontDoor) claimFor(ctx context.Context, rt *route, clientIP string, affinity *string, caller string) (directory.Placement, directory.Worker, error) {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	m := f.cfg.Dir.Machine()
	tried := map[string]bool{}
	if rt.exclude != "" {
		tried[rt.exclude] = true
	}
	for attempt := 0; attempt < 3; attempt++ {
		now := time.Now()
		var cands []Candidate
		for _, wk := range m.Candidates(rt.key.Namespace, now.UnixMilli()) {
			if tried[wk.ClientID] {
				continue
			}
			// Our own replica may still call us live while our lease is
			// in danger; we know better.
			if f.cfg.Worker != nil && wk.ClientID == f.selfID() && (f.cfg.Worker.Lease(now) != LeaseHealthy || f.storeHealth() != nil) {
				continue
			}
			cands = append(cands, Candidate{ClientID: wk.ClientID, Headroom: wk.Headroom})
		}
		if len(cands) == 0 {
			return directory.Placement{}, directory.Worker{}, errNoBackends
		}
		choice, _ := f.cfg.Policy.Choose(PlacementRequest{
			Key:         rt.key.Env + "\x00" + rt.key.Namespace + "\x00" + rt.key.ID,
			ClientIP:    clientIP,
			CallerID:    caller,
			AffinityKey: affinity,
		}, cands)
		res, err := f.cfg.Dir.Do(ctx, directory.Claim{
			Key: rt.key, ClientID: choice, Now: time.Now().UnixMilli(), QuarantineMs: f.cfg.Quarantine.Milliseconds(),
		})
		if err != nil {
			return directory.Placement{}, directory.Worker{}, err
		}
		switch res.Code {
		case directory.CodeGranted, directory.CodeExisting, directory.CodeHeld:
			owner, ok := m.Worker(res.Placement.Owner)
			if !ok {
				// The leader knows a worker our replica has not heard of
				// yet; a moment later it will.
				continue
			}
			if res.Code == directory.CodeGranted {
				f.resolutions.WithLabelValues(outcomePlaced).Inc()
			}
			return res.Placement, owner, nil
		case directory.CodeQuarantine:
			return directory.Placement{}, directory.Worker{}, quarantineError{time.Duration(res.RemainingMs) * time.Millisecond}
		case directory.CodeIneligible:
			tried[choice] = true
		case directory.CodeConflict:
		default:
			return directory.Placement{}, directory.Worker{}, errors.New("placement refused: " + res.Code.String() + " " + res.Reason)
		}
	}
	return directory.Placement{}, directory.Worker{}, errNoBackends
}

func (f *FrontDoor) claimFailed(w http.ResponseWriter, r *http.Request, key directory.Key, err error) {
	var q quarantineError
	switch {
	case errors.As(err, &q):
		f.resolutions.WithLabelValues(outcomeQuarantined).Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "cold start quarantine", q.remaining)
	case errors.Is(err, errNoBackends):
		f.resolutions.WithLabelValues(outcomeNoBackends).Inc()
		msg := f.noBackends(key.Namespace, time.Now())
		if serr := f.storeHealth(); serr != nil {
			// Most likely why: a shared store down takes every worker out.
			msg = serr.Error() + "; " + msg
		}
		httpx.WriteError(w, http.StatusServiceUnavailable, msg, time.Second)
	case r.Context().Err() != nil:
	default:
		f.resolutions.WithLabelValues(outcomeError).Inc()
		f.cfg.Logger.Warn("placement failed", "path", r.URL.Path, "err", err)
		httpx.WriteError(w, http.StatusServiceUnavailable, "directory unavailable", time.Second)
	}
}

// noBackends says why no worker may take a new placement in ns: none is
// live, or every live one is draining (this node, when it is the only
// one), or each is degraded, draining or renewing its lease. All but the
// draining answers start "no live workers", as they always did.
func (f *FrontDoor) noBackends(ns string, now time.Time) string {
	m := f.cfg.Dir.Machine()
	ms := now.UnixMilli()
	live, draining, selfDraining := 0, 0, false
	for _, wk := range m.Workers() {
		if !wk.Live(ms) || !wk.Serves(ns) {
			continue
		}
		live++
		src, _ := drainSources(m, wk, ms)
		self := wk.ClientID == f.selfID()
		if self && len(src) == 0 && f.cfg.Worker.selfDraining() {
			src = []string{DrainSourceLocal} // our heartbeat has not told the directory yet
		}
		if len(src) > 0 {
			draining++
			selfDraining = selfDraining || self
		}
	}
	switch {
	case live == 0:
		return "no live workers for namespace " + ns
	case draining == live && live == 1 && selfDraining:
		return "this node is draining: it takes no new instances of " + ns + " (pinnedd undrain ends the drain)"
	case draining == live:
		return fmt.Sprintf("every live worker for namespace %s is draining (%d of %d)", ns, draining, live)
	}
	return fmt.Sprintf("no live workers for namespace %s can take a new instance: %d of %d draining, the rest degraded or renewing their lease", ns, draining, live)
}

// clusterCall reports whether r is a cluster call: a request an instance on
// this node makes through its own front door (plugins/sdk's
// Instance.ClusterClient marks it). A new placement then prefers this node's
// worker, as the seed's attested cluster calls do. The header names the
// calling namespace and carries its plugin process's credential, good only
// for that process's namespaces while it lives; it never leaves the front
// door. A header that does not prove that is refused (err), not ignored.
func (f *FrontDoor) clusterCall(r *http.Request) (bool, error) {
	v := r.Header.Get(plugins.HeaderClusterCall)
	if v == "" {
		return false, nil
	}
	r.Header.Del(plugins.HeaderClusterCall)
	ns, tok, err := plugins.ParseClusterCall(v)
	if err != nil {
		return false, err
	}
	if f.cfg.ClusterCalls == nil || f.cfg.Worker == nil {
		return false, fmt.Errorf("%s: this node runs no plugins", plugins.HeaderClusterCall)
	}
	nss, ok := f.cfg.ClusterCalls(tok)
	if !ok || !slices.Contains(nss, ns) {
		return false, fmt.Errorf("%s: the credential is not good for cluster calls from %s on this node", plugins.HeaderClusterCall, ns)
	}
	return true, nil
}

func (f *FrontDoor) affinityKey(r *http.Request) *string {
	if f.cfg.AffinityKey == nil {
		return nil
	}
	return f.cfg.AffinityKey(r)
}
