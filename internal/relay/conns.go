package relay

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Keep-alive forwarding (Conns): a client connection on which the front
// door forwarded a request is taken out of net/http and served from an
// event loop: each next request's head is parsed in place, a Router says
// where it goes, the loop writes it to a pooled upstream connection and
// relays the response back, byte for byte, with no goroutine, no
// scheduler hand-off and no background read per request. Whatever the
// loop does not handle itself goes back to net/http with the request still
// unread (HandBack), so every behaviour of the ordinary path stays where
// it is: anything but a plain HTTP/1.1 request with no body or a short
// Content-Length one, an id not placed on a live remote owner, an owner
// that refuses in-band (it ran nothing, so the request is replayed), an
// idempotent request whose pooled upstream connection turned out dead.
// An upstream may be a TLS server (Forward.TLS): the loop handshakes off
// its goroutine and runs crypto/tls over the connection (tls_linux.go). A
// client may be a TLS one made by ServerTLS: net/http runs its handshake
// and first request, the loop runs crypto/tls over it once adopted, and
// gives it back as it came (tlsclient_linux.go).

// ReqHead is a request head parsed by the loop, for Router.
type ReqHead struct {
	Method string
	// Target is the request target as sent (origin form: path and query).
	Target string
	Host   string
	// Fields are the other header fields, names as sent, values trimmed.
	Fields []Field
	// Body is the whole request body (Content-Length bytes).
	Body []byte
	// RemoteAddr is the client's address (ip:port).
	RemoteAddr string
	// Conn is the connection Adopt was given (a TLS connection the loop
	// gave back and took again: the one it gave back wrapped, so a
	// caller's wrapper type stays what it finds). The loop owns it: look,
	// do not use.
	Conn net.Conn
	// Ticket names the exchange this request starts, should the Router
	// route it: a Router that must be able to end it later (an instance
	// evicted under an open stream) keeps it.
	Ticket Ticket
	// expect: the client waits for 100 Continue before sending the body.
	expect bool
}

// Field is one header field.
type Field = httpx.Field

// Forward is where a Router sends a request.
type Forward struct {
	// Addr is the upstream's address: an IP literal and a port (TCP), or
	// a unix socket's path (anything with a '/'; a relative one is taken
	// from the working directory, as net.Dial("unix") takes it).
	Addr string
	// Wire is the whole request to write there (head and body).
	Wire []byte
	// TLS, if set, makes the connection to Addr a TLS client connection
	// with this config; nil: plain. Pass the same pointer for the same
	// peer each time: pooled connections are kept apart by address and
	// config, and the config's ClientSessionCache, if any, resumes
	// sessions. The handshake runs off the loop; one that fails or does
	// not finish within a few seconds is an upstream that could not be
	// reached, as a refused connection is (nothing of the request was
	// sent). With no ServerName and verification on, the name checked is
	// Addr's host, as tls.Dial does.
	TLS *tls.Config
	// Refusal names a response field, and Refused reads its value: a
	// response it calls refused ran nothing, and the request goes back to
	// net/http instead (a Final request is answered 503 + Retry-After,
	// ErrRefused). Responses without the field are answers.
	Refusal string
	Refused func(status int, value string) bool
	// Final: the request must not go back to net/http once routed (the
	// Router spent something on it, such as a one-time attestation).
	// Where the loop would give it back, it answers itself: 503 +
	// Retry-After when nothing was sent, 504 (may have run) once it was;
	// a pooled connection found dead is replaced by a fresh one once, for
	// a request safe to send again (GET, HEAD, OPTIONS).
	Final bool
	// FailMsg is the error of the loop's own 503 ("owner unreachable"
	// if empty).
	FailMsg string
	// Timeout bounds the wait for the response head: 0 is the loop's
	// own bound, < 0 none (an upstream whose handlers may hold a request
	// as long as they like, as net/http's path lets them).
	Timeout time.Duration
	// Head, if set, runs once the final response head is in: its status,
	// and whether its body is a stream (chunked, or ends with the
	// connection), as Done does.
	Head func(status int, stream bool)
	// Done, if set, runs when the exchange ends: the status the client got
	// (0 if none: the request went back to net/http, or nothing was
	// answered) and why it failed (nil if it did not). It runs outside the
	// loop's lock, on the loop goroutine (or the one that called
	// Ticket.Abort); it must be quick and must not block.
	Done func(status int, err error)
}

