package frontdoor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// The router's request paths. Both start from one decision (decide: what
// the request is, and whether the loop may carry it). net/http's:
// ServeHTTP → serve → serveInstance → routeRequest, which asks the
// resolver and hands the request to the owner side (live or placed here)
// or the forwarder (placed elsewhere). The kept-alive loop's: routeLoop,
// which takes only what the decision marks as the loop's and, of that,
// only the cases already decided (live here, a live owner elsewhere, an
// attested owner-side request); everything else goes back to net/http.

// maxRetryBody: a request body up to this size is buffered so the request
// can be retried once on another worker after an in-band refusal.
const maxRetryBody = 1 << 20

// ownerRoutePrefix is the owner-side route forwarded requests arrive on.
const ownerRoutePrefix = "/_pinned/i"

// instanceRequest is one client request for an instance on its way
// through net/http's path: which instance, the rest of the path, the body
// kept for a retry, and what the retry must avoid.
type instanceRequest struct {
	key       directory.Key
	host      string // hostname-aware mode: the request's hostname
	rest      string // escaped instance path, e.g. "/increment"
	body      []byte // buffered body when retryable
	retryable bool
	attempt   int
	exclude   string // a worker that refused in-band
	// selfDegraded: exclude is this node, whose plugin for the namespace
	// crash-loops.
	selfDegraded bool
	viaLeader    bool   // the replica named a wrong owner: ask the leader
	caller       string // this node's worker, on a cluster call from one of its instances
	// keyed: the namespace's policy needed the client's key. Its
	// connection stays in net/http, which checks the next request's key:
	// the kept-alive loop would give every such request back.
	keyed bool
}

// bodyRead: nothing of the request body is left on the connection (none,
// or all of it buffered).
func (rq *instanceRequest) bodyRead() bool { return rq.retryable }

// adoptable: the kept-alive loop may take the connection after this
// request's response (serveAdopting): its body was read, and the loop can
// serve the next one like it.
func (rq *instanceRequest) adoptable() bool { return rq.bodyRead() && !rq.keyed }

// withBody gives r a fresh copy of the buffered body for this attempt.
func (rq *instanceRequest) withBody(r *http.Request) *http.Request {
	if !rq.retryable || rq.body == nil {
		return r
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(rq.body))
	r2.ContentLength = int64(len(rq.body))
	return r2
}

// withQuery is path with query, if there is one.
func withQuery(path, query string) string {
	if query == "" {
		return path
	}
	return path + "?" + query
}

func (f *FrontDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.stopping.Load() {
		// Every answer of a stopping node ends its connection, so none is
		// left idle for Shutdown to close under a request on its way.
		w.Header().Set("Connection", "close")
	}
	w, done, ok := f.boundRequest(w, r)
	if !ok {
		return
	}
	defer done()
	if f.accessLog {
		f.serveLogged(w, r)
		return
	}
	f.serve(w, r)
}

func (f *FrontDoor) serve(w http.ResponseWriter, r *http.Request) {
	defer func() {
		// A panic in the control plane must not reach the client as a
		// dropped connection; net/http would only log it.
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			f.logger.Error("front door panicked", "panic", p, "path", r.URL.Path)
			httpx.WriteError(w, http.StatusInternalServerError, "internal error", 0)
		}
	}()
	from := fromClient
	if fromPeer(r) {
		from = fromMember // clusterport.Cluster.Serve authenticated it
	}
	d := f.decide(r.Method, r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, stdFields(r.Header), from)
	switch d.kind {
	case toPeerOnly:
		httpx.WriteError(w, http.StatusForbidden, "a node-to-node route: served only on the cluster port, over mutual TLS", 0)
		return
	case toOwner:
		f.owner.owned(w, r, d)
		return
	case toWake:
		f.owner.wakeOwned(w, r, d)
		return
	case toInstance:
		// Instance paths bypass the mux: it would clean "/ns//x" or
		// "/ns/../x" and redirect to a different id; those are bad ids.
		f.serveInstance(w, r, d)
		return
	}
	f.mux.ServeHTTP(w, r)
}

type peerKey struct{}

// PeerHandler serves the front door to the cluster's other nodes, on the
// cluster port (clusterport.Cluster.Serve authenticates them): the peer
// routes, and everything else as the front door does. Its connections stay
// in net/http.
func (f *FrontDoor) PeerHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, true)))
	})
}

