//go:build linux

package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Conns serves kept-alive client connections from one event loop (see
// conns.go). The zero value is not usable; call NewConns.
type Conns struct {
	log      *slog.Logger
	router   Router
	handBack func(net.Conn)
	// RespTimeout bounds the wait for a response head from upstream.
	respTimeout time.Duration
	// idleAfter closes a connection that sent no request for this long
	// (idleTimeout, or ClientLimits.Idle; 0: never); maxBody is the
	// longest request body the loop takes itself (ClientLimits.MaxBody).
	// Both under mu once the loop runs.
	idleAfter time.Duration
	maxBody   int
	// hsTimeout bounds a TLS upstream's connect and handshake
	// (handshakeTimeout; tests shorten it under mu).
	hsTimeout time.Duration
	hsWG      sync.WaitGroup // handshake goroutines (tls_linux.go)

	life                   // its mu guards everything below
	draining bool          // Drain: no new connections, no new exchanges
	quitting bool          // Shutdown: idle connections close too
	drained  chan struct{} // closed once the loop is draining and holds no client
	nextID   uint32
	clients  map[uint32]*client
	ups      map[uint32]*upstream
	idle     map[poolKey][]*upstream // pooled upstream connections
	fresh    []*client               // adopted, not yet looked at by the loop
	shaken   []*upstream             // TLS handshakes ended, not yet taken back by the loop
	runq     []*client               // cut off by their read budget: go on next turn

	live    atomic.Int64 // client connections held
	served  atomic.Int64 // requests the loop forwarded itself
	handed  atomic.Int64 // connections given back to net/http
	scratch ReqHead
	// headWork counts the bytes the loop looked at in request and
	// response heads (headScan.scanned): linear in the bytes received,
	// however they trickle in. For its tests.
	headWork int64
}

// Client connection states.
const (
	stHead   = iota // waiting for (the rest of) a request
	stSend          // writing the request upstream
	stResp          // waiting for the response head
	stBody          // relaying the response body
	stClosed        //
	stLinger        // refused while draining: the answer goes out, what the client still sends is dropped
)

type client struct {
	id       uint32
	fd       int
	conn     net.Conn // what Adopt was given (ReqHead.Conn)
	tls      *tlsEnd  // nil: a plain connection (tlsclient_linux.go)
	remote   string
	in       []byte // bytes read from the client, the current request first
	readable bool
	hup      bool // the client hung up (or half-closed): read to EOF
	state    int
	since    time.Time // of the current state, for its timeout
	reqLen   int       // the current request's bytes at the start of in
	hs       headScan  // the search for the current request head's end in in
	idem     bool      // the current request may be sent again
	up       *upstream
	fwd      Forward
	out      []byte // bytes for the client not yet written
	resp     response
	left     int64 // fixed-length body bytes still to relay
	sc       chunkScanner
	toEOF    bool   // body ends when the upstream closes
	closeAft bool   // close the client once out is written
	wrote    bool   // some of the response went to the client
	isHead   bool   // the current request is a HEAD: its response has no body
	queued   bool   // on runq
	sent100  bool   // 100 Continue went out for the request being read
	shut     bool   // the write side is shut (stLinger)
	seq      uint32 // of the current exchange (Ticket)
	retried  bool   // a Final request went out again on a fresh connection
	hbuf     []byte
	release  func() // the connection's slot (see slot.go): called when fd closes, or handed on with it
}

type upstream struct {
	id       uint32
	fd       int
	key      poolKey
	tls      *tlsEnd // nil: a plain connection
	c        *client // nil while pooled
	in       []byte
	hs       headScan // the search for the response head's end in in
	readable bool
	hup      bool   // the upstream hung up: read to EOF
	out      []byte // request bytes not yet written
	sent     bool   // some of the request went out
	eof      bool   // the upstream closed (after the bytes in in)
	reused   bool
	idleAt   time.Time
}

// poolKey is what a pooled upstream connection can carry requests for:
// its address, and the TLS config it was made with (nil: plain).
type poolKey struct {
	addr string
	tls  *tls.Config
}

// Event sides.
const (
	sideC = 0
	sideU = 1
	sideW = 2
)

// NewConns returns a loop that routes with r and gives connections back
// through handBack (which must not block for long: net/http's listener).
// respTimeout bounds the wait for an upstream's response head.
func NewConns(logger *slog.Logger, r Router, handBack func(net.Conn), respTimeout time.Duration) *Conns {
	if logger == nil {
		logger = slog.Default()
	}
	return &Conns{log: logger, router: r, handBack: handBack, respTimeout: respTimeout, idleAfter: idleTimeout, maxBody: maxLoopBody, hsTimeout: handshakeTimeout, life: life{epfd: -1, wakefd: -1},
		clients: map[uint32]*client{}, ups: map[uint32]*upstream{}, idle: map[poolKey][]*upstream{}, drained: make(chan struct{})}
}

// SetClientLimits sets the bounds of the client connections the loop
// holds (ClientLimits), for those it holds already too.
func (l *Conns) SetClientLimits(lim ClientLimits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idleAfter = max(lim.Idle, 0)
	l.maxBody = maxLoopBody
	if lim.MaxBody > 0 && lim.MaxBody < maxLoopBody {
		l.maxBody = int(lim.MaxBody)
	}
}

// Len is the number of client connections the loop holds.
func (l *Conns) Len() int { return int(l.live.Load()) }

// Served is the number of requests the loop forwarded itself.
func (l *Conns) Served() int64 { return l.served.Load() }

// HandedBack is the number of connections given back to net/http.
func (l *Conns) HandedBack() int64 { return l.handed.Load() }

// Adopt takes a client connection (HTTP/1.1, kept alive, its last response
// complete) with buffered, bytes it already sent that net/http read ahead.
// The connection is a socket, or a TLS connection made by ServerTLS (a
// *tls.Conn, or one wrapping it: see NetConn), its handshake done. The
// loop owns it from here on, whatever Adopt returns, and with it the
// connection's slot under a connection cap (see slot.go): given back when
// the loop closes the connection, handed on when it gives it back to
// net/http, and at once if Adopt fails.
func (l *Conns) Adopt(c net.Conn, buffered []byte) error {
	remote := c.RemoteAddr().String()
	cl := &client{conn: c, remote: remote, readable: true, since: time.Now()}
	var err error
	if tc, w := serverTLSOf(c); w != nil {
		cl.conn, cl.in, cl.tls, cl.release, err = takeTLSClient(c, tc, w, buffered)
		cl.fd = w.fd
	} else {
		cl.in = append([]byte(nil), buffered...)
		cl.fd, cl.release, err = takeClient(c)
	}
	if err != nil {
		return err
	}
	fd := cl.fd
	refuse := func(err error) error {
		_ = unix.Close(fd)
		cl.release()
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.draining {
		return refuse(ErrClosed)
	}
	if err := l.startLocked(); err != nil {
		return refuse(err)
	}
	cl.id = l.newIDLocked()
	if err := l.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, cl.id, sideC); err != nil {
		return refuse(fmt.Errorf("epoll add client: %w", err))
	}
	l.clients[cl.id] = cl
	l.fresh = append(l.fresh, cl)
	l.live.Add(1)
	// Its first events may already have passed: a wake makes the loop
	// look at it (readable is set).
	_ = l.wakeLocked()
	return nil
}

func (l *Conns) newIDLocked() uint32 {
	for l.nextID++; l.nextID == 0 || l.clients[l.nextID] != nil || l.ups[l.nextID] != nil; l.nextID++ {
	}
	return l.nextID
}

func (l *Conns) startLocked() error {
	return l.life.startLocked(unix.EPOLLIN|unix.EPOLLET, sideW, l.run)
}

func (l *Conns) ctl(op, fd int, events uint32, id uint32, side int32) error {
	return epollCtl(l.epfd, op, fd, events, id, side)
}

// Idle counts the client connections between requests (none under way,
// none begun).
func (l *Conns) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.clients {
		if c.state == stHead && len(c.in) == 0 && !c.unsent() {
			n++
		}
	}
	return n
}

