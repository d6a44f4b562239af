package pinboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
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
	key, self, now := rt.key, f.selfID(), time.Now()
	// A live local instance is this node's own record of a placement it
	// was granted; the local replica may not have applied the grant yet
	// (or ever, if the leader died right after committing it). Serving it
	// is as safe as the lease allows.
	if self != "" && f.cfg.Local.Live(key.Namespace, key.ID) {
		switch lease := f.cfg.Worker.Lease(now); lease {
		case LeaseHealthy, LeaseUnhealthy:
			served := false
			f.serveAdopting(w, r, rt.bodyRead, func(w http.ResponseWriter) {
				served = f.cfg.Local.ServeExisting(w, rt.withBody(r), key.Namespace, key.ID, rt.rest)
			})
			if served {
				f.resolvedLocal.Inc()
				noteServed(r, "here", "")
				return
			}
		default:
			f.refuse(w, lease)
			return
		}
	}
	if !rt.viaLeader {
		if p, owner, ok := f.cfg.Dir.Machine().Owner(key); ok && owner.Live(now.UnixMilli()) && owner.ClientID != rt.exclude {
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

// dispatch serves on this node or forwards to the owner.
func (f *FrontDoor) dispatch(w http.ResponseWriter, r *http.Request, rt *route, p directory.Placement, owner directory.Worker) {
	if p.Owner == f.selfID() {
		f.resolvedLocal.Inc()
		noteServed(r, "here", "")
		f.serveAdopting(w, r, rt.bodyRead, func(w http.ResponseWriter) { f.serveLocal(w, rt.withBody(r), p, rt.rest) })
		return
	}
	f.resolvedForwarded.Inc()
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

// serveLocal serves an id placed on this node, as the worker's lease allows.
func (f *FrontDoor) serveLocal(w http.ResponseWriter, r *http.Request, p directory.Placement, rest string) {
	switch lease := f.cfg.Worker.Lease(time.Now()); lease {
	case LeaseHealthy:
	case LeaseUnhealthy:
		if !f.cfg.Local.Live(p.Key.Namespace, p.Key.ID) {
			f.refuse(w, lease)
			return
		}
	default:
		f.refuse(w, lease)
		return
	}
	f.cfg.Local.ServeInstance(w, r, p.Key.Namespace, p.Key.ID, p.Generation, rest)
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

// Forwarding failures, seen by the proxy's error handler.
type refusedError struct {
	marker string
	resp   *http.Response
}

func (e *refusedError) Error() string { return "owner refused: " + e.marker }

type fwdCtxKey struct{}

type fwdInfo struct {
	rt    *route
	w     http.ResponseWriter
	orig  *http.Request
	p     directory.Placement
	owner directory.Worker
}

// forward proxies r to the owner's attested owner-side route.
func (f *FrontDoor) forward(w http.ResponseWriter, r *http.Request, rt *route, p directory.Placement, owner directory.Worker) {
	start := time.Now()
	defer func() { f.forwardSeconds.Observe(time.Since(start).Seconds()) }()
	secret := f.cfg.Dir.Machine().Secret()
	if len(secret) == 0 {
		httpx.WriteError(w, http.StatusServiceUnavailable, "cluster secret not replicated yet", time.Second)
		return
	}
	base, err := url.Parse(owner.AdvertiseURL)
	if err != nil {
		httpx.WriteError(w, http.StatusBadGateway, "owner has an invalid advertise URL", 0)
		return
	}
	path, signed, att := f.attestFor(secret, p, owner, r.Method, rt.rest, r.URL.RawQuery, time.Now())

	info := &fwdInfo{rt: rt, w: w, orig: r, p: p, owner: owner}
	basePath := strings.TrimSuffix(base.Path, "/")
	if f.fastForwardable(r, rt, base.Scheme) {
		target := basePath + signed
		if f.forwardWire(w, r, info, base.Host, target, att) {
			return
		}
	}
	ctx := context.WithValue(r.Context(), fwdCtxKey{}, info)
	out := rt.withBody(r).Clone(ctx)
	out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host, Path: basePath + path, RawQuery: r.URL.RawQuery}
	if unescaped, err := url.PathUnescape(out.URL.Path); err == nil && unescaped != out.URL.Path {
		out.URL.RawPath = out.URL.Path
		out.URL.Path = unescaped
	}
	out.Header.Set(AttestationHeader, att)
	f.proxy.ServeHTTP(w, out)
}

// attestFor is the owner-side route of p's instance path rest (escaped), the
// same with query (what is signed), and the attestation that lets owner
// serve it.
func (f *FrontDoor) attestFor(secret []byte, p directory.Placement, owner directory.Worker, method, rest, query string, now time.Time) (path, signed, att string) {
	path = ownerRoutePrefix + p.Key.Namespace + "/" + p.Key.ID + rest
	signed = withQuery(path, query)
	return path, signed, SignFor(secret, owner.SessionID, Attestation{Target: owner.ClientID, Caller: f.selfID(), Generation: p.Generation, At: now}, method, signed)
}

// newProxy builds the node-to-node proxy: streams flush through, Upgrade
// requests pass as raw connections, a client going away cancels upstream.
// Held streams leave it for the relay loop (handOff).
func (f *FrontDoor) newProxy(tr http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport:  tr,
		BufferPool: &f.bufs,
		ErrorLog:   slog.NewLogLogger(f.cfg.Logger.Handler(), slog.LevelDebug),
		// FlushInterval 0: ReverseProxy flushes streamed responses (SSE,
		// unknown length) on every write by itself, and leaves
		// fixed-length ones whole, one write to the client.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		ModifyResponse: func(resp *http.Response) error {
			info, _ := resp.Request.Context().Value(fwdCtxKey{}).(*fwdInfo)
			return f.checkResponse(info, resp)
		},
		ErrorHandler: f.forwardFailed,
	}
}

// checkResponse sees the owner's response head first: an in-band refusal
// becomes a refusedError, a held stream goes to the relay loop
// (errHandedOff); nil lets the response through.
func (f *FrontDoor) checkResponse(info *fwdInfo, resp *http.Response) error {
	switch m := resp.Header.Get(RefusalHeader); {
	case resp.StatusCode == http.StatusServiceUnavailable && (m == plugins.RefusalLeaseUnhealthy || m == plugins.RefusalDraining),
		resp.StatusCode == http.StatusMisdirectedRequest && m == plugins.RefusalNotOwner:
		return &refusedError{marker: m, resp: resp}
	}
	if info != nil && f.handOff(info, resp) {
		return errHandedOff
	}
	return nil
}

// errHandedOff: the response went to the relay loop; the proxy is done.
var errHandedOff = errors.New("response handed to the relay loop")

// heldStream reports whether resp, answering in, may stay open for as long
// as its client likes (server-sent events, a long poll: a body of unknown
// length) and the relay loop can carry it: HTTP/1.1 both ways, in plain
// text. 101 responses never get here (ReverseProxy passes Upgrades through
// as they are), nor do bodies of known length.
func heldStream(in *http.Request, resp *http.Response) bool {
	return relay.Supported && in.ProtoMajor == 1 && in.ProtoMinor == 1 && in.TLS == nil && in.Method != http.MethodHead &&
		resp.ProtoAtLeast(1, 1) && resp.ContentLength < 0 &&
		resp.StatusCode >= 200 && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
}

// handOff takes a held stream out of net/http and gives it to the relay
// loop, and reports whether it did (the client connection is then gone
// from net/http, and the proxy must not touch w). net/http would keep two
// goroutines per held connection, about 18 KB of stacks; the loop keeps two
// descriptors and a small record. A chunked body that already ended in
// the bytes read with its head is no held stream: the proxy copies it and
// both connections stay alive.
func (f *FrontDoor) handOff(info *fwdInfo, resp *http.Response) bool {
	if !heldStream(info.orig, resp) {
		return false
	}
	chunked := relay.Chunked(resp)
	if raw, ok := httpx.RawBody(resp); !ok || chunked && relay.Ends(raw) {
		return false
	}
	// Anything the client sent after its request (nothing, from a client
	// that waits for the response) is dropped with the hijacked reader:
	// the connection ends with this response.
	conn, _, err := http.NewResponseController(info.w).Hijack()
	if err != nil {
		return false
	}
	// What ReverseProxy would send: the front door's header and the
	// owner's, hop-by-hop fields already stripped.
	header := info.w.Header().Clone()
	for k, vs := range resp.Header {
		for _, v := range vs {
			header.Add(k, v)
		}
	}
	up, body, err := httpx.Detach(resp)
	if err != nil {
		// The client left while the head arrived.
		_ = conn.Close()
		f.forwardFailures.WithLabelValues(outcomeCanceled).Inc()
		return true
	}
	noteRelayed(info.orig, resp.StatusCode)
	if err := f.relay.Add(relay.Stream{
		Client: conn, Upstream: up, Head: relay.Head(resp, header), Body: body, Chunked: chunked,
		Done: f.relayEnded,
	}); err != nil {
		f.relayEnds.WithLabelValues(relayEndRefused).Inc()
		f.cfg.Logger.Debug("relay refused a held stream; closed it", "key", info.p.Key.String(), "err", err)
	}
	return true
}

// relayEnded counts a relayed stream's end (on the relay loop's goroutine).
func (f *FrontDoor) relayEnded(r relay.Reason) {
	f.relayEnds.WithLabelValues(r.String()).Inc()
}

// forwardFailed handles an owner that could not be reached, refused or did
// not answer: an in-band refusal releases the placement and retries once
// elsewhere; a misdirected request (our replica named the wrong owner)
// retries once through the leader; an owner that could not be reached is a
// 503 + Retry-After until its lease lapses and the id can move; a request
// sent and then left without an answer is a 504 (it may have run), never
// sent again (classifyUnanswered).
func (f *FrontDoor) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	info, _ := r.Context().Value(fwdCtxKey{}).(*fwdInfo)
	f.forwardError(w, info, err)
}

