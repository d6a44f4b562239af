package frontdoor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/logrepeat"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/prometheus/client_golang/prometheus"
)

// ownerHeaderTimeout bounds the wait for a forwarded request's response
// headers (activation included: the supervisor bounds that at 30 s, but an
// activation restoring state normally takes milliseconds).
const ownerHeaderTimeout = 10 * time.Second

// headWait is how long a forward waits for its owner's response head:
// ownerHeaderTimeout, or less when the owner's lease (as this replica
// knows it) lapses sooner. A frozen or cut-off owner stops renewing it, and
// once it lapses the id can be placed again: holding the client past that
// only keeps it from the id's next owner, so it gets its 504 (the request
// may have run) then. A live owner renews its lease a TTL ahead with every
// heartbeat, so only a head slower than about a TTL is cut short; the
// floor keeps a lease about to be renewed from cutting a request at once.
func headWait(owner directory.Worker, now time.Time) time.Duration {
	left := time.Duration(owner.LeaseExpiry-now.UnixMilli())*time.Millisecond + leaseLapseGrace
	return min(ownerHeaderTimeout, max(left, minHeadWait))
}

const (
	// leaseLapseGrace: past the lease's expiry, so that a claim elsewhere
	// can succeed by the time the client retries.
	leaseLapseGrace = 250 * time.Millisecond
	minHeadWait     = time.Second
)

// RefusalHeader marks a 503 refused by the owner's worker in-band (lease
// unhealthy, draining): the front door may release the placement and retry
// elsewhere.
const RefusalHeader = plugins.HeaderRefusal

// forwarder carries a request for an id placed on another node's worker
// to that node's owner-side route, attested. In net/http a carrier sends
// it (the wire carrier writing the head itself, the common case, or
// net/http's Transport: an Upgrade, a streamed or large upload, a custom
// Transport) and writeAnswer writes the owner's answer back; the
// kept-alive loop carries a connection's next requests (routeForward).
// Whatever carries it, the same rules apply:
//
//   - peerHop says what is sent (httpx.Hop: fields, X-Forwarded-*, the
//     attestation);
//   - plugins.ClassifyAnswer reads the owner's answer (served, refused
//     in-band, misdirected), and httpx.ClassifyUnanswered a request it did
//     not answer (unreachable: 503, it did not run; cut: 504, it may have);
//   - endForward books how the forward ended.
//
// A response that stays open (a held stream) leaves net/http for the relay
// loop (holdStream).
type forwarder struct {
	dir    *pinboard.Directory // the cluster secret
	res    *resolver           // selfID; releaseRefused
	keep   *keptAlive          // a forwarded connection's next requests
	logger *slog.Logger
	// reroute is the router's way for a request (routeRequest), taken
	// again once after an in-band refusal.
	reroute func(http.ResponseWriter, *http.Request, *instanceRequest)

	peer peerTransport // where an owner's node takes the hop (base)
	wire wireCarrier   // the common case; its sync is nil with a supplied Transport
	std  stdCarrier    // everything else
	sync *httpx.SyncTransport
	bufs httpx.BufferPool
	held *relay.Loop // held streams, out of net/http
	// upgradeIdle closes an upgraded (101) connection that moved nothing
	// either way for this long (0: never).
	upgradeIdle time.Duration
	bases       sync.Map // advertise URL -> loopBase (ownerBase)

	forwarded prometheus.Counter // resolutions{outcome=forwarded}
	failures  *prometheus.CounterVec
	seconds   prometheus.Histogram
	relayEnds *prometheus.CounterVec
	warnings  *logrepeat.Repeats // WARNs that repeat while an owner is down
}

func newForwarder(dir *pinboard.Directory, res *resolver, keep *keptAlive, peer peerTransport, logger *slog.Logger,
	reroute func(http.ResponseWriter, *http.Request, *instanceRequest)) *forwarder {
	fw := &forwarder{
		dir: dir, res: res, keep: keep, logger: logger, reroute: reroute,
		peer: peer, held: relay.New(logger), warnings: logrepeat.New(logrepeat.Window),
		forwarded: res.counter(outcomeForwarded),
		failures: newCounterVec("pinboard_forward_failures_total",
			"Requests this front door could not complete at the owner, by outcome.", "outcome", forwardOutcomes),
		relayEnds: newCounterVec("pinboard_relayed_streams_ended_total",
			"Held forwarded streams the relay loop carried, by how they ended.", "reason", relayEndReasons),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pinboard_forward_duration_seconds",
			Help: "Requests this front door forwarded to their owner's node (the node-to-node hop and the owner's work), " +
				"from the forward's start until the response ended here or, for a held stream, went to the relay loop.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60},
		}),
	}
	fw.wire, fw.std = wireCarrier{sync: peer.sync}, stdCarrier{rt: peer.rt}
	return fw
}