// PeerHandBacks is the listener of cluster-port connections the kept-alive
// loop gives back (with FastPath: it adopts those too, when they were made
// with relay.ServerTLS); serve it with PeerHandler, as the cluster port's
// own listener.
func (f *FrontDoor) PeerHandBacks() net.Listener { return f.keep.peerHandBacks() }

// fromPeer: r came through PeerHandler.
func fromPeer(r *http.Request) bool { return r.Context().Value(peerKey{}) != nil }

// serveInstance serves a client's request for /<ns>/<id>/<rest>.
func (f *FrontDoor) serveInstance(w http.ResponseWriter, r *http.Request, d decision) {
	ns, id, rest, err := d.ns, d.id, d.rest, d.err
	if errors.Is(err, plugins.ErrInvalidNamespace) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
		return
	}
	if err == nil && !f.res.knownNamespace(ns) && !f.res.self.CaughtUp() {
		// A namespace only other nodes serve is unknown to a replica that
		// has not caught up yet.
		if !f.res.self.AwaitCaughtUp(r.Context(), startingWait) {
			f.starting(w, r)
			return
		}
	}
	// Who may ask comes before what there is: a client without the key
	// the namespace's policy (or the passport's default, for a namespace
	// nobody serves) asks for learns nothing of which namespaces or ids
	// exist.
	rq := &instanceRequest{key: directory.Key{Namespace: ns, ID: id}, rest: rest}
	if f.res.hostnames {
		if rq.host = plugins.NormalizeHost(r.Host); rq.host == "" {
			httpx.WriteError(w, http.StatusBadRequest, "missing Host header", 0)
			return
		}
	}
	switch host, ok, err := f.clusterCall(r); {
	case err != nil:
		httpx.WriteError(w, http.StatusForbidden, err.Error(), 0)
		return
	case ok:
		rq.caller = f.res.self.ID()
		if f.res.hostnames {
			rq.host = host // an instance calls its own build's peers
		}
	default:
		if rq.keyed, ok = f.tokens.AdmitClient(w, r, ns); !ok {
			return
		}
	}
	if !f.res.knownNamespace(ns) {
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
		return
	}
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), 0)
		return
	}
	if f.res.hostnames {
		env, ok := f.res.envOf(rq.host, ns)
		if !ok && !f.res.self.CaughtUp() {
			// As for a namespace above: a binding made by the workers
			// that registered since the state on disk.
			if !f.res.self.AwaitCaughtUp(r.Context(), startingWait) {
				f.starting(w, r)
				return
			}
			env, ok = f.res.envOf(rq.host, ns)
		}
		if !ok {
			f.res.counter(outcomeNoBackends).Inc()
			httpx.WriteError(w, http.StatusServiceUnavailable, errNoHostname.Error()+" "+rq.host, time.Second)
			return
		}
		rq.key.Env = env
	}
	if f.stopping.Load() {
		httpx.WriteError(w, http.StatusServiceUnavailable, httpx.ShuttingDownMsg, time.Second)
		return
	}
	switch {
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 && r.Header.Get("Transfer-Encoding") == "":
		rq.retryable = true
	case r.ContentLength > 0 && r.ContentLength <= maxRetryBody:
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRetryBody+1))
		if err != nil {
			httpx.WriteError(w, http.StatusBadRequest, "reading request body: "+err.Error(), 0)
			return
		}
		rq.body, rq.retryable = body, true
	}
	f.routeRequest(w, r, rq)
}

