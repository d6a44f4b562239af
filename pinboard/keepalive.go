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
	key, now := directory.Key{Namespace: ns, ID: id}, time.Now()
	if gen, live := f.liveHere(key); live {
		return f.routeLocal(h, key, gen, withQuery(rest, query), now)
	}
	if f.sync == nil {
		return relay.Forward{}, false // forwards go through the Transport the front door was given
	}
	p, owner, ok := f.placedOn(key, "", now)
	if !ok || p.Owner == f.selfID() {
		return relay.Forward{}, false
	}
	secret := f.cfg.Dir.Machine().Secret()
	base := f.ownerBase(owner.AdvertiseURL)
	if len(secret) == 0 || base.host == "" {
		return relay.Forward{}, false
	}
	_, signed, att := f.attestFor(secret, p, owner, h.Method, rest, query, now)
	hop := peerHop(h.RemoteAddr, h.Host, false, att)
	wire := relay.WireBuffer()
	*wire, _ = hop.AppendRequest(*wire, h.Method, base.path+signed, h.All(), h.Body) // the loop's parse admits no unsafe byte
	return relay.Forward{
		Addr:    base.host,
		Wire:    *wire,
		Refusal: RefusalHeader,
		Refused: ownerRefused,
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
			}
			f.endForward(now, failure)
		},
	}, true
}

// ownerRefused: the owner ran nothing, and net/http must take the request
// again to release the placement or ask the leader (relay.Forward.Refused).
func ownerRefused(status int, marker string) bool {
	return plugins.ClassifyAnswer(status, marker) != plugins.AnswerServed
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

// ipLiteral: addr is an IP address and a port.
func ipLiteral(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && net.ParseIP(host) != nil
}
