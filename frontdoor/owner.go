package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// ownerSide serves the instances of this node's worker: a request from a
// client of this node, or attested by a peer's front door, enters the
// supervisor through Open (the one way in) and reaches the plugin over
// net/http (supervisor.Call.ServeHTTP) or, on a kept-alive connection, the
// loop (toPlugin); httpx.Hop's rule decides what the plugin sees either
// way. Attested requests pass the control plane's OwnerGate.
type ownerSide struct {
	dir    *pinboard.Directory    // the placement an attested request must match
	self   *pinboard.Self         // this node's worker and replica
	worker *pinboard.Worker       // nil on a node without hosts
	local  *supervisor.Supervisor // nil on a node without hosts
	res    *resolver              // liveHere
	keep   *keptAlive             // a served connection's next requests
	// gate checks attestations for this worker and spends each once.
	gate       *pinboard.OwnerGate
	servedHere prometheus.Counter // resolutions{outcome=local}
}

func newOwnerSide(dir *pinboard.Directory, self *pinboard.Self, local *supervisor.Supervisor, res *resolver, keep *keptAlive, gate *pinboard.OwnerGate) *ownerSide {
	return &ownerSide{
		dir: dir, self: self, worker: self.Worker(), local: local, res: res, keep: keep, gate: gate,
		servedHere: res.counter(outcomeLocal),
	}
}

// leaseAllows is the owner side's one lease rule, for every entry: a
// healthy lease serves anything; an unhealthy one (renewals failing, the
// placements still held) serves instances live here, never a new
// activation; unregistered or expired serves nothing. live: the caller
// knows key's instance is live here (else the rule looks).
func (o *ownerSide) leaseAllows(key directory.Key, live bool, now time.Time) (pinboard.LeaseState, bool) {
	switch lease := o.worker.Lease(now); lease {
	case pinboard.LeaseHealthy:
		return lease, true
	case pinboard.LeaseUnhealthy:
		if !live {
			_, live = o.res.liveHere(key)
		}
		return lease, live
	default:
		return lease, false
	}
}

// serveLive serves a client's request for an instance live here, as far
// as the lease allows, and reports whether it answered (false: the
// instance stopped meanwhile; the router resolves it afresh).
func (o *ownerSide) serveLive(w http.ResponseWriter, r *http.Request, rq *instanceRequest) bool {
	if lease, ok := o.leaseAllows(rq.key, true, time.Now()); !ok {
		refuse(w, lease)
		return true
	}
	c, err := o.local.Open(r.Context(), rq.key.Namespace, rq.key.ID, 0, supervisor.IfLive, nil)
	if err != nil {
		return false
	}
	o.servedHere.Inc()
	noteServed(r, "here", "")
	o.keep.serveAdopting(w, r, rq.adoptable, func(w http.ResponseWriter) { c.ServeHTTP(w, rq.withBody(r), rq.rest) })
	return true
}

// servePlaced serves a client's request for an id the directory places on
// this node's worker.
func (o *ownerSide) servePlaced(w http.ResponseWriter, r *http.Request, rq *instanceRequest, p directory.Placement) {
	o.servedHere.Inc()
	noteServed(r, "here", "")
	o.keep.serveAdopting(w, r, rq.adoptable, func(w http.ResponseWriter) { o.serveLocal(w, rq.withBody(r), p, rq.rest) })
}

// owned serves the owner-side route /_pinned/i/<ns>/<id>/<rest>: only with
// a valid attestation for this worker, and only for a placement this node
// really holds under the attested generation. Nothing activates otherwise.
func (o *ownerSide) owned(w http.ResponseWriter, r *http.Request) {
	escaped := strings.TrimPrefix(r.URL.EscapedPath(), ownerRoutePrefix)
	ns, id, rest, err := parseInstancePath(escaped)
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+err.Error(), 0)
		return
	}
	if o.worker == nil {
		w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
		httpx.WriteError(w, http.StatusMisdirectedRequest, "this node hosts no instances", 0)
		return
	}
	att, ok := o.gate.Admit(w, r, withQuery(r.URL.EscapedPath(), r.URL.RawQuery))
	if !ok {
		return
	}
	r.Header.Del(pinboard.AttestationHeader)
	// The peer's X-Forwarded-* describe the client: the instance sees them.
	r = r.WithContext(httpx.WithTrustedForwarding(r.Context()))
	key := directory.Key{Namespace: ns, ID: id}
	if gen, live := o.res.liveHere(key); live && gen > att.Generation {
		notOwner(w)
		return
	} else if live && gen == att.Generation {
		o.serveOwned(w, r, directory.Placement{Key: key, Owner: o.self.ID(), Generation: gen}, rest)
		return
	}
	if o.draining() {
		// Nothing activates here any more: waiting for the replica to
		// show the placement would only hold the forwarder until its
		// head wait ends in a 504. Refused in-band, it releases the
		// placement and retries on another worker at once.
		o.local.WriteOpenError(w, r, ns, supervisor.ErrDraining)
		return
	}
	// Activate only once our own replica shows the placement the
	// forwarder resolved: it may be ahead of us by a few entries.
	p, ok := o.awaitPlacement(r.Context(), key, att.Generation)
	if !ok {
		notOwner(w)
		return
	}
	o.serveOwned(w, r, p, rest)
}

