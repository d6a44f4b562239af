package frontdoor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Connection bounds of the front door. net/http's own (idle timeout,
// header size) are the http.Server's; these are the parts net/http has
// none for: a cap on the connections a client IP and all clients hold
// open, a cap on a request's body, and a read deadline on request bodies
// that does not touch held response streams. The kept-alive loop holds its
// connections to the same settings (relay.ClientLimits) and gives back to
// net/http every request these rules must answer.

// Defaults of the agent's flags.
const (
	DefaultMaxConnsPerIP   = 256
	DefaultMaxConns        = 10000
	DefaultIdleTimeout     = 120 * time.Second
	DefaultBodyReadTimeout = 30 * time.Second
	// DefaultMaxBodyBytes caps a request body (--max-body-size).
	DefaultMaxBodyBytes = 16 << 20
	// MaxHeaderBytes bounds a request head on net/http's side (a larger
	// one gets 431).
	MaxHeaderBytes = 64 << 10
)

// Reasons of pinboard_connections_refused_total.
const (
	connRefusedPerIP = "per-ip"
	connRefusedTotal = "total"
)

var connRefusedReasons = []string{connRefusedPerIP, connRefusedTotal}

// refuseRetryAfter is the Retry-After of a refused connection.
const refuseRetryAfter = time.Second

// maxRefusing bounds the refusals answered at once; past it a refused
// connection is closed unanswered, so a flood costs no more goroutines.
const maxRefusing = 64

// ConnLimits caps the connections a listener keeps open: PerIP from one
// client IP (the TCP peer's, never a forwarding header), Total from all.
// 0 is no cap.
type ConnLimits struct {
	PerIP int
	Total int
	// Exempt reports IPs the per-IP cap does not apply to (the fleet's
	// own nodes and trusted proxies: each carries many clients'
	// requests). They still count toward Total. Nil: none.
	Exempt func(netip.Addr) bool
}

// ConnLimiter counts the live connections of the listeners it wraps,
// per client IP and in total. A connection's slot is held from Accept
// until the connection is closed, wherever it is served: a connection
// that leaves net/http for the fast path (the kept-alive loop, or a held
// stream in the relay loop) has its socket taken out of the net.Conn, and
// the loop takes the slot along (Detach), giving it back when it closes
// the socket or handing it on with a connection it gives back to
// net/http.
type ConnLimiter struct {
	limits   ConnLimits
	log      *slog.Logger
	mu       sync.Mutex
	perIP    map[netip.Addr]int
	total    int
	refusing atomic.Int32
	refused  *prometheus.CounterVec
}

// NewConnLimiter returns a limiter for limits; reg (if not nil) gets
// pinboard_connections and pinboard_connections_refused_total.
func NewConnLimiter(limits ConnLimits, logger *slog.Logger, reg prometheus.Registerer) *ConnLimiter {
	if logger == nil {
		logger = slog.Default()
	}
	l := &ConnLimiter{limits: limits, log: logger, perIP: map[netip.Addr]int{},
		refused: newCounterVec("pinboard_connections_refused_total",
			"Client connections refused at accept for a connection cap, by which: per-ip (--max-conns-per-ip), total (--max-conns).",
			"reason", connRefusedReasons)}
	if reg != nil {
		reg.MustRegister(l.refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinboard_connections", Help: "Client connections open on the front door now, in net/http and on the fast path (what --max-conns caps).",
		}, func() float64 { return float64(l.Total()) }))
	}
	return l
}

// Total is the number of connections holding a slot.
func (l *ConnLimiter) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// From is the number of connections from ip holding a slot.
func (l *ConnLimiter) From(ip netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perIP[ip]
}

// Listener wraps ln: each accepted connection takes a slot, or, over a
// cap, is answered 503 + Retry-After and closed (Accept goes on to the
// next one).
func (l *ConnLimiter) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, l: l}
}

// acquire takes a slot for ip, or says which cap is full ("" if none).
func (l *ConnLimiter) acquire(ip netip.Addr, ok bool) (reason string) {
	perIP := l.limits.PerIP > 0 && ok && (l.limits.Exempt == nil || !l.limits.Exempt(ip))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limits.Total > 0 && l.total >= l.limits.Total {
		return connRefusedTotal
	}
	if perIP && l.perIP[ip] >= l.limits.PerIP {
		return connRefusedPerIP
	}
	l.total++
	if ok {
		l.perIP[ip]++
	}
	return ""
}

func (l *ConnLimiter) release(ip netip.Addr, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if ok {
		if l.perIP[ip]--; l.perIP[ip] <= 0 {
			delete(l.perIP, ip)
		}
	}
}

type limitListener struct {
	net.Listener
	l *ConnLimiter
}