// routeRequest is net/http's way for an instance request (routeLoop is the
// loop's): live here → the owner side; placed on a live worker → dispatch;
// neither → a claim through the resolver, then dispatch. The forwarder
// calls it again for its one retry after an in-band refusal.
func (f *FrontDoor) routeRequest(w http.ResponseWriter, r *http.Request, rq *instanceRequest) {
	key, now := rq.key, time.Now()
	// A live local instance is this node's own record of a placement it
	// was granted; the local replica may not have applied the grant yet
	// (or ever, if the leader died right after committing it). Serving it
	// is as safe as the lease allows.
	if _, host, live := f.res.liveHere(key); live && host == rq.host && f.owner.serveLive(w, r, rq) {
		return
	}
	if f.owner.degraded(rq.host, key.Namespace) && rq.exclude == "" {
		// This node serves none of the namespace until its plugin
		// recovers: a placement here is given up, and the id goes to
		// another node, as a forwarder does for an owner that refused.
		self := f.res.self.ID()
		if p, ok := f.dir.Machine().Placement(key); ok && p.Owner == self {
			f.res.releaseRefused(r.Context(), p)
		}
		rq.exclude, rq.selfDegraded = self, true
	}
	if !rq.viaLeader {
		if p, owner, ok := f.res.placedOn(key, rq.host, rq.exclude, now); ok {
			f.dispatch(w, r, rq, p, owner)
			return
		}
	}
	hints := placementHints{clientIP: pinboard.ClientIP(r.RemoteAddr, r.Header, f.trustedProxies), caller: rq.caller}
	if f.affinityKey != nil {
		hints.affinity = f.affinityKey(r)
	}
	p, owner, err := f.res.claimFor(r.Context(), rq.key, rq.host, rq.exclude, hints)
	if errors.Is(err, errNoBackends) && !f.res.self.CaughtUp() {
		// Our replica lacks the workers that joined or renewed since the
		// state on disk: wait for it, then route again.
		if !f.res.self.AwaitCaughtUp(r.Context(), startingWait) {
			f.starting(w, r)
			return
		}
		f.routeRequest(w, r, rq)
		return
	}
	if errors.Is(err, errNoBackends) && rq.selfDegraded {
		// No other node serves it: the truth is this node's degradation.
		f.owner.local.WriteOpenError(w, r, key.Namespace, supervisor.ErrDegraded)
		return
	}
	if err != nil {
		f.claimFailed(w, r, rq.key, err)
		return
	}
	f.dispatch(w, r, rq, p, owner)
}

// starting answers a request this node cannot route until its replica has
// caught up (errStarting): nothing ran, retry.
func (f *FrontDoor) starting(w http.ResponseWriter, r *http.Request) {
	if r.Context().Err() != nil {
		httpx.Abandon()
	}
	f.res.counter(outcomeStarting).Inc()
	httpx.WriteError(w, http.StatusServiceUnavailable, errStarting.Error(), time.Second)
}

// dispatch serves on this node or forwards to the owner.
func (f *FrontDoor) dispatch(w http.ResponseWriter, r *http.Request, rq *instanceRequest, p directory.Placement, owner directory.Worker) {
	if p.Owner == f.res.self.ID() {
		f.owner.servePlaced(w, r, rq, p)
		return
	}
	noteServed(r, "forwarded", owner.NodeID)
	f.fwd.forward(w, r, rq, p, owner)
}

// takeOver tells p's owner to wind p's instance down by the end of its
// takeover fence (hostname-aware mode's wind_down): it then gives the id
// back, and the next request through the new hostname places it. Only the
// claim that set the fence, or one after it passed, calls it, within
// claimTimeout; one that fails is logged, and the next claim after the
// fence tells the owner again.
func (f *FrontDoor) takeOver(ctx context.Context, p directory.Placement) {
	deadline := time.UnixMilli(p.FenceUntil)
	if p.Owner == f.res.self.ID() {
		f.owner.local.WindDown(supervisor.Key(p.Key), deadline)
		return
	}
	owner, ok := f.dir.Machine().Worker(p.Owner)
	if !ok {
		return
	}
	// A client that goes away does not cut the owner's notice short.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	if _, err := pinboard.WindDownOn(ctx, f.Peers(), f.dir, f.res.self.ID(), owner, p.Key, p.FenceUntil); err != nil {
		f.logger.Warn("takeover: telling the owner to wind down failed", "instance", p.Key.String(), "owner", owner.NodeID, "err", err)
	}
}

// claimFailed answers a request whose claim failed.
func (f *FrontDoor) claimFailed(w http.ResponseWriter, r *http.Request, key directory.Key, err error) {
	var q quarantineError
	var to takeoverError
	var dp displacedError
	switch {
	case errors.As(err, &to):
		if to.tell {
			f.takeOver(r.Context(), to.p)
		}
		httpx.WriteError(w, http.StatusServiceUnavailable, to.Error(), max(to.remaining, time.Second))
	case errors.As(err, &dp):
		httpx.WriteError(w, http.StatusServiceUnavailable, dp.Error(), max(dp.remaining, time.Second))
	case errors.Is(err, errOtherHostname):
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
	case errors.Is(err, errNoHostname):
		f.res.counter(outcomeNoBackends).Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
	case errors.As(err, &q):
		f.res.counter(outcomeQuarantined).Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, "cold start quarantine", q.remaining)
	case errors.Is(err, errNoBackends):
		f.res.counter(outcomeNoBackends).Inc()
		msg := f.res.noBackends(key.Namespace, time.Now())
		if serr := f.res.storeHealth(); serr != nil {
			// Most likely why: a shared store down takes every worker out.
			msg = serr.Error() + "; " + msg
		}
		httpx.WriteError(w, http.StatusServiceUnavailable, msg, time.Second)
	case r.Context().Err() != nil:
		httpx.Abandon()
	default:
		f.res.counter(outcomeError).Inc()
		f.logger.Warn("placement failed", "path", r.URL.Path, "err", err)
		httpx.WriteError(w, http.StatusServiceUnavailable, "directory unavailable", time.Second)
	}
}

