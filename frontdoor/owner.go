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

// ask is what an owner-side entry knows of a request when it asks admit.
type ask struct {
	key directory.Key
	// A peer's request carries an attestation (header) over method and
	// signedPath; spend spends it at once (net/http's entries: the loop
	// spends once it opened the instance, so that a request it gives
	// back keeps its attestation good). attested false: a client's
	// request of this node.
	attested                   bool
	header, method, signedPath string
	spend                      bool
	// A client's request names what this node found: live here (under
	// gen, run by host's plugin), or the placement its replica shows as
	// ours (placed).
	live   bool
	gen    uint64
	host   string
	placed directory.Placement
	// wait: a peer's request for an id not live here waits (briefly) for
	// this node's replica to show the attested placement (net/http's
	// entries); without it, only what is live here is admitted (the loop).
	wait bool
}

// admitted is what admit let in: the placement to serve key under, and
// whether its instance is live here under it.
type admitted struct {
	p    directory.Placement
	live bool
	att  pinboard.Attestation
}

// The owner side's refusals (answer writes each; the loop gives the
// request back to net/http instead).
var (
	errNoHosts  = errors.New("this node hosts no instances")
	errNotOwner = errors.New("not the owner of this placement")
	errNotLive  = errors.New("not live here") // the loop's: net/http decides
)

// attestError is a peer's attestation the gate refused.
type attestError struct{ err error }

func (e attestError) Error() string { return "invalid attestation: " + e.err.Error() }
func (e attestError) Unwrap() error { return e.err }

// leaseError is a request the worker's lease does not allow.
type leaseError struct{ lease pinboard.LeaseState }

func (e leaseError) Error() string { return "this worker's lease is " + e.lease.String() }

// admit is the owner side's one admission, which every owner entry
// calls: a peer's attestation (checked by the gate, and spent if a.spend),
// the placement and generation (live here, or what the replica shows:
// ours, under exactly the attested generation, once it has applied this
// worker's session), the drain (nothing new activates on a draining node)
// and the lease (leaseAllows). Its error is the refusal.
func (o *ownerSide) admit(ctx context.Context, a ask, now time.Time) (admitted, error) {
	if o.worker == nil || o.local == nil {
		return admitted{}, errNoHosts
	}
	var in admitted
	if a.attested {
		att, err := o.gate.Check(a.header, a.method, a.signedPath, now)
		if err == nil && a.spend {
			err = o.gate.Spend(att, now)
		}
		if err != nil {
			return admitted{}, attestError{err}
		}
		in.att = att
		gen, host, live := o.res.liveHere(a.key)
		switch {
		case live && gen > att.Generation:
			return admitted{}, errNotOwner
		case live && gen == att.Generation:
			in.p, in.live = directory.Placement{Key: a.key, Owner: o.self.ID(), Generation: gen, Hostname: host}, true
		case !a.wait:
			return admitted{}, errNotLive
		case o.draining():
			// Waiting for the replica to show the placement would only
			// hold the forwarder until its head wait ends in a 504.
			// Refused in-band, it releases the placement and retries on
			// another worker at once.
			return admitted{}, supervisor.ErrDraining
		default:
			p, ok := o.awaitPlacement(ctx, a.key, att.Generation)
			if !ok {
				return admitted{}, errNotOwner
			}
			in.p = p
		}
	} else {
		in.p, in.live = a.placed, a.live
		if a.live {
			in.p = directory.Placement{Key: a.key, Owner: o.self.ID(), Generation: a.gen, Hostname: a.host}
		}
	}
	if lease, ok := o.leaseAllows(in.p.Key, in.live, now); !ok {
		return admitted{}, leaseError{lease}
	}
	return in, nil
}

// leaseAllows is the owner side's one lease rule: a healthy lease serves
// anything; an unhealthy one (renewals failing, the placements still held)
// serves instances live here, never a new activation; unregistered or
// expired serves nothing. live: the caller knows key's instance is live
// here (else the rule looks).
func (o *ownerSide) leaseAllows(key directory.Key, live bool, now time.Time) (pinboard.LeaseState, bool) {
	switch lease := o.worker.Lease(now); lease {
	case pinboard.LeaseHealthy:
		return lease, true
	case pinboard.LeaseUnhealthy:
		if !live {
			_, _, live = o.res.liveHere(key)
		}
		return lease, live
	default:
		return lease, false
	}
}

// answer writes admit's refusal err for r.
func (o *ownerSide) answer(w http.ResponseWriter, r *http.Request, key directory.Key, err error) {
	var le leaseError
	var ae attestError
	switch {
	case errors.As(err, &le):
		refuse(w, le.lease)
	case errors.As(err, &ae):
		o.gate.Refuse(w, ae.err)
	case errors.Is(err, errNoHosts):
		w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
		httpx.WriteError(w, http.StatusMisdirectedRequest, errNoHosts.Error(), 0)
	case errors.Is(err, errNotOwner):
		notOwner(w)
	default:
		o.local.WriteOpenError(w, r, key.Namespace, err)
	}
}

// serveLive serves a client's request for an instance live here, as far
// as the lease allows, and reports whether it answered (false: the
// instance stopped meanwhile; the router resolves it afresh).
func (o *ownerSide) serveLive(w http.ResponseWriter, r *http.Request, rq *instanceRequest) bool {
	if _, err := o.admit(r.Context(), ask{key: rq.key, live: true}, time.Now()); err != nil {
		o.answer(w, r, rq.key, err)
		return true
	}
	c, err := o.local.Open(r.Context(), rq.host, supervisor.Key(rq.key), 0, supervisor.IfLive)
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
	o.keep.serveAdopting(w, r, rq.adoptable, func(w http.ResponseWriter) {
		r := rq.withBody(r)
		in, err := o.admit(r.Context(), ask{key: p.Key, placed: p}, time.Now())
		if err != nil {
			o.answer(w, r, p.Key, err)
			return
		}
		o.serveAdmitted(w, r, in, rq.rest)
	})
}