func (ll *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip, ok := peerIP(c.RemoteAddr())
		reason := ll.l.acquire(ip, ok)
		if reason == "" {
			lc := &limitedConn{Conn: c}
			lc.release = func() { ll.l.release(ip, ok) }
			return lc, nil
		}
		ll.l.refused.WithLabelValues(reason).Inc()
		msg := "too many connections to this node"
		if reason == connRefusedPerIP {
			msg = "too many connections from " + ip.String()
		}
		if ll.l.refusing.Add(1) > maxRefusing {
			ll.l.refusing.Add(-1)
			_ = c.Close()
			continue
		}
		go func() {
			defer ll.l.refusing.Add(-1)
			refuseConn(c, msg)
		}()
	}
}

// peerIP is the TCP peer's IP (IPv4-mapped IPv6 unmapped).
func peerIP(a net.Addr) (netip.Addr, bool) {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(t.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap(), err == nil
}

// refuseConn answers c 503 + Retry-After with msg and closes it. The
// request is read and dropped after the answer (for up to a second), so
// closing does not reset the connection before the client reads it.
func refuseConn(c net.Conn, msg string) {
	defer c.Close()
	body := fmt.Sprintf("{\"error\":%s}\n", strconv.Quote(msg))
	resp := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" +
		"Retry-After: " + httpx.RetryAfterSeconds(refuseRetryAfter) + "\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, resp); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// limitedConn holds its listener's slot until Close, or until Detach
// hands the slot to whoever took the socket.
type limitedConn struct {
	net.Conn
	mu      sync.Mutex
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	rel := c.release
	c.release = nil
	c.mu.Unlock()
	if rel != nil {
		rel()
	}
	return err
}

// Detach is for code that takes the socket out of this net.Conn and keeps
// it open after closing the conn (the relay loops duplicate the
// descriptor; they look for Detach on the conn net/http hands them and
// under it, through Unwrap): Close no longer gives the slot back; the
// caller must call release, once, when the socket it took is finally
// closed. A second Detach returns a release that does nothing.
func (c *limitedConn) Detach() (release func()) {
	c.mu.Lock()
	rel := c.release
	c.release = nil
	c.mu.Unlock()
	if rel == nil {
		return func() {}
	}
	var once sync.Once
	return func() { once.Do(rel) }
}

// SyscallConn exposes the socket (the relay loops take its descriptor;
// net/http's sendfile path uses it).
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("pinboard: %T has no descriptor", c.Conn)
	}
	return sc.SyscallConn()
}

// CloseWrite half-closes a TCP connection (net/http does on a lingering
// close).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// ReadFrom keeps net/http's sendfile path (http.ServeContent of a file)
// on the socket.
func (c *limitedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(c.Conn, r)
}

// Unwrap returns the connection underneath.
func (c *limitedConn) Unwrap() net.Conn { return c.Conn }

// boundRequest is the front door's rule for one request's framing and
// body, on every request net/http serves (a client's, a peer's on the
// cluster port, one the kept-alive loop gave back): it answers and
// reports false for a request it refuses, and otherwise returns what the
// caller runs once its handler returned.
//
//   - A body whose Content-Length is over maxBody is answered 413 at once,
//     unread, and the connection closes (no drain); one of unknown length
//     (chunked) is cut at maxBody (http.MaxBytesReader): a forward or
//     relay under way answers 413 (httpx.ClassifyUnanswered).
//   - A client's chunked request closes its connection after the answer.
//     RFC 9112 §6.1: a request with both Content-Length and
//     Transfer-Encoding must, and net/http serves such a request by its
//     chunked framing with the Content-Length field removed, so a handler
//     cannot tell it from a chunked one. A peer's (another node's
//     forwarder, over mutual TLS) keeps its connection: it never sends
//     both.
//   - The body gets a deadline on progress (bodyDeadline).
func (f *FrontDoor) boundRequest(w http.ResponseWriter, r *http.Request) (out http.ResponseWriter, done func(), ok bool) {
	out, done = w, func() {}
	if r.Body == nil || r.Body == http.NoBody {
		return out, done, true
	}
	if f.maxBody > 0 {
		switch {
		case r.ContentLength > f.maxBody:
			// Closing, not draining: net/http would otherwise read up
			// to 256 KiB of a body nobody wants before answering
			// (Connection: close stops that) and again as it closes the
			// body after (the past deadline stops that).
			w.Header().Set("Connection", "close")
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			httpx.WriteError(w, http.StatusRequestEntityTooLarge, httpx.BodyTooLargeMsg(f.maxBody), 0)
			return nil, nil, false
		case r.ContentLength < 0:
			r.Body = http.MaxBytesReader(w, r.Body, f.maxBody)
		}
	}
	if len(r.TransferEncoding) > 0 && !fromPeer(r) {
		out = &closingWriter{ResponseWriter: w}
	}
	if f.bodyReadTimeout > 0 {
		b := newBodyDeadline(w, r.Body, f.bodyReadTimeout)
		r.Body, done = b, b.stop
	}
	return out, done, true
}

// closingWriter makes the final response written through it say
// Connection: close, so net/http closes the connection after it. It sets
// the field as the head goes out, not once before the handler: a handler
// may clear the header in between (ReverseProxy does after relaying a
// 1xx).
type closingWriter struct {
	http.ResponseWriter
	final bool
}