// Wire buffers: a Forward's Wire belongs to the loop until the exchange
// ends, so a Router may take it from WireBuffer and give it back in Done
// (the largest allocation a forwarded request made, on each side of a hop).
var wires = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// WireBuffer returns an empty buffer for a Forward's Wire.
func WireBuffer() *[]byte {
	b := wires.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

// ReleaseWire gives back a buffer from WireBuffer once its exchange is
// over (in Forward.Done); nothing may use it after.
func ReleaseWire(b *[]byte) {
	if cap(*b) <= 16<<10 { // an upload grew it: let it go
		wires.Put(b)
	}
}

// ClientLimits bound the client connections the loop holds. The front
// door sets them from the same settings that bound net/http's side, so a
// connection is held to one rule wherever it is served.
type ClientLimits struct {
	// Idle closes a connection that sent no request for this long
	// (http.Server's IdleTimeout); 0 or less: no bound.
	Idle time.Duration
	// MaxBody: a request whose Content-Length is over it goes back to
	// net/http, unread, whose rule for it answers (413); 0 or less: no
	// cap but the loop's own (64 KiB; longer bodies go back too).
	MaxBody int64
}

// Router decides each request read on a kept-alive connection. ok false:
// the connection goes back to net/http with the request unread.
type Router interface {
	Route(h *ReqHead) (f Forward, ok bool)
}

// Limits of the loop's own parsing: past them a request goes to net/http,
// which answers or refuses it as it always does.
const (
	maxHead      = 16 << 10
	maxLoopBody  = 64 << 10 // ClientLimits.MaxBody may lower it
	maxRespHead  = 64 << 10
	idleTimeout  = 90 * time.Second // a kept-alive connection with no request, until ClientLimits
	headTimeout  = 10 * time.Second // a request head begun but not finished
	sweepEvery   = time.Second
	upstreamIdle = 60 * time.Second // a pooled upstream connection unused
	// lingerTimeout bounds how long a draining loop reads what a client it
	// refused still sends, before it closes the connection.
	lingerTimeout = 2 * time.Second
)

// Errors an exchange ends with (Forward.Done).
var (
	// ErrUpstreamFailed: the upstream connection failed or closed before
	// the whole response arrived.
	ErrUpstreamFailed = errors.New("upstream connection failed")
	// ErrUpstreamTimeout: no response head within the response timeout.
	ErrUpstreamTimeout = errors.New("upstream response timed out")
	// ErrUpstreamProtocol: the upstream's response could not be relayed.
	ErrUpstreamProtocol = errors.New("malformed upstream response")
	// ErrClientGone: the client went away before the response was out.
	ErrClientGone = errors.New("client went away")
	// ErrRefused: a Final request's upstream refused it (Forward.Refusal).
	ErrRefused = errors.New("upstream refused the request")
	// ErrAborted: the Router ended the exchange (Ticket.Abort).
	ErrAborted = errors.New("exchange aborted")
)

// FailedUpstream reports whether err, an exchange's end (Forward.Done),
// failed for the upstream's sake: it could not be reached, or did not
// answer in full, and the loop answered the client itself. A refusal, a
// client gone and an abort are not: the upstream answered, or nobody is
// left to answer.
func FailedUpstream(err error) bool {
	return err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrClientGone) && !errors.Is(err, ErrAborted)
}