// forwardError is forwardFailed for the request info describes.
func (f *FrontDoor) forwardError(w http.ResponseWriter, info *fwdInfo, err error) {
	if errors.Is(err, errHandedOff) {
		return
	}
	if info == nil {
		httpx.WriteError(w, http.StatusBadGateway, "forwarding failed", 0)
		return
	}
	var ref *refusedError
	if errors.As(err, &ref) {
		_ = ref.resp.Body.Close()
		rt := info.rt
		if ref.marker != plugins.RefusalNotOwner {
			f.forwardFailures.WithLabelValues(outcomeRefused).Inc()
			ctx, cancel := context.WithTimeout(info.orig.Context(), claimTimeout)
			_, _ = f.cfg.Dir.Do(ctx, directory.Release{Key: info.p.Key, ClientID: info.p.Owner, Generation: info.p.Generation})
			cancel()
			rt.exclude = info.p.Owner
		} else {
			f.forwardFailures.WithLabelValues(outcomeMisdirected).Inc()
			rt.viaLeader = true
		}
		if rt.attempt == 0 && rt.retryable {
			rt.attempt++
			f.route(w, info.orig, rt)
			return
		}
		if ref.marker != plugins.RefusalNotOwner {
			httpx.WriteError(w, http.StatusServiceUnavailable, "owner refused: "+ref.marker, time.Second)
		} else {
			httpx.WriteError(w, http.StatusServiceUnavailable, "placement moved, retry", time.Second)
		}
		return
	}
	if info.orig.Context().Err() != nil {
		f.forwardFailures.WithLabelValues(outcomeCanceled).Inc()
		return
	}
	u := classifyUnanswered(err)
	f.forwardFailures.WithLabelValues(u.Outcome).Inc()
	f.cfg.Logger.Warn("owner did not answer", "outcome", u.Outcome, "owner", info.owner.ClientID, "advertise_url", info.owner.AdvertiseURL, "key", info.p.Key.String(), "err", err)
	u.Write(w)
}

// ownerUnreachableMsg is the error of the 503 for a request that never reached its owner.
const ownerUnreachableMsg = "owner unreachable, retry"

// classifyUnanswered is the front door's one rule for a forwarded request its owner did not
// answer, on every path that forwards (forwardWire, the ReverseProxy's error handler, the
// kept-alive loop's Done): 503 + Retry-After only when nothing reached the owner (it certainly
// did not run); 504 "may have run" when it was sent and the connection was cut or timed out
// (httpx.ClassifyUnanswered).
func classifyUnanswered(err error) httpx.Unanswered {
	return httpx.ClassifyUnanswered(err, ownerUnreachableMsg)
}

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
	if gen, live := f.cfg.Local.LiveGeneration(ns, id); live && gen > att.Generation {
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
