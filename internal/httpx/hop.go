package httpx

import (
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

// fieldKind is what a hop does with a sender's field.
type fieldKind uint8

const (
	kindPass fieldKind = iota // passes as it is
	kindDrop                  // hop-by-hop, framing, forwarding (Forwarded) or pinnedd's own (X-Pinned-*)
	kindTe                    // Te: only "trailers" passes
	kindXFF                   // X-Forwarded-For
	kindXFH                   // X-Forwarded-Host
	kindXFP                   // X-Forwarded-Proto
)

// fieldKinds is the rule's table, by lower-case name; every other field
// passes, but X-Pinned-* ones (kindOf).
var fieldKinds = map[string]fieldKind{
	"connection": kindDrop, "proxy-connection": kindDrop, "keep-alive": kindDrop, "proxy-authenticate": kindDrop,
	"proxy-authorization": kindDrop, "trailer": kindDrop, "transfer-encoding": kindDrop, "upgrade": kindDrop,
	"host": kindDrop, "content-length": kindDrop, "expect": kindDrop, "forwarded": kindDrop,
	"te": kindTe, "x-forwarded-for": kindXFF, "x-forwarded-host": kindXFH, "x-forwarded-proto": kindXFP,
}

// kindOf looks name up in fieldKinds whatever its case, without
// allocating (a request's fields arrive as sent).
func kindOf(name string) fieldKind {
	const pinned = "x-pinned-"
	var lower [24]byte // longer than any name in fieldKinds
	n := min(len(name), len(lower))
	for i := 0; i < n; i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	if len(name) <= len(lower) {
		if k, ok := fieldKinds[string(lower[:n])]; ok {
			return k
		}
	}
	if n >= len(pinned) && string(lower[:len(pinned)]) == pinned {
		return kindDrop
	}
	return kindPass
}

// Passes reports whether a sender's field passes as it is.
func Passes(name string) bool { return kindOf(name) == kindPass }

// hopWriter writes one forwarded request head field by field, keeping
// what the hop's own fields need (all on the caller's stack).
type hopWriter struct {
	h        *Hop
	dst      []byte
	conn     []string // the Connection fields' values: they name hop-by-hop fields too
	xff      []string // the sender's X-Forwarded-For values
	xfh, xfp string   // its first X-Forwarded-Host and -Proto
	trailers bool     // it takes trailers (Te)
	ok       bool     // every field written was safe
}

func (w *hopWriter) field(k, v string) {
	switch kindOf(k) {
	case kindXFF:
		w.xff = append(w.xff, v)
	case kindXFH:
		if w.xfh == "" {
			w.xfh = v
		}
	case kindXFP:
		if w.xfp == "" {
			w.xfp = v
		}
	case kindTe:
		w.trailers = w.trailers || TokenListHas(v, "trailers")
	case kindPass:
		if len(w.conn) > 0 && listed(w.conn, k) {
			return
		}
		w.ok = w.ok && safe(k) && safe(v)
		w.dst = AppendField(w.dst, k, v)
	}
}

// end writes the hop's own fields, then a length for every body and the
// body.
func (w *hopWriter) end(method string, body []byte) ([]byte, bool) {
	h := w.h
	if w.trailers {
		w.dst = append(w.dst, "Te: trailers\r\n"...)
	}
	if !h.Trusted {
		w.xff, w.xfh, w.xfp = nil, "", ""
	}
	ip, _, err := net.SplitHostPort(h.RemoteAddr)
	if len(w.xff) > 0 || err == nil {
		w.dst = append(w.dst, "X-Forwarded-For: "...)
		for i, v := range w.xff {
			if i > 0 {
				w.dst = append(w.dst, ", "...)
			}
			w.dst = append(w.dst, v...)
		}
		if err == nil {
			if len(w.xff) > 0 {
				w.dst = append(w.dst, ", "...)
			}
			w.dst = append(w.dst, ip...)
		}
		w.dst = append(w.dst, "\r\n"...)
	}
	host, proto := h.hostProto(w.xfh, w.xfp)
	w.dst = AppendField(w.dst, "X-Forwarded-Host", host)
	w.dst = AppendField(w.dst, "X-Forwarded-Proto", proto)
	for _, f := range h.Set {
		w.dst = AppendField(w.dst, f.Name, f.Value)
	}
	return AppendBody(w.dst, method, body), w.ok && safe(host) && safe(proto)
}

// hostProto is the hop's X-Forwarded-Host and -Proto, given the sender's
// (kept only from a trusted sender).
func (h *Hop) hostProto(xfh, xfp string) (host, proto string) {
	if !h.Trusted {
		xfh, xfp = "", ""
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
	return host, proto
}

// AppendFields writes the forwarded request to dst: its request line
// (target is the escaped path with the query), Host, the sender's fields
// (names as sent) under the hop's rule, then a length for every body and
// the body. ok is false if a field cannot be written safely (a CR, LF or
// NUL in it); dst is then not a request.
func (h *Hop) AppendFields(dst []byte, method, target string, fields []Field, body []byte) (_ []byte, ok bool) {
	var buf [4]string // room for conn and xff, on the stack
	w := hopWriter{h: h, ok: safe(target) && safe(h.Host), conn: buf[:0:2], xff: buf[2:2]}
	for _, f := range fields {
		if len(f.Name) == len("Connection") && strings.EqualFold(f.Name, "Connection") {
			w.conn = append(w.conn, f.Value)
		}
	}
	w.dst = AppendRequestLine(dst, method, target, h.Host)
	for _, f := range fields {
		w.field(f.Name, f.Value)
	}
	return w.end(method, body)
}

// AppendHeader is AppendFields for a request net/http parsed.
func (h *Hop) AppendHeader(dst []byte, method, target string, header http.Header, body []byte) (_ []byte, ok bool) {
	var buf [2]string // room for xff, on the stack
	w := hopWriter{h: h, ok: safe(target) && safe(h.Host), conn: header["Connection"], xff: buf[:0]}
	w.dst = AppendRequestLine(dst, method, target, h.Host)
	for k, vs := range header {
		for _, v := range vs {
			w.field(k, v)
		}
	}
	return w.end(method, body)
}

// Header is the hop's rule for an outbound http.Request's header (net/http
// writes the request line, Host, the framing and the body): the sender's
// fields that pass, Te: trailers, an Upgrade's Connection and Upgrade,
// the forwarding fields and Set.
func (h *Hop) Header(in http.Header) http.Header {
	out := make(http.Header, len(in)+3+len(h.Set))
	conn := in["Connection"]
	var xff []string
	var xfh, xfp string
	trailers := false
	for k, vs := range in {
		switch kindOf(k) {
		case kindPass:
			if len(conn) == 0 || !listed(conn, k) {
				out[k] = append([]string(nil), vs...)
			}
		case kindXFF:
			xff = append(xff, vs...)
		case kindXFH:
			xfh = first(vs)
		case kindXFP:
			xfp = first(vs)
		case kindTe:
			for _, v := range vs {
				trailers = trailers || TokenListHas(v, "trailers")
			}
		}
	}
	if trailers {
		out["Te"] = []string{"trailers"}
	}
	if up := UpgradeType(in); up != "" {
		out["Connection"], out["Upgrade"] = []string{"Upgrade"}, []string{up}
	}
	if !h.Trusted {
		xff = nil
	}
	if ip, _, err := net.SplitHostPort(h.RemoteAddr); err == nil {
		xff = append(xff, ip)
	}
	if len(xff) > 0 {
		out.Set("X-Forwarded-For", strings.Join(xff, ", "))
	}
	host, proto := h.hostProto(xfh, xfp)
	out.Set("X-Forwarded-Host", host)
	out.Set("X-Forwarded-Proto", proto)
	for _, f := range h.Set {
		out.Set(f.Name, f.Value)
	}
	return out
}

// Rewrite applies the hop's rule to httputil.ReverseProxy's outbound
// header out, from in, the sender's (Header).
func (h *Hop) Rewrite(out, in http.Header) {
	clear(out)
	for k, vs := range h.Header(in) {
		out[k] = vs
	}
}

// UpgradeType is the protocol a request asks to switch to ("" for none):
// its Upgrade field, if its Connection field names Upgrade.
func UpgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		if TokenListHas(v, "Upgrade") {
			return h.Get("Upgrade")
		}
	}
	return ""
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
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