// headScan is how far the search for a head's end got in bytes that grow
// read by read: each byte is looked at once however the head trickles in
// (a search from byte 0 after every read costs work quadratic in a head
// sent a byte at a time). The zero value starts a new head; reset it when
// the bytes it scanned are consumed.
type headScan struct {
	off   int  // in[:off] holds neither the head's end nor a bare LF
	end   int  // where the CRLF CRLF ending the head starts, once found
	found bool // end is set
	// n is the request's whole length (head and body) once its head
	// parsed and its body is still coming (0 before): the head is not
	// parsed again until the body is in.
	n      int
	expect bool
	// scanned counts the bytes looked at, searching and parsing: work the
	// loop spent on heads (for its tests).
	scanned int
}

// find returns where the CRLF CRLF ending the head in in starts (-1: not
// there yet), searching only the bytes after the last search and only the
// first limit bytes. bad: a bare LF came first (a line ending no head the
// loop accepts has), or limit bytes hold no head end.
func (s *headScan) find(in []byte, limit int) (end int, bad bool) {
	if s.found {
		return s.end, false
	}
	top := min(len(in), limit)
	for s.off < top {
		j := bytes.IndexByte(in[s.off:top], '\n')
		if j < 0 {
			s.scanned += top - s.off
			s.off = top
			break
		}
		i := s.off + j
		s.scanned += j + 1
		s.off = i + 1
		if i == 0 || in[i-1] != '\r' {
			return -1, true
		}
		if i >= 3 && in[i-2] == '\n' && in[i-3] == '\r' {
			s.found, s.end = true, i-3
			return i - 3, false
		}
	}
	return -1, len(in) >= limit
}

// parseRequest parses the request head at the start of in, resuming the
// search for its end where s left it. n is the length of head and body
// when the request is whole in in; need says more bytes are needed first;
// ok false: not one for the loop (malformed, a bare LF, a body longer
// than maxBody, or anything but the plain case), net/http takes it. A
// request with Transfer-Encoding (with a Content-Length too or not) is
// never the loop's: net/http answers it and closes the connection where
// its framing is one a proxy before it could read otherwise.
func parseRequest(in []byte, s *headScan, h *ReqHead, maxBody int) (n int, need bool, ok bool) {
	if s.n > 0 && len(in) < s.n {
		h.expect = s.expect // the head parsed already: its body is coming
		return 0, true, true
	}
	h.expect = false
	end, bad := s.find(in, maxHead)
	if bad {
		return 0, false, false
	}
	if end < 0 {
		return 0, true, true
	}
	s.scanned += end + 4
	// One string for the whole head; every name and value is a piece of
	// it (one allocation a request, not two a field).
	head := string(in[:end+2])
	line, rest, ok := cutLine(head)
	if !ok {
		return 0, false, false
	}
	sp1 := strings.IndexByte(line, ' ')
	if sp1 <= 0 {
		return 0, false, false
	}
	method, after := line[:sp1], line[sp1+1:]
	sp2 := strings.IndexByte(after, ' ')
	if sp2 <= 0 || after[sp2+1:] != "HTTP/1.1" {
		return 0, false, false
	}
	target := after[:sp2]
	if !upperToken(method) || target[0] != '/' || !visible(target) || !pathEscapes(target) {
		return 0, false, false
	}
	h.Method, h.Target, h.Host = method, target, ""
	h.Fields = h.Fields[:0]
	clen := -1
	hosts := 0
	for len(rest) > 0 {
		var fl string
		if fl, rest, ok = cutLine(rest); !ok {
			return 0, false, false
		}
		colon := strings.IndexByte(fl, ':')
		if colon <= 0 || !token(fl[:colon]) {
			return 0, false, false // also obs-fold: a line starting with a space
		}
		name, value := fl[:colon], trimOWS(fl[colon+1:])
		if !fieldValue(value) {
			return 0, false, false
		}
		switch {
		case equalFold(name, "Host"):
			if !visible(value) {
				return 0, false, false
			}
			hosts++
			h.Host = value
			continue
		case equalFold(name, "Expect"):
			// 100-continue the loop answers itself (as net/http does when
			// the handler reads the body); nothing else is known.
			if !equalFold(value, "100-continue") {
				return 0, false, false
			}
			h.expect = true
			continue
		case equalFold(name, "Content-Length"):
			if clen >= 0 || len(value) == 0 || len(value) > 9 || !digits(value) {
				return 0, false, false
			}
			clen = int(decimal(value))
		case equalFold(name, "Transfer-Encoding"), equalFold(name, "Upgrade"):
			return 0, false, false
		case equalFold(name, "Connection"):
			// keep-alive is the default; anything else (close, or
			// fields named hop-by-hop) is net/http's to handle.
			if !equalFold(value, "keep-alive") {
				return 0, false, false
			}
			continue
		}
		h.Fields = append(h.Fields, Field{Name: name, Value: value})
	}
	if hosts != 1 || clen > maxBody {
		return 0, false, false
	}
	n = end + 4 + max(clen, 0)
	if len(in) < n {
		s.n, s.expect = n, h.expect
		return 0, true, true
	}
	h.Body = in[end+4 : n]
	return n, false, true
}

