//go:build linux

package relay

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// TLS upstreams (Forward.TLS), and TLS clients (ServerTLS,
// tlsclient_linux.go). There is no kernel TLS here, so the loop runs
// crypto/tls in user space over the connection's non-blocking descriptor,
// and stays one goroutine that never waits on a socket. A tlsWire has two
// modes: in poller mode (an upstream's handshake; a client's whole life
// under net/http) a duplicate of its descriptor in Go's poller carries its
// I/O, which waits there like any Go conn's; in loop mode the loop reads
// and writes the descriptor itself and nothing waits. For an upstream:
//
//   - the handshake runs on a goroutine of its own (handshake), which
//     waits in Go's poller on a duplicate of the descriptor, bounded by
//     the loop's handshake timeout; meanwhile the descriptor is not in the
//     loop's epoll set and the client stays in stSend. When it ends, the
//     loop takes the upstream back (shaken, through wakefd) and registers
//     it; a handshake that failed is a connection that could not be made.
//   - after it, the loop reads and writes through a tls.Conn over
//     tlsWire, which never blocks: a read that would block returns
//     errWouldBlock, a temporary net.Error, which crypto/tls does not keep
//     (readRecordOrCCS) and which leaves a partial record buffered in the
//     tls.Conn; a write never fails for want of room (crypto/tls keeps
//     every write error): what the socket does not take waits in
//     tlsWire.out, which the loop flushes on EPOLLOUT.

// handshakeTimeout bounds a TLS upstream's connect and handshake.
const handshakeTimeout = 5 * time.Second

// aLongTimeAgo is a deadline that has passed: it ends a handshake's wait.
var aLongTimeAgo = time.Unix(1, 0)

// tlsEnd is the loop's state of a TLS connection it holds: an upstream,
// or a client adopted from net/http.
type tlsEnd struct {
	conn *tls.Conn
	wire *tlsWire
	// hs is set while the handshake goroutine holds the connection, and
	// until the loop takes it back (shaken).
	hs  *handshake
	eof bool  // the peer's stream ended (read returns 0, nil from now on)
	err error // a read failed after returning bytes: the next read says so
}

// handshake is one handshake under way, shared by its goroutine and the
// loop under the loop's lock.
type handshake struct {
	done bool  // the goroutine is finished with the descriptor
	err  error // why the handshake failed, once done
	// abandoned: the loop let go of the upstream while the goroutine held
	// it; the goroutine closes the descriptor.
	abandoned bool
}

// startHandshake makes u, a connection just started to a TLS address, a
// TLS client connection, its handshake under way on a goroutine. The
// descriptor stays out of the loop's epoll set until the loop takes it
// back (shook).
func (l *Conns) startHandshake(u *upstream) error {
	t, err := newTLSUp(u.fd, u.key.addr, u.key.tls, l.hsTimeout)
	if err != nil {
		return err
	}
	u.tls = t
	l.hsWG.Add(1)
	go l.handshake(u)
	return nil
}

// newTLSUp makes fd, a connection to addr, a TLS client connection with
// cfg, ready for its handshake, which waits in Go's poller (the wire in
// poller mode) for up to timeout; handshook ends that.
func newTLSUp(fd int, addr string, cfg *tls.Config, timeout time.Duration) (*tlsEnd, error) {
	w := &tlsWire{fd: fd, laddr: wireAddr(""), raddr: wireAddr(addr)}
	if err := w.toPoller(); err != nil {
		return nil, err
	}
	if err := w.pc.SetDeadline(time.Now().Add(timeout)); err != nil {
		w.toLoop()
		return nil, err
	}
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		// As tls.Dial does: the name checked is the address's host.
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	t := &tlsEnd{wire: w, hs: &handshake{}}
	t.conn = tls.Client(w, cfg)
	return t, nil
}

// handshook records the handshake's end (err: why it failed): the
// descriptor is the loop's from here on, and never waited on.
func (t *tlsEnd) handshook(err error) {
	t.wire.toLoop()
	t.hs.done, t.hs.err = true, err
}

// handshake runs u's TLS handshake, off the loop, and hands u back to
// the loop (or closes its descriptor, if the loop let go of it).
func (l *Conns) handshake(u *upstream) {
	defer l.hsWG.Done()
	t := u.tls
	err := t.conn.Handshake()
	l.mu.Lock()
	defer l.mu.Unlock()
	t.handshook(err)
	if t.hs.abandoned {
		_ = unix.Close(t.wire.fd)
		return
	}
	l.shaken = append(l.shaken, u)
	_ = l.wakeLocked()
}