// Drain stops taking connections and starting exchanges: a busy
// connection closes after its response (which says Connection: close),
// and the next request on an idle one is answered 503 + Retry-After +
// Connection: close (refuse). Idle connections stay open until Shutdown:
// closing one could cut a request already on its way, which the client
// would take for one that may have run.
func (l *Conns) Drain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draining = true
	l.noteDrainedLocked()
	if l.started && !l.closed {
		_ = l.wakeLocked()
	}
}

// noteDrainedLocked closes drained once a draining loop holds no client.
func (l *Conns) noteDrainedLocked() {
	if !l.draining || len(l.clients) > 0 {
		return
	}
	select {
	case <-l.drained:
	default:
		close(l.drained)
	}
}

// Shutdown drains the loop and waits until every busy connection has had
// its response (and closed), or until ctx is done, then closes the loop,
// as http.Server's Shutdown does for net/http's connections: an exchange
// cut short there may have run on the owner without its client knowing.
func (l *Conns) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.draining, l.quitting = true, true
	l.noteDrainedLocked()
	if l.started && !l.closed {
		_ = l.wakeLocked()
	}
	l.mu.Unlock()
	var err error
	select {
	case <-l.drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	return errors.Join(err, l.Close())
}

// Close closes every connection the loop holds and stops it.
func (l *Conns) Close() error {
	err := l.close()
	l.hsWG.Wait() // handshakes the loop let go of as it closed
	return err
}

