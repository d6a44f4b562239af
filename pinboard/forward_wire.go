package pinboard

import (
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// The forwarding hop's common case, without httputil.ReverseProxy: a
// request with no body or a buffered one, to a plain-http owner. The
// request head is written straight from the inbound request (no Request or
// Header clones, no sorting) and sent with the response head read on this
// goroutine (httpx.SyncTransport.RoundTripHead). What reaches the owner and
// the client is what ReverseProxy (newProxy) would send: hop-by-hop fields
// dropped both ways, X-Forwarded-For/-Host/-Proto set, trailers passed on,
// streams flushed per write. Anything else (Upgrades, streamed or large
// uploads, a custom Transport) takes ReverseProxy.

// notForwarded are request fields the forward sets itself, or that a
// client must not pass to the owner (ReverseProxy's Rewrite mode strips
// client-provided forwarding fields).
var notForwarded = map[string]bool{
	"Host": true, "Content-Length": true, "Expect": true, AttestationHeader: true,
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
}

var wireBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// fastForwardable reports whether forwardWire can carry r to base.
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

// appendHead writes the forwarded request's head and body to dst; ok is
// false if a field could not be written safely (ReverseProxy then refuses
// or cleans it as it always did).
func appendHead(dst []byte, r *http.Request, addr, target, att string, body []byte) ([]byte, bool) {
	host := r.Host
	if host == "" {
		host = addr // as http.Request.Write does
	}
	dst = httpx.AppendRequestLine(dst, r.Method, target, host)
	conn := r.Header["Connection"]
	for k, vs := range r.Header {
		if httpx.HopByHop[k] || notForwarded[k] || len(conn) > 0 && listedIn(conn, k) {
			continue
		}
		for _, v := range vs {
			if !safeField(k) || !safeField(v) {
				return dst, false
			}
			dst = httpx.AppendField(dst, k, v)
		}
	}
	trailers := false
	for _, v := range r.Header["Te"] {
		trailers = trailers || httpx.TokenListHas(v, "trailers")
	}
	dst = appendForwarding(dst, r.Method, r.RemoteAddr, r.Host, r.TLS != nil, trailers, att, body)
	return dst, safeField(host) && safeField(target)
}

// appendForwarding ends a forwarded request's head: Te: trailers if the
// client takes them, X-Forwarded-For (the client's address), -Host and
// -Proto, the attestation, the body's length, then the body.
func appendForwarding(dst []byte, method, remoteAddr, host string, tls, trailers bool, att string, body []byte) []byte {
	if trailers {
		dst = append(dst, "Te: trailers\r\n"...)
	}
	if ip, _, err := net.SplitHostPort(remoteAddr); err == nil {
		dst = append(dst, "X-Forwarded-For: "...)
		dst = append(dst, ip...)
		dst = append(dst, "\r\n"...)
	}
	dst = append(dst, "X-Forwarded-Host: "...)
	dst = append(dst, host...)
	if tls {
		dst = append(dst, "\r\nX-Forwarded-Proto: https\r\n"...)
	} else {
		dst = append(dst, "\r\nX-Forwarded-Proto: http\r\n"...)
	}
	dst = append(dst, AttestationHeader+": "...)
	dst = append(dst, att...)
	dst = append(dst, "\r\n"...)
	return httpx.AppendBody(dst, method, body)
}

// safeField: no byte that would end or split a header line.
func safeField(s string) bool {
	return strings.IndexByte(s, '\n') < 0 && strings.IndexByte(s, '\r') < 0 && strings.IndexByte(s, 0) < 0
}

// listedIn reports whether the Connection field values name k.
func listedIn(conn []string, k string) bool {
	for _, v := range conn {
		if httpx.TokenListHas(v, k) {
			return true
		}
	}
	return false
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
// escaped request target) and answers w, as the proxy would.
func (f *FrontDoor) forwardWire(w http.ResponseWriter, r *http.Request, info *fwdInfo, addr, target, att string) bool {
	bp := wireBufs.Get().(*[]byte)
	wire, ok := appendHead((*bp)[:0], r, addr, target, att, info.rt.body)
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