func (w *closingWriter) close() {
	if !w.final {
		w.final = true
		w.Header().Set("Connection", "close")
	}
}

func (w *closingWriter) WriteHeader(code int) {
	if code >= 200 {
		w.close()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(p []byte) (int, error) {
	w.close() // the implicit 200
	return w.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController.Flush calls: a flush before
// any write sends the head too.
func (w *closingWriter) FlushError() error {
	w.close()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bodyDeadline bounds how long a request body may go without progress:
// each Read must return within timeout, and once the body is read to its
// end the deadline is cleared and never set again, so the rest of the
// exchange (a held response stream, net/http's background read that
// watches for the client leaving and cancels the request's context when
// a read fails) runs with none. The deadline is armed before the handler
// reads anything and again when it returns with the body unread, so
// net/http's discard of an unread body (up to 256 KiB, before it writes
// the response head, on any route that does not read its body) is bounded
// too: a stalled body then closes the connection. http.Server.ReadTimeout
// is not this: it bounds the whole request from its first byte, so a slow
// but steady upload, or a body read after a long placement or activation,
// would be cut. A connection hijacked later (a held stream or a kept-alive
// connection leaving net/http) is unaffected: Hijack clears deadlines,
// and the loops use the descriptor, not Go's deadlines.
type bodyDeadline struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	mu      sync.Mutex
	done    bool // the handler returned: the connection is net/http's again
	eof     bool // read to its end: net/http's background read may be under way
	set     bool
}

func newBodyDeadline(w http.ResponseWriter, body io.ReadCloser, timeout time.Duration) *bodyDeadline {
	b := &bodyDeadline{ReadCloser: body, rc: http.NewResponseController(w), timeout: timeout}
	// Armed now: a handler that writes and flushes its answer without
	// reading the body makes net/http discard it then.
	b.set = b.rc.SetReadDeadline(time.Now().Add(timeout)) == nil
	return b
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	b.mu.Lock()
	if !b.done && !b.eof {
		// Set per Read, not once: a handler may hold the request a while
		// (a placement, an activation) before it reads the body. Never
		// after the end: the deadline would land on the background read.
		b.set = b.rc.SetReadDeadline(time.Now().Add(b.timeout)) == nil
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.clear()
	}
	return n, err
}

// clear lifts the deadline once the body is read (net/http clears it too
// as it starts its background read; this does not depend on that).
func (b *bodyDeadline) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.eof = true
	if b.set && !b.done {
		_ = b.rc.SetReadDeadline(time.Time{})
		b.set = false
	}
}

// stop runs when the handler returns: from then on the connection's
// deadlines are net/http's. A body left unread gets one last deadline, a
// full timeout from now, for net/http's discard of it; past it the
// connection closes after the answer.
func (b *bodyDeadline) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	if !b.eof {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	}
}

// peerRefreshEvery is how stale the per-IP cap's view of the fleet's own
// nodes may get.
const peerRefreshEvery = time.Second

// peerSet is the IPs of the fleet's own front doors, refreshed every
// peerRefreshEvery by a goroutine of its own, off the accept path.
type peerSet struct {
	ips   atomic.Pointer[map[netip.Addr]bool]
	start sync.Once
	stop  chan struct{}
	end   sync.Once
}

// run refreshes the set from list until close.
func (p *peerSet) run(list func() map[netip.Addr]bool) {
	p.start.Do(func() {
		p.stop = make(chan struct{})
		go func() {
			t := time.NewTicker(peerRefreshEvery)
			defer t.Stop()
			for {
				m := list()
				p.ips.Store(&m)
				select {
				case <-p.stop:
					return
				case <-t.C:
				}
			}
		}()
	})
}

func (p *peerSet) close() {
	p.start.Do(func() {}) // a set never run has nothing to stop
	p.end.Do(func() {
		if p.stop != nil {
			close(p.stop)
		}
	})
}

func (p *peerSet) has(ip netip.Addr) bool {
	m := p.ips.Load()
	return m != nil && (*m)[ip]
}

// exemptFromIPCap: ip is a trusted proxy or one of the fleet's nodes,
// whose connections carry many clients' requests.
func (f *FrontDoor) exemptFromIPCap(ip netip.Addr) bool {
	for _, p := range f.trustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return f.fleetIPs.has(ip)
}

// peerIPs resolves the workers' advertise URLs and the members' front-door
// addresses to IPs.
func (f *FrontDoor) peerIPs() map[netip.Addr]bool {
	var addrs []string
	if f.dir != nil {
		for _, wk := range f.dir.Machine().Workers() {
			addrs = append(addrs, wk.AdvertiseURL)
		}
	}
	if f.peerAddrs != nil {
		addrs = append(addrs, f.peerAddrs()...)
	}
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		host := a
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			host = u.Host
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			out[ip.Unmap()] = true
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		cancel()
		if err != nil {
			continue
		}
		for _, ip := range ips {
			out[ip.Unmap()] = true
		}
	}
	return out
}