// run is the loop.
func (l *Conns) run(epfd, wakefd int) {
	defer close(l.done)
	events := make([]unix.EpollEvent, maxEvents)
	buf := make([]byte, readBuf)
	var after []func()
	lastSweep := time.Now()
	timeout := sweepEvery
	for {
		n, err := l.wait(events, timeout)
		failed := err != nil
		if failed {
			l.log.Error("keep-alive loop: epoll_wait failed; closing every connection", "err", err)
		}
		l.mu.Lock()
		if failed {
			l.closed = true
		}
		if l.closed {
			l.shutdownLocked(&after)
			l.mu.Unlock()
			runEnded(after)
			return
		}
		for _, ev := range events[:max(n, 0)] {
			switch ev.Pad {
			case sideW:
				var b [8]byte
				_, _ = unix.Read(wakefd, b[:])
				// Adopted connections may hold a request already.
				for i, c := range l.fresh {
					l.fresh[i] = nil
					if c.state == stHead {
						l.drive(c, buf, &after)
					}
				}
				l.fresh = l.fresh[:0]
				for i, u := range l.shaken {
					l.shaken[i] = nil
					l.shook(u, buf, &after)
				}
				l.shaken = l.shaken[:0]
				if l.quitting {
					// Idle connections close, but one whose request
					// already arrived gets its answer (a 503) first.
					for _, c := range l.clients {
						if c.state != stHead || len(c.in) != 0 || c.unsent() {
							continue
						}
						if c.tls == nil && !quiet(c.fd) {
							c.readable = true
							l.drive(c, buf, &after)
							continue
						}
						l.closeClient(c, &after)
					}
				}
			case sideC:
				c := l.clients[uint32(ev.Fd)]
				if c == nil {
					continue
				}
				if ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 ||
					ev.Events&unix.EPOLLRDHUP != 0 && c.state != stHead {
					// Hung up mid-exchange (a stream the client left):
					// the upstream must see it too.
					l.closeClient(c, &after)
					continue
				}
				if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP) != 0 {
					c.readable = true
				}
				c.hup = c.hup || ev.Events&unix.EPOLLRDHUP != 0
				l.drive(c, buf, &after)
			case sideU:
				u := l.ups[uint32(ev.Fd)]
				if u == nil {
					continue
				}
				if u.c == nil {
					// Pooled: a hang-up, or bytes out of turn, end it. A
					// readiness edge for bytes already read with the last
					// response (edges queue per packet) is not one.
					if ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 || !u.quiet() {
						l.dropIdle(u)
					}
					continue
				}
				if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
					u.readable = true
				}
				u.hup = u.hup || ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
				l.drive(u.c, buf, &after)
			}
		}
		runq := l.runq
		l.runq = nil
		for _, c := range runq {
			c.queued = false
			if c.state != stClosed {
				l.drive(c, buf, &after)
			}
		}
		if now := time.Now(); now.Sub(lastSweep) >= sweepEvery {
			lastSweep = now
			l.sweepLocked(now, &after)
		}
		timeout = sweepEvery
		if len(l.runq) > 0 {
			timeout = 0 // bodies cut off by their read budget go on
		}
		l.mu.Unlock()
		after = runEnded(after)
	}
}

// sweepLocked ends what waited too long.
func (l *Conns) sweepLocked(now time.Time, after *[]func()) {
	for _, c := range l.clients {
		switch {
		case c.state == stHead && len(c.in) == 0 && l.idleAfter > 0 && now.Sub(c.since) > l.idleAfter,
			c.state == stHead && len(c.in) > 0 && now.Sub(c.since) > headTimeout:
			l.closeClient(c, after)
		case (c.state == stSend || c.state == stResp) && l.timedOut(c, now):
			l.upstreamFailed(c, ErrUpstreamTimeout, after)
		case c.state == stLinger && now.Sub(c.since) > lingerTimeout:
			l.closeClient(c, after)
		}
	}
	for key, us := range l.idle {
		kept := us[:0]
		for _, u := range us {
			if now.Sub(u.idleAt) > upstreamIdle {
				l.closeUp(u)
			} else {
				kept = append(kept, u)
			}
		}
		if len(kept) == 0 {
			delete(l.idle, key)
		} else {
			l.idle[key] = kept
		}
	}
}

// timedOut: c waited for its response head past its bound.
func (l *Conns) timedOut(c *client, now time.Time) bool {
	bound := l.respTimeout
	if c.fwd.Timeout != 0 {
		bound = c.fwd.Timeout
	}
	return bound > 0 && now.Sub(c.since) > bound
}

// drive moves c's exchange as far as it can go now.
func (l *Conns) drive(c *client, buf []byte, after *[]func()) {
	for c.state != stClosed {
		progressed := false
		switch c.state {
		case stHead:
			progressed = l.readRequest(c, buf, after)
		case stSend:
			progressed = l.send(c, after)
		case stResp:
			progressed = l.readResponse(c, buf, after)
		case stBody:
			progressed = l.relayBody(c, buf, after)
		case stLinger:
			progressed = l.linger(c, buf, after)
		}
		if !progressed {
			return
		}
	}
}

