package pinboard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// The forwarder: a request for an id placed on another node's worker goes
// to that node's owner-side route, attested. Whatever carries it — net/http
// writing the head itself (forwardWire, the common case), ReverseProxy (an
// Upgrade, a streamed or large upload, a custom Transport) or the kept-alive
// loop (Route, a connection's next requests) — the same three rules apply:
//
//   - peerHop says what is sent (httpx.Hop: fields, X-Forwarded-*, the
//     attestation);
//   - plugins.ClassifyAnswer reads the owner's answer (served, refused
//     in-band, misdirected), and httpx.ClassifyUnanswered a request it did
//     not answer (unreachable: 503, it did not run; cut: 504, it may have);
//   - endForward books how the forward ended.

// peerHop is the hop of a request to the owner's node: the client's fields
// under httpx.Hop's rule, and the attestation.
func peerHop(remoteAddr, host string, tls bool, att string) httpx.Hop {
	return httpx.Hop{RemoteAddr: remoteAddr, Host: host, TLS: tls, Set: []httpx.Field{{Name: AttestationHeader, Value: att}}}
}

// endForward books one forward's end, whatever carried it: a resolution to
// another node, its duration and, if it failed, how (failure, a
// pinboard_forward_failures_total outcome; "" if it was answered).
func (f *FrontDoor) endForward(start time.Time, failure string) {
	f.resolvedForwarded.Inc()
	f.forwardSeconds.Observe(time.Since(start).Seconds())
	if failure != "" {
		f.forwardFailures.WithLabelValues(failure).Inc()
	}
}

// refusedError is an owner's in-band refusal (AnswerRefused,
// AnswerMisdirected), seen by the proxy's error handler.
type refusedError struct {
	answer plugins.Answer
	marker string
	resp   *http.Response
}

func (e *refusedError) Error() string { return "owner refused: " + e.marker }

type fwdCtxKey struct{}

// fwdInfo is one forward under way in net/http.
type fwdInfo struct {
	rt      *route
	w       http.ResponseWriter
	orig    *http.Request
	p       directory.Placement
	owner   directory.Worker
	hop     httpx.Hop
	failure string // how it failed, for endForward
}

// forward carries r to the owner's attested owner-side route.
func (f *FrontDoor) forward(w http.ResponseWriter, r *http.Request, rt *route, p directory.Placement, owner directory.Worker) {
	info := &fwdInfo{rt: rt, w: w, orig: r, p: p, owner: owner}
	defer func(start time.Time) { f.endForward(start, info.failure) }(time.Now())
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
	info.hop = peerHop(r.RemoteAddr, r.Host, r.TLS != nil, att)
	basePath := strings.TrimSuffix(base.Path, "/")
	if f.fastForwardable(r, rt, base.Scheme) && f.forwardWire(w, r, info, base.Host, basePath+signed) {
		return
	}
	ctx := context.WithValue(r.Context(), fwdCtxKey{}, info)
	out := rt.withBody(r).Clone(ctx)
	out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host, Path: basePath + path, RawQuery: r.URL.RawQuery}
	if unescaped, err := url.PathUnescape(out.URL.Path); err == nil && unescaped != out.URL.Path {
		out.URL.RawPath = out.URL.Path
		out.URL.Path = unescaped
	}
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
			if info, _ := pr.In.Context().Value(fwdCtxKey{}).(*fwdInfo); info != nil {
				info.hop.Rewrite(pr.Out.Header, pr.In.Header)
				return
			}
			hop := httpx.Hop{RemoteAddr: pr.In.RemoteAddr, Host: pr.In.Host, TLS: pr.In.TLS != nil}
			hop.Rewrite(pr.Out.Header, pr.In.Header)
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
	m := resp.Header.Get(RefusalHeader)
	switch a := plugins.ClassifyAnswer(resp.StatusCode, m); a {
	case plugins.AnswerRefused, plugins.AnswerMisdirected:
		return &refusedError{answer: a, marker: m, resp: resp}
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
		info.failure = outcomeCanceled
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
		if ref.answer == plugins.AnswerRefused {
			info.failure = outcomeRefused
			ctx, cancel := context.WithTimeout(info.orig.Context(), claimTimeout)
			_, _ = f.cfg.Dir.Do(ctx, directory.Release{Key: info.p.Key, ClientID: info.p.Owner, Generation: info.p.Generation})
			cancel()
			rt.exclude = info.p.Owner
		} else {
			info.failure = outcomeMisdirected
			rt.viaLeader = true
		}
		if rt.attempt == 0 && rt.retryable {
			rt.attempt++
			f.route(w, info.orig, rt)
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
		return
	}
	u := classifyUnanswered(err)
	info.failure = u.Outcome
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

var wireBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// fastForwardable reports whether forwardWire can carry r to an owner
// reached with scheme: no body or a buffered one, no Upgrade, plain http,
// the front door's own transport.
func (f *FrontDoor) fastForwardable(r *http.Request, rt *route, scheme string) bool {
	return f.sync != nil && scheme == "http" && rt.retryable && len(rt.body) <= httpx.SyncBodyLimit &&
		r.Header["Upgrade"] == nil &&
		// ReverseProxy re-encodes a query holding ';' or a bad escape;
		// leave those to it.
		cleanQuery(r.URL.RawQuery)
}

// cleanQuery reports whether ReverseProxy would pass q unchanged: no ';'
// and every '%' starting a valid escape.
func cleanQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return false
			}
			i += 2
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// stripHopByHop drops the response's hop-by-hop fields, as ReverseProxy
// does.
func stripHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				h.Del(t)
			}
		}
	}
	for k := range httpx.HopByHop {
		delete(h, k)
	}
}