// cutLine cuts the line before the first LF of s, which must end in CRLF
// (s is a head ending in CRLF). A bare LF is malformed: ok false.
func cutLine(s string) (line, rest string, ok bool) {
	i := strings.IndexByte(s, '\n')
	if i < 1 || s[i-1] != '\r' {
		return "", "", false
	}
	return s[:i-1], s[i+1:], true
}

// cutCRLF cuts the line before the first LF of s, which must end in
// CRLF (s is a head ending in CRLF). A bare LF is malformed: ok false.
func cutCRLF(s []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(s, '\n')
	if i < 1 || s[i-1] != '\r' {
		return nil, nil, false
	}
	return s[:i-1], s[i+1:], true
}

// decimal is the value of up to 18 digits (checked by digits).
func decimal[T []byte | string](d T) int64 {
	var n int64
	for i := 0; i < len(d); i++ {
		n = n*10 + int64(d[i]-'0')
	}
	return n
}

// trimOWS trims a field value's optional whitespace (spaces and tabs).
func trimOWS[T []byte | string](v T) T {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// response is what the loop needs of a response head.
type response struct {
	status  int
	headLen int
	clen    int64 // -1: none
	chunked bool
	close   bool   // Connection: close
	refusal string // the value of the Router's refusal field, if any
	head    []byte
}

// parseResponse parses the response head at the start of in, resuming
// the search for its end where s left it, and renders the head to send on
// (hop-by-hop fields dropped, as a proxy must). need: not whole yet; ok
// false: not relayable (a bare LF, a control byte in a value, framing a
// proxy cannot trust).
func parseResponse(in []byte, s *headScan, refusal string, dst []byte) (r response, need bool, ok bool) {
	end, bad := s.find(in, maxRespHead)
	if bad {
		return r, false, false
	}
	if end < 0 {
		return r, true, true
	}
	s.scanned += end + 4
	r.headLen = end + 4
	line, rest, ok := cutCRLF(in[:end+2])
	if !ok || len(line) < 12 || string(line[:9]) != "HTTP/1.1 " || !digits(line[9:12]) || len(line) > 12 && line[12] != ' ' {
		return r, false, false
	}
	r.status = int(decimal(line[9:12]))
	r.clen = -1
	dst = append(append(dst, line...), "\r\n"...)
	var connTokens []byte
	for len(rest) > 0 {
		var fl []byte
		if fl, rest, ok = cutCRLF(rest); !ok {
			return r, false, false
		}
		colon := bytes.IndexByte(fl, ':')
		if colon <= 0 || !token(fl[:colon]) {
			return r, false, false
		}
		name, value := fl[:colon], trimOWS(fl[colon+1:])
		if !fieldValue(value) {
			return r, false, false // a bare CR or NUL passed on could split the client's view
		}
		switch {
		case equalFold(name, "Content-Length"):
			if r.clen >= 0 || len(value) == 0 || len(value) > 18 || !digits(value) {
				return r, false, false
			}
			r.clen = decimal(value)
		case equalFold(name, "Transfer-Encoding"):
			if !equalFold(value, "chunked") || r.chunked {
				return r, false, false
			}
			r.chunked = true
		case equalFold(name, "Connection"):
			connTokens = append(append(connTokens, value...), ',')
			for t := range bytes.SplitSeq(value, []byte(",")) {
				if equalFold(bytes.TrimSpace(t), "close") {
					r.close = true
				}
			}
			continue
		case equalFold(name, "Keep-Alive"), equalFold(name, "Proxy-Connection"), equalFold(name, "Upgrade"),
			equalFold(name, "Proxy-Authenticate"), equalFold(name, "Te"):
			continue
		case refusal != "" && equalFold(name, refusal):
			r.refusal = string(value)
		}
		if len(connTokens) > 0 && listed(connTokens, name) {
			continue
		}
		dst = append(append(append(append(dst, name...), ": "...), value...), "\r\n"...)
	}
	if r.chunked && r.clen >= 0 {
		return r, false, false // smuggling-shaped: refuse to relay it
	}
	r.head = append(dst, "\r\n"...)
	return r, false, true
}

// listed: the comma-separated tokens name name (a field a Connection field
// made hop-by-hop). Fields before the Connection field are not checked
// again; senders put Connection first, and the owner is pinnedd.
func listed(tokens, name []byte) bool {
	for t := range bytes.SplitSeq(tokens, []byte(",")) {
		if equalFold(bytes.TrimSpace(t), string(name)) {
			return true
		}
	}
	return false
}

func upperToken(b string) bool {
	if len(b) == 0 || len(b) > 16 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// tchars are RFC 9110's token characters.
var tchars = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// token: RFC 9110 tchar+.
func token[T []byte | string](b T) bool {
	if len(b) == 0 {
		return false
	}
	for i := 0; i < len(b); i++ {
		if !tchars[b[i]] {
			return false
		}
	}
	return true
}

// pathEscapes: every % in target's path (before any ?) starts an escape
// of two hex digits, as net/http's parse of the target requires.
func pathEscapes(target string) bool {
	path, _, _ := strings.Cut(target, "?")
	for i := strings.IndexByte(path, '%'); i >= 0; i = strings.IndexByte(path, '%') {
		if i+2 >= len(path) {
			return false
		}
		if _, ok := unhex(path[i+1]); !ok {
			return false
		}
		if _, ok := unhex(path[i+2]); !ok {
			return false
		}
		path = path[i+3:]
	}
	return true
}

// visible: printable ASCII, no space.
func visible(b string) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// fieldValue: no control bytes but tab. Eight bytes at a time where none
// is below a space or DEL (the attestation alone is 150 bytes a hop), one
// at a time where one might be.
func fieldValue[T []byte | string](b T) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := uint64(b[i]) | uint64(b[i+1])<<8 | uint64(b[i+2])<<16 | uint64(b[i+3])<<24 |
			uint64(b[i+4])<<32 | uint64(b[i+5])<<40 | uint64(b[i+6])<<48 | uint64(b[i+7])<<56
		below := (x - ones*' ') &^ x & highs // some byte < 0x20
		del := x ^ ones*0x7f
		if below|(del-ones)&^del&highs != 0 && !fieldBytes(b[i:i+8]) {
			return false
		}
	}
	return fieldBytes(b[i:])
}

// fieldBytes is fieldValue's rule, a byte at a time.
func fieldBytes[T []byte | string](b T) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func digits[T []byte | string](b T) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

func equalFold[T []byte | string](b T, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c, d := b[i], s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}

// ipPort reports whether addr is an IP literal with a port (the loop
// connects without resolving names).
func ipPort(addr string) (net.IP, int, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, false
	}
	ip := net.ParseIP(host)
	p, err := strconv.Atoi(port)
	return ip, p, ip != nil && err == nil && p > 0 && p < 65536
}
