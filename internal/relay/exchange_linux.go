//go:build linux

package relay

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// One client's exchange, driven by the loop (Conns.run): read a request, hand it to the
// Router, send it upstream, read the response and relay its body, then the next request or
// the connection back to net/http.

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