// forwardWire carries r to the owner at addr (host:port) on target (the
// escaped request target) and answers w, as the proxy would, without
// httputil.ReverseProxy: the request head written straight from the
// inbound request (no Request or Header clones), the response head read
// on this goroutine (httpx.SyncTransport.RoundTripHead). It reports false,
// having sent nothing, if a field cannot be written safely (ReverseProxy
// then refuses or cleans it).
func (f *FrontDoor) forwardWire(w http.ResponseWriter, r *http.Request, info *fwdInfo, addr, target string) bool {
	hop := info.hop
	if hop.Host == "" {
		hop.Host = addr // as http.Request.Write does
	}
	bp := wireBufs.Get().(*[]byte)
	wire, ok := hop.AppendRequest((*bp)[:0], r.Method, target, httpx.HeaderFields(r.Header), info.rt.body)
	if !ok {
		*bp = wire[:0]
		wireBufs.Put(bp)
		return false
	}
	got1xx := func(code int, h http.Header) {
		dst := w.Header()
		for k, vs := range h {
			dst[k] = append(dst[k], vs...)
		}
		w.WriteHeader(code)
		clear(dst)
	}
	resp, err := f.sync.RoundTripHead(addr, r, wire, len(info.rt.body) == 0, got1xx)
	if cap(wire) <= 64<<10 {
		*bp = wire[:0]
		wireBufs.Put(bp)
	}
	if err != nil {
		f.forwardError(w, info, err)
		return true
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Nothing asked to switch.
		_ = resp.Body.Close()
		f.forwardError(w, info, errors.New("owner switched protocols unasked"))
		return true
	}
	stripHopByHop(resp.Header)
	if err := f.checkResponse(info, resp); err != nil {
		_ = resp.Body.Close()
		f.forwardError(w, info, err)
		return true
	}
	dst := w.Header()
	for k, vs := range resp.Header {
		dst[k] = append(dst[k], vs...)
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	if err := f.copyBody(w, resp); err != nil {
		_ = resp.Body.Close()
		// What ReverseProxy does: the response is cut short, so the
		// client's connection must end too.
		panic(http.ErrAbortHandler)
	}
	_ = resp.Body.Close() // now, to read the trailers
	// An owner advertised by name stays with net/http: the loop does not
	// resolve names, so it would give every request back.
	if resp.ContentLength >= 0 && announced == 0 && len(resp.Trailer) == 0 && ipLiteral(addr) && f.adopt(w, r) {
		return true // the connection's next requests go to the kept-alive loop
	}
	if len(resp.Trailer) > 0 {
		// Chunked, so net/http does not compute a length for a short body.
		_ = http.NewResponseController(w).Flush()
	}
	if len(resp.Trailer) == announced {
		for k, vs := range resp.Trailer {
			dst[k] = append(dst[k], vs...)
		}
		return true
	}
	for k, vs := range resp.Trailer {
		for _, v := range vs {
			dst.Add(http.TrailerPrefix+k, v)
		}
	}
	return true
}

// copyBody copies the response body to w: a stream (unknown length, or
// server-sent events) flushed per write, the rest left to net/http's
// buffering, as ReverseProxy's FlushInterval 0 does.
func (f *FrontDoor) copyBody(w http.ResponseWriter, resp *http.Response) error {
	stream := resp.ContentLength == -1
	if !stream {
		const sse = "text/event-stream"
		if ct := strings.TrimLeft(resp.Header.Get("Content-Type"), " \t"); len(ct) >= len(sse) && strings.EqualFold(ct[:len(sse)], sse) {
			base, _, _ := mime.ParseMediaType(ct)
			stream = base == "text/event-stream"
		}
	}
	rc := http.NewResponseController(w)
	if stream {
		_ = rc.Flush()
	}
	buf := f.bufs.Get()
	defer f.bufs.Put(buf)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if stream {
				_ = rc.Flush()
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}