// readRequest reads and routes the next request; true if the state moved.
func (l *Conns) readRequest(c *client, buf []byte, after *[]func()) bool {
	if c.unsent() && !l.flush(c, after) {
		return false
	}
	for {
		before := c.hs.scanned
		n, need, ok := parseRequest(c.in, &c.hs, &l.scratch, l.maxBody)
		l.headWork += int64(c.hs.scanned - before)
		if l.draining && (!ok || !need) {
			// Not handed back: net/http may have stopped taking
			// connections, and one given to it then closes unanswered.
			l.refuse(c)
			return true
		}
		if !ok {
			l.giveBack(c, after)
			return false
		}
		if !need {
			h := &l.scratch
			h.RemoteAddr, h.Conn = c.remote, c.conn
			h.Ticket = Ticket{l: l, id: c.id, seq: c.seq + 1}
			fwd, ok := l.router.Route(h)
			if !ok {
				l.giveBack(c, after)
				return false
			}
			c.seq++
			c.reqLen, c.fwd, c.sent100, c.retried = n, fwd, false, false
			c.idem = h.Method == "GET" || h.Method == "HEAD" || h.Method == "OPTIONS"
			c.isHead = h.Method == "HEAD"
			c.wrote = false
			u, err := l.upstreamFor(poolKey{fwd.Addr, fwd.TLS})
			if u == nil {
				if fwd.Final {
					l.unavailable(c, notSent(fmt.Errorf("%w: %w", ErrUpstreamFailed, err)), after)
					return c.state == stHead
				}
				l.finish(c, 0, nil, after)
				l.giveBack(c, after) // cannot connect: net/http tries, and answers
				return false
			}
			l.start(c, u)
			return true
		}
		if l.scratch.expect && !c.sent100 && len(c.in) > 0 {
			// The head is whole and the client waits to send the body.
			c.sent100 = true
			c.out = append(c.out, "HTTP/1.1 100 Continue\r\n\r\n"...)
			if !l.flush(c, after) {
				return false
			}
		}
		if !c.readable {
			return false
		}
		if len(c.in) == 0 {
			c.since = time.Now() // the head timeout runs from its first byte
		}
		if !l.readInto(c.fd, c.tls, &c.in, buf, maxHead+maxLoopBody, &c.readable, c.hup) {
			l.closeClient(c, after) // the client closed or failed between requests
			return false
		}
	}
}

// unsent: bytes for the client wait, in c.out or (TLS) in its wire, for
// the socket to take them.
func (c *client) unsent() bool {
	return len(c.out) > 0 || c.tls != nil && len(c.tls.wire.out) > 0
}

// consume drops the current request from c.in: the next one's head is
// searched for from its start.
func (c *client) consume() {
	c.in = c.in[:copy(c.in, c.in[c.reqLen:])]
	c.reqLen, c.hs = 0, headScan{}
}

// shuttingDown is a draining loop's answer to a request it does not start.
var shuttingDown = func() []byte {
	r := httpx.Unanswered{Outcome: httpx.OutcomeUnreachable, Status: http.StatusServiceUnavailable,
		Message: httpx.ShuttingDownMsg, RetryAfter: time.Second}.AppendResponse(nil)
	line := bytes.Index(r, []byte("\r\n")) + 2
	return slices.Concat(r[:line], []byte("Connection: close\r\n"), r[line:])
}()

// refuse answers the request at the head of c.in, which a draining loop
// does not start, 503 + Retry-After + Connection: close (it certainly did
// not run), and makes c linger.
func (l *Conns) refuse(c *client) {
	c.in, c.reqLen, c.hs = c.in[:0], 0, headScan{}
	c.out = append(c.out, shuttingDown...)
	c.wrote = true
	c.state, c.since = stLinger, time.Now()
}

// linger is a refused client's last state: once the answer is out, the
// write side is shut and whatever the client still sends (the rest of a
// body) is read and dropped until it closes (or lingerTimeout, the
// sweep's), so that closing with unread bytes, which makes the kernel
// reset the connection, cannot destroy the answer before the client read
// it. A TLS client (a peer node) closes once the answer is out.
func (l *Conns) linger(c *client, buf []byte, after *[]func()) bool {
	if c.unsent() && !l.flush(c, after) {
		return false
	}
	if c.tls != nil {
		l.closeClient(c, after)
		return false
	}
	if !c.shut {
		c.shut = true
		_ = unix.Shutdown(c.fd, unix.SHUT_WR)
	}
	for c.readable {
		c.in = c.in[:0]
		if !l.readInto(c.fd, nil, &c.in, buf, len(buf), &c.readable, c.hup) {
			l.closeClient(c, after) // the client closed: done
			return false
		}
	}
	c.in = c.in[:0]
	return false
}

// start sends c's routed request on u.
func (l *Conns) start(c *client, u *upstream) {
	c.up, u.c = u, c
	u.out, u.in, u.hs, u.sent, u.eof = c.fwd.Wire, u.in[:0], headScan{}, false, false
	c.state, c.since = stSend, time.Now()
}

