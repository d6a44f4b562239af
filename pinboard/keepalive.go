package pinboard

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/plugins"
)

// Kept-alive forwarding: once a client connection has carried a forwarded
// request through net/http, the front door hands it to an event loop
// (relay.Conns) that forwards its next requests itself, as long as they
// are the plain case (Route); anything else goes back to net/http through
// net/http with the request unread (serveHandBacks).

// adopt hands r's connection to the kept-alive loop once its response
// (fixed length, now complete) was written to w. It reports whether it
// did; the handler must then return at once.
func (f *FrontDoor) adopt(w http.ResponseWriter, r *http.Request) bool {
	if !f.keepAliveOn.Load() || !relay.Supported || f.stopping.Load() || f.cfg.AccessLog ||
		r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.TLS != nil || r.Close {
		return false
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return false
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		return false
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending, _ = brw.Reader.Peek(n)
	}
	if err := f.conns.Adopt(conn, pending); err != nil {
		// The response went out whole; the client reconnects.
		f.cfg.Logger.Debug("kept-alive loop refused a connection; closed it", "err", err)
	}
	return true
}

// serveAdopting runs serve, then hands r's connection to the kept-alive
// loop if the response went out whole with a declared length and bodyRead
// says none of r's body is left unread: the connection's next requests
// are the loop's.
func (f *FrontDoor) serveAdopting(w http.ResponseWriter, r *http.Request, bodyRead func() bool, serve func(http.ResponseWriter)) {
	if !f.keepAliveOn.Load() || f.cfg.AccessLog {
		serve(w)
		return
	}
	lw := &lengthWriter{ResponseWriter: w}
	serve(lw)
	if lw.complete(r.Method) && bodyRead() {
		f.adopt(w, r)
	}
}

// lengthWriter counts a response's final status and body bytes: the
// access log reports them, and complete tells whether a response went out
// whole with a declared length, so its connection can be adopted after it.
type lengthWriter struct {
	http.ResponseWriter
	code    int
	written int64
}

