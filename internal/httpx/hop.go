package httpx

import (
	"iter"
	"net"
	"net/http"
	"strings"
)

// Field is one header field.
type Field struct{ Name, Value string }

// Hop is the one rule for what a request carries across a forwarding hop
// (a front door to the owner's node, an owner to its plugin), on every
// transport: the request head written by hand (AppendRequest) and
// httputil.ReverseProxy's outbound request (Rewrite) alike.
//
//   - The sender's fields pass as they are, except hop-by-hop ones (and
//     those its Connection field names), the framing (Content-Length,
//     Expect, Host), the forwarding fields and every X-Pinned-* field:
//     pinnedd's own, which no sender may supply.
//   - Te: trailers passes if the sender takes trailers.
//   - X-Forwarded-For names the sender's address; from a trusted sender (a
//     peer node that attested the request) it extends the sender's own
//     chain, and its X-Forwarded-Host and -Proto pass on. Otherwise
//     X-Forwarded-Host is the request's Host and -Proto its scheme.
//   - Set follows: the fields the hop itself adds (the attestation; the
//     instance's fields for its plugin).
type Hop struct {
	RemoteAddr string // the sender's address, ip:port
	Host       string // the request's Host
	TLS        bool   // the request came over TLS
	Trusted    bool
	Set        []Field
}

// replaced are the fields a hop sets itself or never passes on.
var replaced = map[string]bool{
	"Host": true, "Content-Length": true, "Expect": true, "Forwarded": true,
	"X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
}

// Passes reports whether a sender's field (canonical name) passes as it is.
func Passes(name string) bool {
	return !HopByHop[name] && !replaced[name] && !strings.HasPrefix(name, "X-Pinned-")
}

// forwarding is the hop's X-Forwarded-For, -Host and -Proto, given the
// sender's (used only from a trusted sender).
func (h *Hop) forwarding(xff []string, xfh, xfp string) (forChain []string, host, proto string) {
	if !h.Trusted {
		xff, xfh, xfp = nil, "", ""
	}
	if ip, _, err := net.SplitHostPort(h.RemoteAddr); err == nil {
		xff = append(xff, ip)
	}
	host, proto = xfh, xfp
	if host == "" {
		host = h.Host
	}
	if proto == "" {
		proto = "http"
		if h.TLS {
			proto = "https"
		}
	}
	return xff, host, proto
}

// HeaderFields iterates an http.Header's fields.
func HeaderFields(h http.Header) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for k, vs := range h {
			for _, v := range vs {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// AppendRequest writes the forwarded request to dst: its request line
// (target is the escaped path with the query), Host, the sender's fields
// (names as sent) under the hop's rule, then a length for every body and
// the body. ok is false if a field cannot be written safely (a CR, LF or
// NUL in it); dst is then not a request.
func (h *Hop) AppendRequest(dst []byte, method, target string, fields iter.Seq2[string, string], body []byte) (_ []byte, ok bool) {
	var conn []string // what Connection fields name: hop-by-hop too
	for k, v := range fields {
		if len(k) == len("Connection") && strings.EqualFold(k, "Connection") {
			conn = append(conn, v)
		}
	}
	ok = safe(target) && safe(h.Host)
	dst = AppendRequestLine(dst, method, target, h.Host)
	var xff []string
	var xfh, xfp string
	trailers := false
	for k, v := range fields {
		name := http.CanonicalHeaderKey(k)
		switch name {
		case "X-Forwarded-For":
			xff = append(xff, v)
			continue
		case "X-Forwarded-Host":
			if xfh == "" {
				xfh = v
			}
			continue
		case "X-Forwarded-Proto":
			if xfp == "" {
				xfp = v
			}
			continue
		case "Te":
			trailers = trailers || TokenListHas(v, "trailers")
			continue
		}
		if !Passes(name) || listed(conn, name) {
			continue
		}
		ok = ok && safe(k) && safe(v)
		dst = AppendField(dst, k, v)
	}
	if trailers {
		dst = append(dst, "Te: trailers\r\n"...)
	}
	chain, host, proto := h.forwarding(xff, xfh, xfp)
	if len(chain) > 0 {
		dst = append(dst, "X-Forwarded-For: "...)
		for i, v := range chain {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = append(dst, v...)
		}
		dst = append(dst, "\r\n"...)
	}
	dst = AppendField(dst, "X-Forwarded-Host", host)
	dst = AppendField(dst, "X-Forwarded-Proto", proto)
	for _, f := range h.Set {
		dst = AppendField(dst, f.Name, f.Value)
	}
	return AppendBody(dst, method, body), ok && safe(host) && safe(proto)
}

// Rewrite applies the hop's rule to httputil.ReverseProxy's outbound
// header out (a copy of in, the sender's, that the proxy already stripped
// of hop-by-hop and forwarding fields; it keeps Te and an Upgrade's
// Connection and Upgrade).
func (h *Hop) Rewrite(out, in http.Header) {
	for k := range out {
		if !Passes(k) && !HopByHop[k] {
			delete(out, k)
		}
	}
	chain, host, proto := h.forwarding(in["X-Forwarded-For"], in.Get("X-Forwarded-Host"), in.Get("X-Forwarded-Proto"))
	if len(chain) > 0 {
		out.Set("X-Forwarded-For", strings.Join(chain, ", "))
	}
	out.Set("X-Forwarded-Host", host)
	out.Set("X-Forwarded-Proto", proto)
	for _, f := range h.Set {
		out.Set(f.Name, f.Value)
	}
}

// listed reports whether the Connection field values name name.
func listed(conn []string, name string) bool {
	for _, v := range conn {
		if TokenListHas(v, name) {
			return true
		}
	}
	return false
}

// safe: no byte that would end or split a header line.
func safe(s string) bool {
	return strings.IndexByte(s, '\n') < 0 && strings.IndexByte(s, '\r') < 0 && strings.IndexByte(s, 0) < 0
}