// clusterCall reports whether r is a cluster call (and the hostname its
// caller's plugin serves, in hostname-aware mode): a request an instance on
// this node makes through its own front door (plugins/sdk's
// Instance.ClusterClient marks it). A new placement then prefers this node's
// worker, so an instance's calls to its peers stay close to it. The header
// names the calling namespace and carries its plugin process's credential,
// good only for that process's namespaces while it lives; it never leaves
// the front door. A header that does not prove that is refused (err), not
// ignored.
func (f *FrontDoor) clusterCall(r *http.Request) (host string, ok bool, err error) {
	v := r.Header.Get(plugins.HeaderClusterCall)
	if v == "" {
		return "", false, nil
	}
	r.Header.Del(plugins.HeaderClusterCall)
	ns, tok, err := plugins.ParseClusterCall(v)
	if err != nil {
		return "", false, err
	}
	if f.clusterCalls == nil || !f.res.self.HostsInstances() {
		return "", false, fmt.Errorf("%s: this node runs no plugins", plugins.HeaderClusterCall)
	}
	host, nss, ok := f.clusterCalls(tok)
	if !ok || !slices.Contains(nss, ns) {
		return "", false, fmt.Errorf("%s: the credential is not good for cluster calls from %s on this node", plugins.HeaderClusterCall, ns)
	}
	return host, true, nil
}

// loopRouter is the kept-alive loop's relay.Router: FrontDoor.routeLoop,
// kept out of the front door's exported API.
type loopRouter struct{ f *FrontDoor }

func (r loopRouter) Route(h *relay.ReqHead) (relay.Forward, bool) { return r.f.routeLoop(h) }

// routeLoop is the kept-alive loop's router: of what decide marks as the
// loop's, a request for an instance live here goes to its plugin (the
// owner side's routeLocal), an attested owner-side request to the owner
// side's routeOwned, one for an id placed on a live worker of another
// node to the forwarder's routeForward; anything else goes back to
// net/http.
func (f *FrontDoor) routeLoop(h *relay.ReqHead) (relay.Forward, bool) {
	if f.stopping.Load() {
		return relay.Forward{}, false
	}
	path, query, _ := strings.Cut(h.Target, "?")
	from := fromClient
	if peer := peerOf(h.Conn); peer != nil {
		if peer.Retired() {
			return relay.Forward{}, false // net/http answers it, then closes the connection
		}
		node := peer.PeerNode()
		// A cluster-port connection the loop adopted: a peer that is no
		// member any more is net/http's to refuse.
		from = fromMember
		if f.transport.Secure() {
			if _, member := f.transport.addr(node); !member {
				from = fromStranger
			}
		}
	}
	d := f.decide(h.Method, path, path, query, loopFields(h.Fields), from)
	if !d.loop {
		return relay.Forward{}, false
	}
	switch d.kind {
	case toOwner:
		return f.owner.routeOwned(h, d, query)
	case toInstance:
	default:
		return relay.Forward{}, false
	}
	key, now := d.key(), time.Now()
	host := ""
	if f.res.hostnames {
		// Routed by Host, as serveInstance does; net/http answers a
		// request without one, or for a hostname nothing is bound to.
		host = plugins.NormalizeHost(h.Host)
		env, ok := f.res.envOf(host, key.Namespace)
		if host == "" || !ok {
			return relay.Forward{}, false
		}
		key.Env = env
	}
	if gen, liveHost, live := f.res.liveHere(key); live && liveHost == host {
		return f.owner.routeLocal(h, key, host, gen, withQuery(d.rest, query), now)
	}
	p, owner, ok := f.res.placedOn(key, host, "", now)
	if !ok || p.Owner == f.res.self.ID() {
		return relay.Forward{}, false
	}
	return f.fwd.routeForward(h, p, owner, d.rest, query, now)
}