// collectors are the forwarder's metrics, for the registry.
func (fw *forwarder) collectors() []prometheus.Collector {
	return []prometheus.Collector{fw.failures, fw.relayEnds, fw.seconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinboard_relayed_streams", Help: "Held forwarded streams the relay loop carries now.",
		}, func() float64 { return float64(fw.held.Len()) }),
	}
}

// close ends the held streams and stops the relay loop.
func (fw *forwarder) close() error { return fw.held.Close() }

// peerTransport carries node-to-node requests: the forwarder's and the
// front door's own calls (stats, wind-down, wake), and says where each
// node takes them (base).
type peerTransport struct {
	rt     http.RoundTripper
	sync   *httpx.SyncTransport // the default transport's head-writing side; nil with a supplied one
	client *http.Client
	// With the cluster's mutual TLS, a member node's peer routes are on
	// its cluster port (addr, by node id), reached with tls.
	addr func(nodeID string) (string, bool)
	tls  *tls.Config
}

// newPeerTransport is tr, or (nil) an http.Transport and the SyncTransport
// over it, over TLS with tlsCfg (nil: plain http). Without the cluster's
// TLS, an https advertise URL is verified with roots (nil: the system's).
func newPeerTransport(tr http.RoundTripper, tlsCfg *tls.Config, roots *x509.CertPool, addr func(string) (string, bool)) peerTransport {
	if tr != nil {
		return peerTransport{rt: tr, client: &http.Client{Transport: tr}, addr: addr, tls: tlsCfg}
	}
	stdTLS := tlsCfg
	if stdTLS == nil && roots != nil {
		stdTLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	std := &http.Transport{
		Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, TLSClientConfig: stdTLS,
		DialContext: (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		// An owner that accepts the connection but never answers (a
		// frozen process) must not hold the client forever: after
		// this the client gets 503 + Retry-After and retries, by which
		// time the owner's lease may have lapsed and the id moved.
		ResponseHeaderTimeout: ownerHeaderTimeout,
	}
	st := &httpx.SyncTransport{TLS: tlsCfg, Fallback: std, ResponseHeaderTimeout: ownerHeaderTimeout}
	return peerTransport{rt: st, sync: st, client: &http.Client{Transport: std}, addr: addr, tls: tlsCfg}
}

// Secure: node-to-node requests run over the cluster's mutual TLS, and
// the peer routes are served only on the cluster port.
func (p peerTransport) Secure() bool { return p.tls != nil }

// Base is the URL (no trailing slash) under which w's node serves the
// peer routes: with mutual TLS, a member's cluster port; otherwise, or for
// a worker that is no member (an outside worker, which checks the
// attestation itself), its advertise URL.
func (p peerTransport) Base(w directory.Worker) string {
	if addr, ok := p.clusterAddr(w); ok {
		return "https://" + addr
	}
	return strings.TrimRight(w.AdvertiseURL, "/")
}

// overTLS: w's node is reached on its cluster port, over TLS.
func (p peerTransport) overTLS(w directory.Worker) bool {
	_, ok := p.clusterAddr(w)
	return ok
}

func (p peerTransport) clusterAddr(w directory.Worker) (string, bool) {
	if p.tls == nil || w.NodeID == "" {
		return "", false
	}
	return p.addr(w.NodeID)
}

// close closes the pooled connections, if the pools are ours (not a
// supplied Transport's).
func (p peerTransport) close() {
	if p.sync != nil {
		p.sync.Close()
		p.client.CloseIdleConnections()
	}
}

// peerHop is the hop of a request to the owner's node: the client's fields
// under httpx.Hop's rule, and the attestation.
func peerHop(remoteAddr, host string, tls bool, att string) httpx.Hop {
	return httpx.Hop{RemoteAddr: remoteAddr, Host: host, TLS: tls, Set: []httpx.Field{{Name: pinboard.AttestationHeader, Value: att}}}
}

// endForward books one forward's end, whatever carried it: a resolution to
// another node, its duration and, if it failed, how (failure, a
// pinboard_forward_failures_total outcome; "" if it was answered).
func (fw *forwarder) endForward(start time.Time, failure string) {
	fw.forwarded.Inc()
	fw.seconds.Observe(time.Since(start).Seconds())
	if failure != "" {
		fw.failures.WithLabelValues(failure).Inc()
	}
}

// refusedError is an owner's in-band refusal (AnswerRefused,
// AnswerMisdirected), for forwardError.
type refusedError struct {
	answer plugins.Answer
	marker string
	resp   *http.Response
}

func (e *refusedError) Error() string { return "owner refused: " + e.marker }

// fwdInfo is one forward under way in net/http.
type fwdInfo struct {
	rq      *instanceRequest
	w       http.ResponseWriter
	orig    *http.Request
	p       directory.Placement
	owner   directory.Worker
	hop     httpx.Hop
	wire    bool   // the wire carrier took it
	failure string // how it failed, for endForward
}

// forward carries r to the owner's attested owner-side route, by the
// carrier that can take it, and writes the owner's answer back
// (writeAnswer) or its failure (forwardError).
func (fw *forwarder) forward(w http.ResponseWriter, r *http.Request, rq *instanceRequest, p directory.Placement, owner directory.Worker) {
	info := &fwdInfo{rq: rq, w: w, orig: r, p: p, owner: owner}
	defer func(start time.Time) { fw.endForward(start, info.failure) }(time.Now())
	secret := fw.dir.Machine().Secret()
	if len(secret) == 0 {
		httpx.WriteError(w, http.StatusServiceUnavailable, "cluster secret not replicated yet", time.Second)
		return
	}
	base, err := url.Parse(fw.peer.Base(owner))
	if err != nil {
		httpx.WriteError(w, http.StatusBadGateway, "owner has an invalid advertise URL", 0)
		return
	}
	path, _, att := fw.attestFor(secret, p, owner, r.Method, rq.rest, r.URL.RawQuery, time.Now())
	info.hop = peerHop(r.RemoteAddr, r.Host, r.TLS != nil, att)
	out := outbound{r: r, body: rq.body, hop: info.hop, scheme: base.Scheme, addr: base.Host,
		path: strings.TrimSuffix(base.Path, "/") + path, got1xx: got1xx(w)}
	// Whichever carrier takes it, the head's wait ends with the owner's
	// lease (headWait).
	out.r = r.WithContext(httpx.WithHeadTimeout(r.Context(), headWait(owner, time.Now())))
	if !rq.retryable {
		out.body = nil
	}
	var resp *http.Response
	if fw.fastForwardable(r, rq, base.Scheme) {
		resp, err = fw.wire.roundTrip(out)
		info.wire = !errors.Is(err, errNotWire)
	}
	if !info.wire {
		resp, err = fw.std.roundTrip(out)
	}
	if err == nil {
		err = fw.writeAnswer(w, r, info, resp)
	}
	if err != nil {
		fw.forwardError(w, info, err)
	}
}

// attestFor is the owner-side route of p's instance path rest (escaped), the
// same with query (what is signed), and the attestation that lets owner
// serve it.
func (fw *forwarder) attestFor(secret []byte, p directory.Placement, owner directory.Worker, method, rest, query string, now time.Time) (path, signed, att string) {
	path = ownerPath(ownerRoutePrefix, p.Key) + rest
	signed = withQuery(path, query)
	return path, signed, pinboard.SignFor(secret, owner.SessionID, pinboard.Attestation{Target: owner.ClientID, Caller: fw.res.self.ID(), Generation: p.Generation, At: now}, method, signed)
}

// checkResponse sees the owner's response head first: an in-band refusal
// becomes a refusedError, a held stream goes to the relay loop (errHeld);
// nil lets the response through.
func (fw *forwarder) checkResponse(info *fwdInfo, resp *http.Response) error {
	m := resp.Header.Get(RefusalHeader)
	switch a := plugins.ClassifyAnswer(resp.StatusCode, m); a {
	case plugins.AnswerRefused, plugins.AnswerMisdirected:
		return &refusedError{answer: a, marker: m, resp: resp}
	}
	if info != nil && fw.holdStream(info, resp) {
		return errHeld
	}
	return nil
}

// errHeld: the response went to the relay loop as a held stream; the
// forward is done.
var errHeld = errors.New("held stream went to the relay loop")

// isHeldStream reports whether resp, answering in, may stay open for as long
// as its client likes (server-sent events, a long poll: a body of unknown
// length) and the relay loop (where this platform has one: keptAlive.holds)
// can carry it: HTTP/1.1 both ways, in plain text. 101 responses never get here (ReverseProxy passes Upgrades through
// as they are), nor do bodies of known length.
func isHeldStream(in *http.Request, resp *http.Response) bool {
	return in.ProtoMajor == 1 && in.ProtoMinor == 1 && in.TLS == nil && in.Method != http.MethodHead &&
		resp.ProtoAtLeast(1, 1) && resp.ContentLength < 0 &&
		resp.StatusCode >= 200 && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
}

// holdStream takes a held stream out of net/http and gives it to the
// relay loop, and reports whether it did (the client connection is then
// gone from net/http, and the forward must not touch w). The loop keeps two
// descriptors and a small record per stream where net/http would keep two
// goroutines. A chunked body that already ended in
// the bytes read with its head is no held stream: writeAnswer copies it and
// both connections stay alive.
func (fw *forwarder) holdStream(info *fwdInfo, resp *http.Response) bool {
	if !fw.keep.holds || !isHeldStream(info.orig, resp) || fw.peer.overTLS(info.owner) {
		// The relay loop reads raw descriptors: a stream from an owner
		// over TLS stays in net/http.
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
		info.failure = outcomeCanceled
		return true
	}
	noteRelayed(info.orig, resp.StatusCode)
	if err := fw.held.Add(relay.Stream{
		Client: conn, Upstream: up, Head: relay.Head(resp, header), Body: body, Chunked: chunked,
		Done: fw.relayEnded,
	}); err != nil {
		fw.relayEnds.WithLabelValues(relayEndRefused).Inc()
		fw.logger.Debug("relay refused a held stream; closed it", "instance", info.p.Key.String(), "err", err)
	}
	return true
}

// relayEnded counts a relayed stream's end (on the relay loop's goroutine).
func (fw *forwarder) relayEnded(r relay.Reason) {
	fw.relayEnds.WithLabelValues(r.String()).Inc()
}

// forwardError handles an owner that could not be reached, refused or
// did not answer, whichever carrier tried: an in-band refusal releases the
// placement and retries once elsewhere; a misdirected request (our replica
// named the wrong owner) retries once through the leader; an owner that
// could not be reached is a 503 + Retry-After until its lease lapses and
// the id can move; a request sent and then left without an answer is a
// 504 (it may have run), never sent again (classifyUnanswered).
func (fw *forwarder) forwardError(w http.ResponseWriter, info *fwdInfo, err error) {
	if errors.Is(err, errHeld) {
		return
	}
	if info == nil {
		httpx.WriteError(w, http.StatusBadGateway, "forwarding failed", 0)
		return
	}
	var ref *refusedError
	if errors.As(err, &ref) {
		_ = ref.resp.Body.Close()
		rq := info.rq
		if ref.answer == plugins.AnswerRefused {
			info.failure = outcomeRefused
			fw.res.releaseRefused(info.orig.Context(), info.p)
			rq.exclude = info.p.Owner
		} else {
			info.failure = outcomeMisdirected
			rq.viaLeader = true
		}
		if rq.attempt == 0 && rq.retryable {
			rq.attempt++
			fw.reroute(w, info.orig, rq)
			return
		}
		if ref.answer == plugins.AnswerRefused {
			httpx.WriteError(w, http.StatusServiceUnavailable, "owner refused: "+ref.marker, time.Second)
		} else {
			httpx.WriteError(w, http.StatusServiceUnavailable, "placement moved, retry", time.Second)
		}
		return
	}
	if info.orig.Context().Err() != nil {
		info.failure = outcomeCanceled
		httpx.Abandon()
	}
	u := classifyUnanswered(err)
	info.failure = u.Outcome
	if u.Outcome != outcomeTooLarge { // the client's body, not the owner
		fw.ownerDidNotAnswer(u.Outcome, info.owner, info.p.Key, err)
	}
	u.Write(w)
}

// ownerDidNotAnswer logs a forward its owner did not answer, whichever
// path carried it: one line per owner node and outcome per window, with
// the count of those held back (an owner that is down fails every request
// sent to it until its lease lapses).
func (fw *forwarder) ownerDidNotAnswer(outcome string, owner directory.Worker, key directory.Key, err error) {
	fw.warnings.Log(context.Background(), fw.logger, slog.LevelWarn, owner.NodeID+"\x00"+owner.ClientID+"\x00"+outcome,
		"owner did not answer", "outcome", outcome, "owner", owner.ClientID, "node", owner.NodeID, "url", fw.peer.Base(owner), "instance", key.String(), "err", err)
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

// fastForwardable reports whether the wire carrier can take r to an
// owner reached with scheme: no body or a buffered one, no Upgrade, the
// front door's own transport.
func (fw *forwarder) fastForwardable(r *http.Request, rq *instanceRequest, scheme string) bool {
	return fw.peer.sync != nil && scheme == fw.peer.sync.Scheme() && rq.retryable && len(rq.body) <= httpx.SyncBodyLimit &&
		r.Header["Upgrade"] == nil &&
		// A query holding ';' or a bad escape is re-encoded (the
		// std carrier).
		cleanQuery(r.URL.RawQuery)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// routeForward is routeLoop for an id placed on p's owner, a live worker of
// another node: the request as forward sends it (the same attestation and
// fields, by peerHop), carried by the loop, booked by endForward once the
// owner answered or failed. It reports false when the loop cannot carry
// it (a supplied Transport, an owner advertised by name, no cluster secret
// yet).
func (fw *forwarder) routeForward(h *relay.ReqHead, p directory.Placement, owner directory.Worker, rest, query string, now time.Time) (relay.Forward, bool) {
	if fw.peer.sync == nil {
		return relay.Forward{}, false // forwards go through the Transport the front door was given
	}
	secret := fw.dir.Machine().Secret()
	base := fw.ownerBase(owner)
	if len(secret) == 0 || base.host == "" {
		return relay.Forward{}, false
	}
	_, signed, att := fw.attestFor(secret, p, owner, h.Method, rest, query, now)
	hop := peerHop(h.RemoteAddr, h.Host, false, att)
	wire := relay.WireBuffer()
	*wire, _ = hop.AppendFields(*wire, h.Method, base.path+signed, h.Fields, h.Body) // the loop's parse admits no unsafe byte
	return relay.Forward{
		Addr:    base.host,
		TLS:     base.tls,
		Wire:    *wire,
		Refusal: RefusalHeader,
		Refused: ownerRefused,
		Timeout: headWait(owner, now),
		Done: func(status int, err error) {
			relay.ReleaseWire(wire)
			if status == 0 && err == nil {
				return // given back to net/http, which forwards it again and books it
			}
			failure := ""
			switch {
			case err == nil:
			case errors.Is(err, relay.ErrClientGone):
				failure = outcomeCanceled
			default:
				failure = classifyUnanswered(err).Outcome
				fw.ownerDidNotAnswer(failure, owner, p.Key, err) // the loop answered the client itself
			}
			fw.endForward(now, failure)
		},
	}, true
}

// ownerRefused: the owner ran nothing, and net/http must take the request
// again to release the placement or ask the leader (relay.Forward.Refused).
func ownerRefused(status int, marker string) bool {
	return plugins.ClassifyAnswer(status, marker) != plugins.AnswerServed
}

// loopBase is where the loop sends an owner's hop: host (an IP and a
// port), path prefix, and the TLS config for an owner reached over mutual
// TLS (nil: plain); host "" if the loop cannot use it (a name it would
// have to resolve). via is the cluster address it was made for ("" without
// mutual TLS).
type loopBase struct {
	host, path, via string
	tls             *tls.Config
}

// ownerBase is peerTransport.base for the loop, parsed once per worker;
// workers are few and their addresses stable, so the cache stays small.
func (fw *forwarder) ownerBase(owner directory.Worker) loopBase {
	via, _ := fw.peer.clusterAddr(owner)
	if b, ok := fw.bases.Load(owner.AdvertiseURL); ok && b.(loopBase).via == via {
		return b.(loopBase)
	}
	b := loopBase{via: via}
	if u, err := url.Parse(fw.peer.Base(owner)); err == nil && (u.Scheme == "http" || u.Scheme == "https") && ipLiteral(u.Host) {
		b.host, b.path = u.Host, strings.TrimSuffix(u.Path, "/")
		if u.Scheme == "https" {
			b.tls = fw.peer.tls
		}
	}
	fw.bases.Store(owner.AdvertiseURL, b)
	return b
}

// ipLiteral: addr is an IP address and a port.
func ipLiteral(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && net.ParseIP(host) != nil
}

// Client is the plain net/http client of node-to-node requests (the API's
// attested calls: stats, wind-down).
func (p peerTransport) Client() *http.Client { return p.client }