// serveOwned serves an attested request; its connection may go to the
// kept-alive loop after (serveAdopting).
func (o *ownerSide) serveOwned(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	noteServed(r, "here", "")
	var body *eofBody
	if r.ContentLength != 0 {
		body = &eofBody{ReadCloser: r.Body}
		r.Body = body
	}
	o.keep.serveAdopting(w, r, func() bool { return body == nil || body.eof }, func(w http.ResponseWriter) { o.serveLocal(w, r, p, rest) })
}

// draining reports whether this node is draining (or cordoned): it
// activates nothing new.
func (o *ownerSide) draining() bool {
	if o.local == nil {
		return false
	}
	d, _ := o.local.Draining()
	return d
}

// degraded reports whether ns is degraded on this node (its plugin
// crash-loops): ids of it placed here are given up for other nodes.
func (o *ownerSide) degraded(ns string) bool { return o.local != nil && o.local.Degraded(ns) }

func notOwner(w http.ResponseWriter) {
	w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
	httpx.WriteError(w, http.StatusMisdirectedRequest, "not the owner of this placement", 0)
}

// serveLocal serves an id placed on this node, activating it if the
// worker's lease allows.
func (o *ownerSide) serveLocal(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	if lease, ok := o.leaseAllows(p.Key, false, time.Now()); !ok {
		refuse(w, lease)
		return
	}
	c, err := o.local.Open(r.Context(), p.Key.Namespace, p.Key.ID, p.Generation, supervisor.Activate, nil)
	if err != nil {
		o.local.WriteOpenError(w, r, p.Key.Namespace, err)
		return
	}
	c.ServeHTTP(w, r, rest)
}

// refuse answers for a worker whose lease does not allow the request. An
// unhealthy lease refuses in-band (RefusalHeader) so a forwarding front
// door releases the placement and retries elsewhere.
func refuse(w http.ResponseWriter, lease pinboard.LeaseState) {
	switch lease {
	case pinboard.LeaseUnhealthy:
		w.Header().Set(RefusalHeader, plugins.RefusalLeaseUnhealthy)
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease unhealthy", time.Second)
	case pinboard.LeaseUnregistered:
		httpx.WriteError(w, http.StatusServiceUnavailable, "worker not registered yet", time.Second)
	default:
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease expired", time.Second)
	}
}

// routeLocal is routeLoop for an id live on this node under gen: while the
// lease allows, straight to the plugin.
func (o *ownerSide) routeLocal(h *relay.ReqHead, key directory.Key, gen uint64, target string, now time.Time) (relay.Forward, bool) {
	if _, ok := o.leaseAllows(key, true, now); !ok {
		return relay.Forward{}, false // net/http refuses it
	}
	c, err := o.local.Open(context.Background(), key.Namespace, key.ID, gen, supervisor.IfReady, h.Ticket.Abort)
	if err != nil {
		return relay.Forward{}, false
	}
	o.servedHere.Inc()
	return toPlugin(h, c, target, false), true
}

// routeOwned is routeLoop for the owner-side route (a peer forwarding on a
// connection the loop adopted here): a request for an instance live here
// under the attested generation, with a valid attestation, goes straight
// to the instance's plugin. Anything else goes back to net/http (owned)
// with its attestation unspent, so net/http decides it: refuses, waits for
// the placement, or activates.
func (o *ownerSide) routeOwned(h *relay.ReqHead, path, query string) (relay.Forward, bool) {
	if o.worker == nil || o.local == nil {
		return relay.Forward{}, false
	}
	ns, id, rest, err := parseInstancePath(path)
	if err != nil {
		return relay.Forward{}, false
	}
	header := ""
	for _, fl := range h.Fields {
		if strings.EqualFold(fl.Name, pinboard.AttestationHeader) {
			if header != "" {
				return relay.Forward{}, false
			}
			header = fl.Value
		}
	}
	now := time.Now()
	// Only live instances are served here (IfReady below); anything the
	// lease refuses is net/http's to refuse.
	if _, ok := o.leaseAllows(directory.Key{Namespace: ns, ID: id}, true, now); !ok {
		return relay.Forward{}, false
	}
	att, err := o.gate.Check(header, h.Method, h.Target, now)
	if err != nil {
		return relay.Forward{}, false // net/http refuses it, and counts why
	}
	c, err := o.local.Open(context.Background(), ns, id, att.Generation, supervisor.IfReady, h.Ticket.Abort)
	if err != nil {
		return relay.Forward{}, false
	}
	if err := o.gate.Spend(att, now); err != nil {
		c.End(0, false)
		return relay.Forward{}, false // a replay: net/http refuses it
	}
	return toPlugin(h, c, withQuery(rest, query), true), true
}