// readInto reads fd (through t, a TLS connection's, if not nil) until it is
// drained (readable goes false) or limit bytes are buffered; false on EOF
// or an error. A plain read shorter than asked drained the socket: more
// data arriving later is a new edge, so the EAGAIN read that would only
// confirm it is skipped (a syscall a request on each side). Once the peer
// hung up, it reads on to the EOF, which no later edge would report.
func (l *Conns) readInto(fd int, t *tlsEnd, dst *[]byte, buf []byte, limit int, readable *bool, hup bool) bool {
	for len(*dst) < limit {
		want := min(len(buf), limit-len(*dst))
		var n int
		var err error
		if t == nil {
			n, err = sysRead(fd, buf[:want])
		} else {
			n, err = t.read(buf[:want])
		}
		switch {
		case errors.Is(err, unix.EAGAIN):
			*readable = false
			return true
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil, n == 0:
			return false
		}
		*dst = append(*dst, buf[:n]...)
		if n < want && !hup && t == nil {
			*readable = false
			return true
		}
	}
	return true
}

// send writes the request upstream; true once all of it is out.
func (l *Conns) send(c *client, after *[]func()) bool {
	u := c.up
	if u.tls != nil {
		return l.sendTLS(c, after)
	}
	n, err := writeAll(u.fd, u.out)
	u.out = u.out[n:]
	u.sent = u.sent || n > 0
	if err != nil {
		l.upstreamFailed(c, fmt.Errorf("%w: %w", ErrUpstreamFailed, err), after)
		return false
	}
	if len(u.out) > 0 {
		return false // EPOLLOUT brings us back
	}
	u.out = nil
	c.state, c.since = stResp, time.Now()
	return true
}

// readResponse reads the response head and sets up the body's relay.
func (l *Conns) readResponse(c *client, buf []byte, after *[]func()) bool {
	u := c.up
	for {
		if c.unsent() && !l.flush(c, after) {
			return false // an informational response still going out
		}
		before := u.hs.scanned
		r, need, ok := parseResponse(u.in, &u.hs, c.fwd.Refusal, c.hbuf[:0])
		l.headWork += int64(u.hs.scanned - before)
		if r.head != nil {
			// Kept as the head grew it, for the next one: a head not
			// whole yet (the usual first look, before the answer came)
			// has none, and must not drop it.
			c.hbuf = r.head[:0]
		}
		if !ok {
			l.upstreamFailed(c, ErrUpstreamProtocol, after)
			return false
		}
		if !need {
			switch {
			case r.refusal != "" && c.fwd.Refused != nil && c.fwd.Refused(r.status, r.refusal) && !c.wrote:
				// The owner ran nothing: net/http replays the request,
				// with its own handling of refusals.
				l.closeUp(u)
				c.up = nil
				if c.fwd.Final {
					l.unavailable(c, notSent(ErrRefused), after) // it ran nothing
					return c.state == stHead
				}
				l.finish(c, 0, nil, after)
				l.giveBack(c, after)
				return false
			case r.status == 101:
				l.upstreamFailed(c, fmt.Errorf("%w: switched protocols unasked", ErrUpstreamProtocol), after)
				return false
			case r.status >= 100 && r.status < 200:
				// Informational: pass it on, the final response follows.
				c.out = append(c.out, r.head...)
				u.in = u.in[:copy(u.in, u.in[r.headLen:])]
				u.hs = headScan{}
				c.wrote = true
				continue
			}
			l.startBody(c, r, after)
			return true
		}
		if u.eof {
			l.upstreamFailed(c, ErrUpstreamFailed, after)
			return false
		}
		if !u.readable {
			return false
		}
		if !l.readInto(u.fd, u.tls, &u.in, buf, maxRespHead+1, &u.readable, u.hup) {
			// Closed: what it sent before may still be a whole response.
			u.eof, u.readable = true, false
		}
	}
}

func (l *Conns) startBody(c *client, r response, after *[]func()) {
	u := c.up
	c.resp = r
	c.out = append(c.out, r.head...)
	if l.draining {
		c.out = append(c.out[:len(c.out)-2], "Connection: close\r\n\r\n"...)
		c.closeAft = true
	}
	c.wrote = true
	c.left, c.toEOF, c.sc = 0, false, chunkScanner{}
	switch {
	case c.isHead || r.status == 204 || r.status == 304:
		c.resp.chunked = false
	case r.chunked:
	case r.clen >= 0:
		c.left = r.clen
	default:
		c.toEOF, c.closeAft = true, true
	}
	if head := c.fwd.Head; head != nil {
		status, stream := r.status, c.resp.chunked || c.toEOF
		*after = append(*after, func() { head(status, stream) })
	}
	// The request is answered: it can no longer be replayed.
	c.consume()
	u.in = u.in[:copy(u.in, u.in[r.headLen:])]
	u.hs = headScan{}
	c.state = stBody
}