// shook takes back u, whose handshake ended: the exchange waiting on it
// goes on, or fails as one whose upstream could not be reached (nothing
// of its request was sent).
func (l *Conns) shook(u *upstream, buf []byte, after *[]func()) {
	h := u.tls.hs
	u.tls.hs = nil
	c := u.c
	if u.fd < 0 || c == nil {
		return // the exchange ended meanwhile, and closed u
	}
	err := h.err
	if err == nil {
		err = l.ctl(unix.EPOLL_CTL_ADD, u.fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET, u.id, sideU)
	}
	if err != nil {
		l.upstreamFailed(c, fmt.Errorf("%w: tls handshake: %w", ErrUpstreamFailed, err), after)
		if c.state == stClosed {
			return
		}
	} else {
		u.readable = true // whatever came with the handshake's last bytes
	}
	l.drive(c, buf, after)
}

// abandon lets go of u while its handshake goroutine holds the
// descriptor: the goroutine's wait ends now, and it closes the descriptor.
// false if the handshake was over already.
func (t *tlsEnd) abandon() bool {
	h := t.hs
	if h == nil || h.done {
		return false
	}
	h.abandoned = true
	_ = t.wire.pc.SetDeadline(aLongTimeAgo)
	return true
}

// sendTLS is send for a TLS upstream: the request goes through the
// tls.Conn to the wire, which writes what the socket takes and keeps the
// rest; the request counts as sent once none is left.
func (l *Conns) sendTLS(c *client, after *[]func()) bool {
	u := c.up
	t := u.tls
	if t.hs != nil {
		return false // shook brings it back
	}
	before := t.wire.written
	err := t.send(u.out)
	u.out = nil
	u.sent = u.sent || t.wire.written > before
	if err != nil {
		l.upstreamFailed(c, fmt.Errorf("%w: %w", ErrUpstreamFailed, err), after)
		return false
	}
	if len(t.wire.out) > 0 {
		return false // EPOLLOUT brings us back
	}
	c.state, c.since = stResp, time.Now()
	return true
}

// send writes p through the tls.Conn, and as much as the socket takes of
// what waits in the wire: the rest stays there, in order, for the next
// send (on EPOLLOUT). Nothing is left once len(t.wire.out) is 0.
func (t *tlsEnd) send(p []byte) error {
	if len(p) > 0 {
		if _, err := t.conn.Write(p); err != nil {
			return err
		}
	}
	_, err := t.wire.flush()
	return err
}

// read is sysRead for a TLS connection, decrypted: n bytes; (0, EAGAIN)
// once the socket and the tls.Conn hold no more; (0, nil) at the end of
// the peer's stream (a close_notify, or an EOF between records). A short
// read does not mean the socket is drained: the tls.Conn returns one
// record at a time, and may hold more already read.
func (t *tlsEnd) read(p []byte) (int, error) {
	switch {
	case t.err != nil:
		return 0, t.err
	case t.eof:
		return 0, nil
	case len(t.wire.out) > 0:
		// Written while reading (a key update's answer): send it first.
		if _, err := t.wire.flush(); err != nil {
			return 0, err
		}
	}
	n, err := t.conn.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, errWouldBlock):
		if n == 0 {
			return 0, unix.EAGAIN
		}
	case errors.Is(err, io.EOF):
		t.eof = true
	case n > 0:
		t.err = err
	default:
		return 0, err
	}
	return n, nil
}

// quiet reports whether a pooled TLS upstream is open with nothing for
// the loop: what arrived while it was idle (a session ticket, a key
// update) is consumed through the tls.Conn, without waiting; application
// data, a close_notify, an EOF or an error are not quiet.
func (t *tlsEnd) quiet() bool {
	var b [1]byte
	n, err := t.read(b[:])
	return n == 0 && errors.Is(err, unix.EAGAIN) && len(t.wire.out) == 0
}

// tlsWire is the net.Conn under a tls.Conn the loop runs: its descriptor,
// fd, which is the wire's for the connection's life, and in poller mode
// pc, a duplicate of it in Go's poller (see the top of this file). The
// mode changes only while nothing uses the wire.
type tlsWire struct {
	fd           int
	laddr, raddr net.Addr
	out          []byte // loop mode: bytes the socket has not taken yet, in order
	written      int64  // loop mode: bytes the socket took
	err          error  // loop mode: a write failed: every later one fails too
	// pc, in poller mode, carries the wire's I/O, deadlines and Close
	// (nil: loop mode).
	pc net.Conn
	// mu guards what Close and Detach, from any goroutine, share.
	mu      sync.Mutex
	closed  bool
	release func() // a client's slot under a connection cap (slot.go), until Detach
}