// toPlugin is the loop's carriage of h to its instance's plugin, for call
// c: the request under httpx.Hop's rule (trusted: a peer attested it, its
// forwarding fields pass on), the answer read by plugins.ClassifyAnswer,
// the call ended with the exchange. Routed, it never goes back to net/http
// (Final): the loop answers a plugin that did not.
func toPlugin(h *relay.ReqHead, c *supervisor.Call, target string, trusted bool) relay.Forward {
	hop := httpx.Hop{RemoteAddr: h.RemoteAddr, Host: h.Host, Trusted: trusted, Set: c.Fields()}
	wire := relay.WireBuffer()
	*wire, _ = hop.AppendFields(*wire, h.Method, target, h.Fields, h.Body) // the loop's parse admits no unsafe byte
	return relay.Forward{
		Addr:    c.Socket(),
		Wire:    *wire,
		Refusal: RefusalHeader,
		Refused: pluginRefused,
		Final:   true,
		FailMsg: supervisor.RestartingMsg,
		Timeout: -1, // a handler may hold a request as long as it likes, as over net/http
		Head: func(_ int, stream bool) {
			if stream {
				c.Stream()
			}
		},
		Done: func(status int, err error) {
			relay.ReleaseWire(wire)
			endRelayed(c, status, err)
		},
	}
}

// endRelayed ends call c for an exchange the loop carried, with what
// relay.Forward.Done reports: a refusal means the plugin no longer holds
// the instance; an exchange that ended for the plugin's sake (the loop
// answered the client itself) is booked as unanswered, as net/http's path
// books it.
func endRelayed(c *supervisor.Call, status int, err error) {
	if relay.FailedUpstream(err) {
		c.Unanswered(err)
	}
	c.End(status, errors.Is(err, relay.ErrRefused))
}

// pluginRefused: the plugin does not hold the instance (relay.Forward.Refused).
func pluginRefused(status int, marker string) bool {
	return plugins.ClassifyAnswer(status, marker) == plugins.AnswerInactive
}

// wakeOwned serves POST /_pinned/wake/<ns>/<id> to an attested caller, for
// a placement this node's replica shows under the attested generation.
func (o *ownerSide) wakeOwned(w http.ResponseWriter, r *http.Request) {
	ns, id, _, err := parseInstancePath(strings.TrimPrefix(r.URL.EscapedPath(), wakePrefix))
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+err.Error(), 0)
		return
	}
	if o.worker == nil {
		notOwner(w)
		return
	}
	att, ok := o.gate.Admit(w, r, r.URL.EscapedPath())
	if !ok {
		return
	}
	if o.draining() {
		o.local.WriteOpenError(w, r, ns, supervisor.ErrDraining) // nothing wakes here any more
		return
	}
	key := directory.Key{Namespace: ns, ID: id}
	p, ok := o.awaitPlacement(r.Context(), key, att.Generation)
	if !ok {
		notOwner(w)
		return
	}
	if err := o.wakeLocal(r.Context(), p); err != nil {
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wakeLocal activates p's instance here, if the lease allows a new one.
func (o *ownerSide) wakeLocal(ctx context.Context, p directory.Placement) error {
	if o.worker == nil {
		return fmt.Errorf("wake %s: this node hosts no instances", p.Key)
	}
	if lease, ok := o.leaseAllows(p.Key, false, time.Now()); !ok {
		return fmt.Errorf("wake %s: this worker's lease is %s", p.Key, lease)
	}
	if o.local == nil {
		return fmt.Errorf("wake %s: this node hosts no instances", p.Key)
	}
	return o.local.Wake(ctx, p.Key.Namespace, p.Key.ID, p.Generation)
}

// awaitPlacement waits (briefly) until this node's replica shows key
// placed under generation or a newer one, and reports the placement if it
// is ours under exactly that generation. The forwarder resolved it through
// the leader, so our replica may be a few entries behind, and it must have
// applied our own session (resolver.replicaHasSession).
func (o *ownerSide) awaitPlacement(ctx context.Context, key directory.Key, generation uint64) (directory.Placement, bool) {
	m := o.dir.Machine()
	deadline := time.Now().Add(3 * time.Second)
	for {
		p, found := m.Placement(key)
		if found && p.Generation >= generation && o.self.ReplicaHasSession() {
			if p.Owner != o.self.ID() || p.Generation != generation {
				return directory.Placement{}, false
			}
			return p, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return directory.Placement{}, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
