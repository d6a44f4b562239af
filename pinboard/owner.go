package pinboard

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/supervisor"
)

// The owner side: a request for an instance of this node's worker, from a
// client of this node or attested by a peer's front door, enters the
// supervisor through Open (the one way in) and reaches the plugin over
// net/http (supervisor.Call.ServeHTTP) or, on a kept-alive connection, the
// loop (toPlugin); httpx.Hop's rule decides what the plugin sees either way.

// servesLive reports whether a worker with lease serves an instance that
// is live here (an unhealthy lease still does; it only takes no new ones).
func servesLive(lease LeaseState) bool { return lease == LeaseHealthy || lease == LeaseUnhealthy }

// owned serves the owner-side route /_pinned/i/<ns>/<id>/<rest>: only with
// a valid attestation for this worker, and only for a placement this node
// really holds under the attested generation. Nothing activates otherwise.
func (f *FrontDoor) owned(w http.ResponseWriter, r *http.Request) {
	escaped := strings.TrimPrefix(r.URL.EscapedPath(), ownerRoutePrefix)
	ns, id, rest, err := parseInstancePath(escaped)
	if err != nil {
		httpx.WriteError(w, http.StatusBadRequest, "invalid instance path: "+err.Error(), 0)
		return
	}
	if f.cfg.Worker == nil {
		w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
		httpx.WriteError(w, http.StatusMisdirectedRequest, "this node hosts no instances", 0)
		return
	}
	att, ok := f.attested(w, r, withQuery(r.URL.EscapedPath(), r.URL.RawQuery))
	if !ok {
		return
	}
	r.Header.Del(AttestationHeader)
	// The peer's X-Forwarded-* describe the client: the instance sees them.
	r = r.WithContext(httpx.WithTrustedForwarding(r.Context()))
	key := directory.Key{Namespace: ns, ID: id}
	if gen, live := f.liveHere(key); live && gen > att.Generation {
		f.notOwner(w)
		return
	} else if live && gen == att.Generation {
		f.serveOwned(w, r, directory.Placement{Key: key, Owner: f.selfID(), Generation: gen}, rest)
		return
	}
	// Activate only once our own replica shows the placement the
	// forwarder resolved: it may be ahead of us by a few entries.
	p, ok := f.awaitPlacement(r.Context(), key, att.Generation)
	if !ok {
		f.notOwner(w)
		return
	}
	f.serveOwned(w, r, p, rest)
}

// serveOwned serves an attested request; its connection may go to the
// kept-alive loop after (serveAdopting).
func (f *FrontDoor) serveOwned(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	noteServed(r, "here", "")
	var body *eofBody
	if r.ContentLength != 0 {
		body = &eofBody{ReadCloser: r.Body}
		r.Body = body
	}
	f.serveAdopting(w, r, func() bool { return body == nil || body.eof }, func(w http.ResponseWriter) { f.serveLocal(w, r, p, rest) })
}

func (f *FrontDoor) notOwner(w http.ResponseWriter) {
	w.Header().Set(RefusalHeader, plugins.RefusalNotOwner)
	httpx.WriteError(w, http.StatusMisdirectedRequest, "not the owner of this placement", 0)
}

func attestOutcome(err error) string {
	switch {
	case errors.Is(err, ErrAttestationMissing):
		return attestMissing
	case errors.Is(err, ErrAttestationExpired):
		return attestExpired
	case errors.Is(err, ErrAttestationReplayed):
		return attestReplayed
	case errors.Is(err, ErrAttestationMalformed):
		return attestMalformed
	case errors.Is(err, ErrAttestationNoKey):
		return attestNoKey
	default:
		return attestForged
	}
}