// relayBody moves body bytes upstream → client; true when the exchange
// ended and the client is ready for its next request.
func (l *Conns) relayBody(c *client, buf []byte, after *[]func()) bool {
	u := c.up
	fixed := !c.resp.chunked && !c.toEOF
	for reads := 0; ; {
		if len(u.in) > 0 && !(fixed && c.left == 0) {
			data := u.in
			switch {
			case c.resp.chunked:
				end, err := c.sc.scan(data)
				if err != nil {
					l.upstreamFailed(c, ErrUpstreamProtocol, after)
					return false
				}
				if end >= 0 {
					data = data[:end]
				}
			case fixed:
				if int64(len(data)) > c.left {
					data = data[:c.left]
				}
				c.left -= int64(len(data))
			}
			c.out = append(c.out, data...)
			u.in = u.in[:copy(u.in, u.in[len(data):])]
		}
		if fixed && c.left == 0 || c.resp.chunked && c.sc.state == csDone {
			return l.endExchange(c, after)
		}
		if c.unsent() && !l.flush(c, after) {
			return false // the client is slow: the upstream waits (EPOLLOUT brings us back)
		}
		if u.eof {
			if c.toEOF {
				return l.endExchange(c, after) // a close-delimited body ends with the close
			}
			l.upstreamFailed(c, ErrUpstreamFailed, after)
			return false
		}
		if !u.readable {
			return false
		}
		if reads++; reads > turnReads {
			// A fast body with a fast client would hold the loop for as
			// long as it lasts: the others get their turn first.
			if !c.queued {
				c.queued = true
				l.runq = append(l.runq, c)
			}
			return false
		}
		var n int
		var err error
		if u.tls == nil {
			n, err = sysRead(u.fd, buf)
		} else {
			n, err = u.tls.read(buf)
		}
		switch {
		case errors.Is(err, unix.EAGAIN):
			u.readable = false
			return false
		case errors.Is(err, unix.EINTR):
			continue
		case err == nil && n == 0 && c.toEOF:
			// A close-delimited body ends with the upstream's close.
			return l.endExchange(c, after)
		case err != nil || n == 0:
			l.upstreamFailed(c, ErrUpstreamFailed, after)
			return false
		}
		u.in = append(u.in, buf[:n]...)
		if n < len(buf) && !u.hup && u.tls == nil {
			u.readable = false // drained (see readInto)
		}
	}
}

// endExchange: the whole response is in c.out (or out already). The
// upstream connection is pooled if it can carry another request, and the
// client goes back to reading requests (or closes once out is written).
func (l *Conns) endExchange(c *client, after *[]func()) bool {
	u := c.up
	c.up = nil
	// A TLS connection read short of EAGAIN may hold more than the
	// response in its tls.Conn, where no readiness edge will report it.
	keep := len(u.in) == 0 && !c.resp.close && !c.toEOF && !u.eof && (u.tls == nil || !u.readable || u.tls.quiet())
	l.finish(c, c.resp.status, nil, after)
	if keep {
		l.pool(u)
	} else {
		l.closeUp(u)
	}
	c.state, c.since = stHead, time.Now()
	if !l.flush(c, after) {
		return false
	}
	// An idle connection keeps no large buffers (an upload or a long
	// response grew them).
	if len(c.in) == 0 && cap(c.in) > 4<<10 {
		c.in = nil
	}
	if cap(c.out) > readBuf {
		c.out = nil
	}
	return c.state == stHead
}

// flush writes c.out; true when all of it is out. A closed client is
// closed here (state stClosed).
func (l *Conns) flush(c *client, after *[]func()) bool {
	var err error
	if c.tls == nil {
		var n int
		n, err = writeAll(c.fd, c.out)
		c.out = c.out[:copy(c.out, c.out[n:])]
	} else {
		err = c.tls.send(c.out)
		c.out = c.out[:0]
	}
	if err != nil {
		l.closeClient(c, after)
		return false
	}
	if c.unsent() {
		return false
	}
	if c.closeAft && c.state == stHead {
		l.closeClient(c, after)
		return false
	}
	return true
}

