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

// shuttingDown is a draining loop's answer to a request it does not start.
var shuttingDown = func() []byte {
	r := httpx.Unanswered{Outcome: httpx.OutcomeUnreachable, Status: http.StatusServiceUnavailable,
		Message: httpx.ShuttingDownMsg, RetryAfter: time.Second}.AppendResponse(nil)
	line := bytes.Index(r, []byte("\r\n")) + 2
	return slices.Concat(r[:line], []byte("Connection: close\r\n"), r[line:])
}()

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