// serveLocal serves an id placed on this node, activating it if the
// worker's lease allows.
func (f *FrontDoor) serveLocal(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	switch lease := f.cfg.Worker.Lease(time.Now()); lease {
	case LeaseHealthy:
	case LeaseUnhealthy:
		if _, live := f.liveHere(p.Key); !live {
			f.refuse(w, lease)
			return
		}
	default:
		f.refuse(w, lease)
		return
	}
	c, err := f.cfg.Local.Open(r.Context(), p.Key.Namespace, p.Key.ID, p.Generation, supervisor.Activate, nil)
	if err != nil {
		f.cfg.Local.WriteOpenError(w, r, p.Key.Namespace, err)
		return
	}
	c.ServeHTTP(w, r, rest)
}

// refuse answers for a worker whose lease does not allow the request. An
// unhealthy lease refuses in-band (RefusalHeader) so a forwarding front
// door releases the placement and retries elsewhere.
func (f *FrontDoor) refuse(w http.ResponseWriter, lease LeaseState) {
	switch lease {
	case LeaseUnhealthy:
		w.Header().Set(RefusalHeader, plugins.RefusalLeaseUnhealthy)
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease unhealthy", time.Second)
	case LeaseUnregistered:
		httpx.WriteError(w, http.StatusServiceUnavailable, "worker not registered yet", time.Second)
	default:
		httpx.WriteError(w, http.StatusServiceUnavailable, "lease expired", time.Second)
	}
}

// routeLocal is Route for an id live on this node under gen: while the
// lease allows, straight to the plugin.
func (f *FrontDoor) routeLocal(h *relay.ReqHead, key directory.Key, gen uint64, target string, now time.Time) (relay.Forward, bool) {
	if !servesLive(f.cfg.Worker.Lease(now)) {
		return relay.Forward{}, false // net/http refuses it
	}
	c, err := f.cfg.Local.Open(context.Background(), key.Namespace, key.ID, gen, supervisor.IfReady, h.Ticket.Abort)
	if err != nil {
		return relay.Forward{}, false
	}
	f.resolvedLocal.Inc()
	return toPlugin(h, c, target, false), true
}

// routeOwned is Route for the owner-side route (a peer forwarding on a
// connection the loop adopted here): a request for an instance live here
// under the attested generation, with a valid attestation, goes straight
// to the instance's plugin. Anything else goes back to net/http (owned)
// with its attestation unspent, so net/http decides it as before: refuses,
// waits for the placement, or activates.
func (f *FrontDoor) routeOwned(h *relay.ReqHead, path, query string) (relay.Forward, bool) {
	if f.cfg.Worker == nil || f.cfg.Local == nil {
		return relay.Forward{}, false
	}
	ns, id, rest, err := parseInstancePath(path)
	if err != nil {
		return relay.Forward{}, false
	}
	header := ""
	for _, fl := range h.Fields {
		if strings.EqualFold(fl.Name, AttestationHeader) {
			if header != "" {
				return relay.Forward{}, false
			}
			header = fl.Value
		}
	}
	now := time.Now()
	// Only live instances come here, so an unhealthy lease serves too; an
	// expired one is net/http's to refuse.
	if !servesLive(f.cfg.Worker.Lease(now)) {
		return relay.Forward{}, false
	}
	att, err := f.checkOwned(header, h.Method, h.Target, now)
	if err != nil {
		return relay.Forward{}, false // net/http refuses it, and counts why
	}
	c, err := f.cfg.Local.Open(context.Background(), ns, id, att.Generation, supervisor.IfReady, h.Ticket.Abort)
	if err != nil {
		return relay.Forward{}, false
	}
	if err := f.verifier.Spend(att, now); err != nil {
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
	*wire, _ = hop.AppendRequest(*wire, h.Method, target, h.All(), h.Body) // the loop's parse admits no unsafe byte
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
			c.End(status, errors.Is(err, relay.ErrRefused))
		},
	}
}

// pluginRefused: the plugin does not hold the instance (relay.Forward.Refused).
func pluginRefused(status int, marker string) bool {
	return plugins.ClassifyAnswer(status, marker) == plugins.AnswerInactive
}