// owned serves the owner-side route /_pinned/i/<ns>/<id>/<rest>: only with
// a valid attestation for this worker, and only for a placement this node
// really holds under the attested generation. Nothing activates otherwise.
func (o *ownerSide) owned(w http.ResponseWriter, r *http.Request, d decision) {
	if d.err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+d.err.Error(), 0)
		return
	}
	key := d.key()
	in, err := o.admit(r.Context(), ask{key: key, attested: true, header: r.Header.Get(pinboard.AttestationHeader),
		method: r.Method, signedPath: withQuery(r.URL.EscapedPath(), r.URL.RawQuery), spend: true, wait: true}, time.Now())
	if err != nil {
		o.answer(w, r, key, err)
		return
	}
	r.Header.Del(pinboard.AttestationHeader)
	// The peer's X-Forwarded-* describe the client: the instance sees them.
	r = r.WithContext(httpx.WithTrustedForwarding(r.Context()))
	noteServed(r, "here", "")
	var body *eofBody
	if r.ContentLength != 0 {
		body = &eofBody{ReadCloser: r.Body}
		r.Body = body
	}
	o.keep.serveAdopting(w, r, func() bool { return body == nil || body.eof }, func(w http.ResponseWriter) { o.serveAdmitted(w, r, in, d.rest) })
}

// serveAdmitted serves an admitted request: its instance opened (activated
// if it is not live here) under the admitted generation.
func (o *ownerSide) serveAdmitted(w http.ResponseWriter, r *http.Request, in admitted, rest string) {
	c, err := o.local.Open(r.Context(), in.p.Hostname, supervisor.Key(in.p.Key), in.p.Generation, supervisor.Activate)
	if err != nil {
		o.local.WriteOpenError(w, r, in.p.Key.Namespace, err)
		return
	}
	c.ServeHTTP(w, r, rest)
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

// degraded reports whether (host, ns) is degraded on this node (its
// plugin crash-loops): ids of it placed here are given up for other nodes.
func (o *ownerSide) degraded(host, ns string) bool {
	return o.local != nil && o.local.Degraded(supervisor.Route{Hostname: host, Namespace: ns})
}

func notOwner(w http.ResponseWriter) {
	w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
	httpx.WriteError(w, http.StatusMisdirectedRequest, errNotOwner.Error(), 0)
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

// routeLocal is routeLoop for an id live on this node under gen, run by
// host's plugin: while the lease allows, straight to the plugin.
func (o *ownerSide) routeLocal(h *relay.ReqHead, key directory.Key, host string, gen uint64, target string, now time.Time) (relay.Forward, bool) {
	if _, err := o.admit(context.Background(), ask{key: key, live: true, gen: gen, host: host}, now); err != nil {
		return relay.Forward{}, false // net/http refuses it
	}
	c, ok := o.openReady(h, host, key, gen)
	if !ok {
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
func (o *ownerSide) routeOwned(h *relay.ReqHead, d decision, query string) (relay.Forward, bool) {
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
	in, err := o.admit(context.Background(), ask{key: d.key(), attested: true,
		header: header, method: h.Method, signedPath: h.Target}, now)
	if err != nil {
		return relay.Forward{}, false // net/http refuses it, and counts why
	}
	c, ok := o.openReady(h, in.p.Hostname, in.p.Key, in.att.Generation)
	if !ok {
		return relay.Forward{}, false
	}
	if err := o.gate.Spend(in.att, now); err != nil {
		c.End(0, false)
		return relay.Forward{}, false // a replay: net/http refuses it
	}
	return toPlugin(h, c, withQuery(d.rest, query), true), true
}

// openReady is the loop's Open: the instance only if it is ready here
// under gen (the loop never waits), with the loop's exchange aborted
// should the instance be evicted while it runs.
func (o *ownerSide) openReady(h *relay.ReqHead, host string, key directory.Key, gen uint64) (*supervisor.Call, bool) {
	c, err := o.local.Open(context.Background(), host, supervisor.Key(key), gen, supervisor.IfReady)
	if err != nil {
		return nil, false
	}
	if !c.OnEvict(h.Ticket.Abort) {
		c.End(0, false)
		return nil, false
	}
	return c, true
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
func (o *ownerSide) wakeOwned(w http.ResponseWriter, r *http.Request, d decision) {
	if d.err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+d.err.Error(), 0)
		return
	}
	key := d.key()
	in, err := o.admit(r.Context(), ask{key: key, attested: true, header: r.Header.Get(pinboard.AttestationHeader),
		method: r.Method, signedPath: r.URL.EscapedPath(), spend: true, wait: true}, time.Now())
	if err != nil {
		o.answer(w, r, key, err)
		return
	}
	if err := o.local.Wake(r.Context(), in.p.Hostname, supervisor.Key(key), in.p.Generation); err != nil {
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wakeLocal activates p's instance here (FrontDoor.Wake, for an id placed
// on this node's worker), as far as admit allows.
func (o *ownerSide) wakeLocal(ctx context.Context, p directory.Placement) error {
	if _, err := o.admit(ctx, ask{key: p.Key, placed: p}, time.Now()); err != nil {
		return fmt.Errorf("wake %s: %w", p.Key, err)
	}
	return o.local.Wake(ctx, p.Hostname, supervisor.Key(p.Key), p.Generation)
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