// upstreamFailed ends c's exchange after an upstream failure: replayed by
// net/http if nothing was answered and sending it again is safe (a Final
// request: sent again on a fresh connection, once, if a pooled one was
// dead), else a 503 if nothing was answered yet, else the client
// connection closes (a response cut short must not look whole).
func (l *Conns) upstreamFailed(c *client, err error, after *[]func()) {
	u := c.up
	c.up = nil
	if u != nil {
		l.closeUp(u)
	}
	switch {
	case c.wrote:
		l.finish(c, c.resp.status, err, after)
		l.closeClient(c, after)
	case c.fwd.Final && deadPooled(u, err) && !c.retried && (c.idem || !u.sent):
		// A pooled connection the upstream had closed, or that died under
		// the request before any answer: once more, on a fresh one, if
		// sending it again is safe (as net/http's Transport decides: a
		// handler may have run it before the connection died).
		c.retried = true
		nu, derr := l.dial(u.key)
		if nu == nil {
			err = fmt.Errorf("%w; a fresh connection: %w", err, derr)
			if !u.sent {
				err = notSent(err)
			}
			l.unavailable(c, err, after)
			return
		}
		l.start(c, nu)
		if !c.queued {
			c.queued = true
			l.runq = append(l.runq, c)
		}
	case !c.fwd.Final && u != nil && !u.sent,
		!c.fwd.Final && c.idem && deadPooled(u, err):
		// Nothing reached the owner (the connection was refused), or a
		// pooled connection the owner had closed: net/http sends it again.
		l.finish(c, 0, nil, after)
		l.giveBack(c, after)
	default:
		if u == nil || !u.sent {
			err = notSent(err)
		}
		l.unavailable(c, err, after)
	}
}

// deadPooled: u, a pooled connection, failed (a write refused with EPIPE
// or ECONNRESET, a read at EOF) before any byte of a response came back on
// it: the upstream had closed it, so what failed is the connection, not
// the request. A response begun (even a malformed one) or a timeout is
// the request's own outcome.
func deadPooled(u *upstream, err error) bool {
	return u != nil && u.reused && len(u.in) == 0 && !errors.Is(err, ErrUpstreamTimeout) && !errors.Is(err, ErrUpstreamProtocol)
}

// notSent marks err as an exchange's failure before any of its request
// reached the upstream (httpx.ErrNotSent): it certainly did not run.
func notSent(err error) error { return fmt.Errorf("%w: %w", httpx.ErrNotSent, err) }

// unavailable answers c's request, which got no response, as
// httpx.ClassifyUnanswered says: 503 + Retry-After if nothing of it reached
// the upstream (err wraps httpx.ErrNotSent), else 504, the request may have
// run. err is why (Forward.Done).
func (l *Conns) unavailable(c *client, err error, after *[]func()) {
	msg := c.fwd.FailMsg
	if msg == "" {
		msg = "owner unreachable"
	}
	u := httpx.ClassifyUnanswered(err, msg)
	l.finish(c, u.Status, err, after)
	c.consume()
	c.out = u.AppendResponse(c.out[:0])
	c.state, c.since, c.wrote = stHead, time.Now(), true
	if l.flush(c, after) && l.draining {
		l.closeClient(c, after)
	}
}

func (l *Conns) finish(c *client, status int, err error, after *[]func()) {
	if err == nil && status != 0 {
		l.served.Add(1)
	}
	if done := c.fwd.Done; done != nil {
		c.fwd.Done = nil
		*after = append(*after, func() { done(status, err) })
	}
}

// upstreamFor takes a pooled connection for key, or connects one (nil
// and why if it cannot).
func (l *Conns) upstreamFor(key poolKey) (*upstream, error) {
	if us := l.idle[key]; len(us) > 0 {
		// An emptied list stays, with its room, for the connection's
		// return; the sweep deletes lists left empty.
		u := us[len(us)-1]
		us[len(us)-1] = nil
		l.idle[key] = us[:len(us)-1]
		u.reused = true
		return u, nil
	}
	return l.dial(key)
}

// dial connects a new upstream connection for key (nil and why if it cannot); a
// TLS one starts its handshake (tls_linux.go).
func (l *Conns) dial(key poolKey) (*upstream, error) {
	family, sa, err := sockaddr(key.addr)
	if err != nil {
		return nil, err
	}
	fd, err := connect(family, sa)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", key.addr, err)
	}
	u := &upstream{fd: fd, key: key, id: l.newIDLocked()}
	if key.tls != nil {
		if err := l.startHandshake(u); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("tls handshake with %s: %w", key.addr, err)
		}
		l.ups[u.id] = u
		return u, nil
	}
	if err := l.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, u.id, sideU); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	l.ups[u.id] = u
	return u, nil
}

// sockaddr is addr as the kernel takes it: a unix socket's path (any
// address with a '/', absolute or relative to the working directory, as
// net.Dial("unix") takes it), else an IP literal and a port.
func sockaddr(addr string) (family int, sa unix.Sockaddr, err error) {
	if strings.Contains(addr, "/") {
		return unix.AF_UNIX, &unix.SockaddrUnix{Name: addr}, nil
	}
	ip, port, ok := ipPort(addr)
	if !ok {
		return 0, nil, fmt.Errorf("%q is neither a unix socket path nor an IP literal and a port", addr)
	}
	if ip4 := ip.To4(); ip4 != nil {
		s := &unix.SockaddrInet4{Port: port}
		copy(s.Addr[:], ip4)
		return unix.AF_INET, s, nil
	}
	s := &unix.SockaddrInet6{Port: port}
	copy(s.Addr[:], ip.To16())
	return unix.AF_INET6, s, nil
}