// toPoller puts w in poller mode: its I/O goes through a duplicate of its
// descriptor in Go's poller. Bytes loop mode kept go out first (Write).
func (w *tlsWire) toPoller() error {
	dup, err := unix.FcntlInt(uintptr(w.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup: %w", err)
	}
	pc, err := pollerConn(dup)
	if err != nil {
		return err
	}
	w.pc = pc
	return nil
}

// toLoop puts w in loop mode: the duplicate in Go's poller closes, and
// its descriptor is the loop's alone.
func (w *tlsWire) toLoop() {
	_ = w.pc.Close()
	w.pc = nil
}

// pollerConn makes fd a net.Conn in Go's poller (a duplicate of fd; fd
// itself is closed).
func pollerConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "relay")
	c, err := net.FileConn(f)
	_ = f.Close()
	return c, err
}

// wouldBlock is the wire's EAGAIN: a temporary net.Error, which
// crypto/tls returns without keeping it.
type wouldBlock struct{}

func (wouldBlock) Error() string   { return "relay: tls upstream would block" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

var errWouldBlock net.Error = wouldBlock{}

// Read reads what the socket has: in loop mode errWouldBlock if nothing
// yet; in poller mode it waits.
func (w *tlsWire) Read(p []byte) (int, error) {
	if w.pc != nil {
		return w.pc.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := sysRead(w.fd, p)
		switch {
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EAGAIN):
			return 0, errWouldBlock
		case !errors.Is(err, unix.EINTR):
			return 0, err
		}
	}
}

// Write, in loop mode, writes what the socket takes and keeps the rest
// for flush; it fails only when the socket does. In poller mode it waits
// until all of p (after what loop mode kept) is out.
func (w *tlsWire) Write(p []byte) (int, error) {
	if w.pc != nil {
		if len(w.out) > 0 {
			if _, err := w.pc.Write(w.out); err != nil {
				return 0, err
			}
			w.out = nil
		}
		return w.pc.Write(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	n := 0
	if len(w.out) == 0 {
		var err error
		n, err = writeAll(w.fd, p)
		w.written += int64(n)
		if err != nil {
			w.err = err
			return n, err
		}
	}
	w.out = append(w.out, p[n:]...)
	return len(p), nil
}

// flush writes what Write kept; true once nothing is left.
func (w *tlsWire) flush() (bool, error) {
	if w.err != nil {
		return false, w.err
	}
	if len(w.out) == 0 {
		return true, nil
	}
	n, err := writeAll(w.fd, w.out)
	w.written += int64(n)
	w.out = w.out[:copy(w.out, w.out[n:])]
	if err != nil {
		w.err = err
		return false, err
	}
	if len(w.out) > 0 {
		return false, nil
	}
	if cap(w.out) > readBuf {
		w.out = nil // an upload grew it
	}
	return true, nil
}

// Close, in poller mode, closes the connection (no one else holds it)
// and gives its slot back. In loop mode it does nothing: the loop closes
// the descriptor (closeUp, closeClient), with no close_notify.
func (w *tlsWire) Close() error {
	if w.pc == nil {
		return nil
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return net.ErrClosed
	}
	w.closed = true
	rel := w.release
	w.release = nil
	w.mu.Unlock()
	err := w.pc.Close()
	_ = unix.Close(w.fd)
	if rel != nil {
		rel()
	}
	return err
}

// Detach hands the connection's slot over (see slot.go): Close no longer
// gives it back. nil if it holds none.
func (w *tlsWire) Detach() func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	rel := w.release
	w.release = nil
	return rel
}

// LocalAddr and RemoteAddr are the connection's (a client's, from its
// accept), or for an upstream none and its address as Forward.Addr names
// it (crypto/tls keys its session cache by it when the config names no
// server).
func (w *tlsWire) LocalAddr() net.Addr  { return w.laddr }
func (w *tlsWire) RemoteAddr() net.Addr { return w.raddr }

// The deadlines are the poller's in poller mode; in loop mode the loop
// keeps its own.
func (w *tlsWire) SetDeadline(t time.Time) error {
	if w.pc == nil {
		return nil
	}
	return w.pc.SetDeadline(t)
}

func (w *tlsWire) SetReadDeadline(t time.Time) error {
	if w.pc == nil {
		return nil
	}
	return w.pc.SetReadDeadline(t)
}

func (w *tlsWire) SetWriteDeadline(t time.Time) error {
	if w.pc == nil {
		return nil
	}
	return w.pc.SetWriteDeadline(t)
}

// wireAddr is an upstream's address as Forward.Addr names it.
type wireAddr string

func (a wireAddr) Network() string {
	if strings.HasPrefix(string(a), "/") {
		return "unix"
	}
	return "tcp"
}

func (a wireAddr) String() string { return string(a) }