func (w *lengthWriter) WriteHeader(code int) {
	if w.code < 200 { // the final status, not a 1xx before it
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *lengthWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.written += int64(n)
	return n, err
}

func (w *lengthWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// complete: a final response whose Content-Length was all written (none
// for HEAD).
func (w *lengthWriter) complete(method string) bool {
	if w.code < 200 || w.code == http.StatusSwitchingProtocols {
		return false
	}
	cl := w.Header().Get("Content-Length")
	n, err := strconv.ParseInt(cl, 10, 64)
	return err == nil && (n == w.written || method == http.MethodHead && w.written == 0)
}

// eofBody notes whether a request body was read to its end (what is left
// unread would be taken for the next request).
type eofBody struct {
	io.ReadCloser
	eof bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// fastPathChars: the path bytes the loop passes through as they are; a
// path with anything else (escapes included) goes to net/http, whose
// escaping rules the forward follows.
var fastPathChars = func() (t [256]bool) {
	for _, c := range []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/:@=+!$&'()*,") {
		t[c] = true
	}
	return t
}()

// Route is the kept-alive loop's router: a request for an id placed on a
// live worker of another node, with a plain path and query, is forwarded
// as forward would (same attestation, same fields); anything else goes back
// to net/http.
func (f *FrontDoor) Route(h *relay.ReqHead) (relay.Forward, bool) {
	if f.stopping.Load() {
		return relay.Forward{}, false
	}
	path, query, _ := strings.Cut(h.Target, "?")
	for i := 0; i < len(path); i++ {
		if !fastPathChars[path[i]] {
			return relay.Forward{}, false
		}
	}
	if !cleanQuery(query) {
		return relay.Forward{}, false
	}
	if owned, ok := strings.CutPrefix(path, ownerRoutePrefix); ok {
		return f.routeOwned(h, owned, query)
	}
	if !isInstancePath(path) {
		return relay.Forward{}, false
	}
	ns, id, rest, err := parseInstancePath(path)
	if err != nil {
		return relay.Forward{}, false
	}
	for _, fl := range h.Fields {
		if strings.EqualFold(fl.Name, plugins.HeaderClusterCall) {
			return relay.Forward{}, false // net/http checks and strips it
		}
	}
	key := directory.Key{Namespace: ns, ID: id}
	self, now := f.selfID(), time.Now()
	if self != "" && f.cfg.Local != nil {
		if gen, live := f.cfg.Local.LiveGeneration(ns, id); live {
			return f.routeLocal(h, ns, id, gen, rest, query, now)
		}
	}
	if f.sync == nil {
		return relay.Forward{}, false // forwards go through the Transport the front door was given
	}
	m := f.cfg.Dir.Machine()
	p, owner, ok := m.Owner(key)
	if !ok || !owner.Live(now.UnixMilli()) || p.Owner == self {
		return relay.Forward{}, false
	}
	secret := m.Secret()
	base := f.ownerBase(owner.AdvertiseURL)
	if len(secret) == 0 || base.host == "" {
		return relay.Forward{}, false
	}
	_, signed, att := f.attestFor(secret, p, owner, h.Method, rest, query, now)
	f.resolvedForwarded.Inc()
	start := now
	wire := relay.WireBuffer()
	*wire = appendLoopHead(*wire, h, base.path+signed, att)
	return relay.Forward{
		Addr:    base.host,
		Wire:    *wire,
		Refusal: RefusalHeader,
		Done: func(status int, err error) {
			relay.ReleaseWire(wire)
			if status == 0 && err == nil {
				return // given back to net/http, which forwards it again
			}
			f.forwardSeconds.Observe(time.Since(start).Seconds())
			switch {
			case err == nil:
			case errors.Is(err, relay.ErrClientGone):
				f.forwardFailures.WithLabelValues(outcomeCanceled).Inc()
			default:
				f.forwardFailures.WithLabelValues(classifyUnanswered(err).Outcome).Inc()
			}
		},
	}, true
}

// routeLocal is Route for an id live on this node, as route's first case
// serves it: while the lease allows, straight to the plugin.
func (f *FrontDoor) routeLocal(h *relay.ReqHead, ns, id string, gen uint64, rest, query string, now time.Time) (relay.Forward, bool) {
	if lease := f.cfg.Worker.Lease(now); lease != LeaseHealthy && lease != LeaseUnhealthy {
		return relay.Forward{}, false // net/http refuses it
	}
	fwd, ok := f.cfg.Local.Relay(ns, id, gen, h, withQuery(rest, query), false)
	if ok {
		f.resolvedLocal.Inc()
	}
	return fwd, ok
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
	// Only live instances come here, so an unhealthy lease serves too
	// (serveLocal's rule); an expired one is net/http's to refuse.
	if lease := f.cfg.Worker.Lease(now); lease != LeaseHealthy && lease != LeaseUnhealthy {
		return relay.Forward{}, false
	}
	att, err := f.checkOwned(header, h.Method, h.Target, now)
	if err != nil {
		return relay.Forward{}, false // net/http refuses it, and counts why
	}
	fwd, ok := f.cfg.Local.Relay(ns, id, att.Generation, h, withQuery(rest, query), true)
	if !ok {
		return relay.Forward{}, false
	}
	if err := f.verifier.Spend(att, now); err != nil {
		fwd.Done(0, nil)
		return relay.Forward{}, false // a replay: net/http refuses it
	}
	return fwd, true
}

// loopBase is an owner's advertise URL as the loop uses it: host (an IP
// and a port) and path prefix; host "" if the loop cannot use it (not
// plain http, or a name it would have to resolve).
type loopBase struct{ host, path string }

// ownerBase parses an advertise URL once; workers are few and their URLs
// stable, so the cache stays small.
func (f *FrontDoor) ownerBase(advertise string) loopBase {
	if b, ok := f.loopBases.Load(advertise); ok {
		return b.(loopBase)
	}
	var b loopBase
	if u, err := url.Parse(advertise); err == nil && u.Scheme == "http" && ipLiteral(u.Host) {
		b = loopBase{host: u.Host, path: strings.TrimSuffix(u.Path, "/")}
	}
	f.loopBases.Store(advertise, b)
	return b
}

// appendLoopHead writes the forwarded request as appendHead does for one
// net/http read: hop-by-hop and forwarding fields dropped, X-Forwarded-*
// and the attestation set, a length for every body.
func appendLoopHead(dst []byte, h *relay.ReqHead, target, att string) []byte {
	dst = httpx.AppendRequestLine(dst, h.Method, target, h.Host)
	trailers := false
	for _, fl := range h.Fields {
		k := http.CanonicalHeaderKey(fl.Name)
		if k == "Te" {
			trailers = trailers || httpx.TokenListHas(fl.Value, "trailers")
			continue
		}
		if !httpx.HopByHop[k] && !notForwarded[k] {
			dst = httpx.AppendField(dst, fl.Name, fl.Value)
		}
	}
	return appendForwarding(dst, h.Method, h.RemoteAddr, h.Host, false, trailers, att, h.Body)
}

// ipLiteral: addr is an IP address and a port.
func ipLiteral(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && net.ParseIP(host) != nil
}