// connect starts a non-blocking connection; the request is queued on it
// at once and goes out when it is established (EPOLLOUT), and a refused
// connection shows as a failed write or read. A unix listener whose
// backlog is full (EAGAIN) counts as unreachable.
func connect(family int, sa unix.Sockaddr) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family != unix.AF_UNIX {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// quiet reports whether u, pooled, has nothing to read and is still open.
func (u *upstream) quiet() bool {
	if u.tls != nil {
		return u.tls.quiet()
	}
	return quiet(u.fd)
}

// quiet reports whether fd has nothing to read and is still open.
func quiet(fd int) bool {
	var b [1]byte
	for {
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return true
		}
		return false // bytes, EOF or an error
	}
}

// pool keeps u for the next request to its address.
func (l *Conns) pool(u *upstream) {
	if l.draining {
		l.closeUp(u)
		return
	}
	u.c, u.in, u.out, u.idleAt = nil, u.in[:0], nil, time.Now()
	if cap(u.in) > readBuf {
		u.in = nil
	}
	l.idle[u.key] = append(l.idle[u.key], u)
}

func (l *Conns) dropIdle(u *upstream) {
	us := l.idle[u.key]
	for i, x := range us {
		if x == u {
			l.idle[u.key] = append(us[:i], us[i+1:]...)
			break
		}
	}
	if len(l.idle[u.key]) == 0 {
		delete(l.idle, u.key)
	}
	l.closeUp(u)
}

func (l *Conns) closeUp(u *upstream) {
	if u.fd < 0 {
		return
	}
	if u.tls != nil && u.tls.abandon() {
		// Its handshake goroutine holds the descriptor, and closes it.
		u.fd = -1
		delete(l.ups, u.id)
		return
	}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, u.fd, nil)
	_ = unix.Close(u.fd)
	u.fd = -1
	delete(l.ups, u.id)
}

// closeClient closes c and ends its exchange, if any (the client is gone:
// the upstream request ends too).
func (l *Conns) closeClient(c *client, after *[]func()) { l.closeClientErr(c, ErrClientGone, after) }

// Ticket names one exchange of a kept-alive loop (ReqHead.Ticket).
type Ticket struct {
	l       *Conns
	id, seq uint32
}

// Abort ends the exchange if it is still under way: the client connection
// closes (a response cut short must not look whole), the upstream request
// ends, and Done reports ErrAborted. Safe from any goroutine, any number
// of times; it does nothing once the exchange is over.
func (t Ticket) Abort() {
	l := t.l
	if l == nil {
		return
	}
	var after []func()
	l.mu.Lock()
	if c := l.clients[t.id]; c != nil && c.seq == t.seq && c.up != nil {
		l.closeClientErr(c, ErrAborted, &after)
	}
	l.mu.Unlock()
	runEnded(after)
}

func (l *Conns) closeClientErr(c *client, err error, after *[]func()) {
	if c.state == stClosed {
		return
	}
	if c.up != nil {
		status := 0
		if c.wrote {
			status = c.resp.status
		}
		l.finish(c, status, err, after)
		l.closeUp(c.up)
		c.up = nil
	}
	l.detach(c)
	_ = unix.Close(c.fd)
	*after = append(*after, c.takeRelease())
}

// takeRelease returns c's slot release (for one call) and forgets it.
func (c *client) takeRelease() func() {
	rel := c.release
	c.release = nil
	if rel == nil {
		return func() {}
	}
	return rel
}

// detach takes c out of the loop (its descriptor stays open).
func (l *Conns) detach(c *client) {
	c.state = stClosed
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	delete(l.clients, c.id)
	l.live.Add(-1)
	l.noteDrainedLocked()
}

// giveBack hands c to net/http with the bytes it has not answered (a
// TLS client: the object Adopt took, see giveBackTLS).
func (l *Conns) giveBack(c *client, after *[]func()) {
	l.detach(c)
	l.handed.Add(1)
	fd, pending, release := c.fd, c.in, c.takeRelease()
	if c.tls != nil {
		l.giveBackTLS(c, pending, release, after)
		return
	}
	*after = append(*after, func() {
		f := os.NewFile(uintptr(fd), "client")
		nc, err := net.FileConn(f) // a duplicate, in Go's poller
		_ = f.Close()
		if err != nil {
			release()
			l.log.Debug("keep-alive loop: giving a connection back failed; closed it", "err", err)
			return
		}
		l.handBack(&prefixConn{Conn: nc, prefix: pending, release: release})
	})
}

func (l *Conns) shutdownLocked(after *[]func()) {
	for _, c := range l.clients {
		l.closeClient(c, after)
	}
	for _, u := range l.ups {
		l.closeUp(u)
	}
	l.idle = map[poolKey][]*upstream{}
	clear(l.shaken)
	l.shaken = l.shaken[:0]
	l.closeEpollLocked()
}
