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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TLS upstreams (Forward.TLS). There is no kernel TLS here, so the loop
// runs crypto/tls in user space over the upstream's non-blocking
// descriptor, and stays one goroutine that never waits on a socket:
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

// tlsUp is a TLS upstream connection's state.
type tlsUp struct {
	conn *tls.Conn
	wire tlsWire
	// hs is set while the handshake goroutine holds the connection, and
	// until the loop takes it back (shaken).
	hs  *handshake
	eof bool  // the peer's stream ended (read returns 0, nil from now on)
	err error // a read failed after returning bytes: the next read says so
}

// handshake is one handshake under way, shared by its goroutine and the
// loop under the loop's lock.
type handshake struct {
	f    *os.File // the descriptor's duplicate the goroutine waits on
	done bool     // the goroutine is finished with the descriptor
	err  error    // why the handshake failed, once done
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
// cfg, ready for its handshake, which waits on a duplicate of fd in Go's
// poller for up to timeout; handshook ends that.
func newTLSUp(fd int, addr string, cfg *tls.Config, timeout time.Duration) (*tlsUp, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	f := os.NewFile(uintptr(dup), "relay-tls") // non-blocking: in Go's poller
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetDeadline(time.Now().Add(timeout))
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		// As tls.Dial does: the name checked is the address's host.
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	t := &tlsUp{wire: tlsWire{fd: fd, addr: wireAddr(addr), rc: rc}, hs: &handshake{f: f}}
	t.conn = tls.Client(&t.wire, cfg)
	return t, nil
}

// handshook records the handshake's end (err: why it failed): the
// descriptor is the loop's from here on, and never waited on.
func (t *tlsUp) handshook(err error) {
	h := t.hs
	_ = h.f.Close()
	t.wire.rc = nil
	h.done, h.err = true, err
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
func (t *tlsUp) abandon() bool {
	h := t.hs
	if h == nil || h.done {
		return false
	}
	h.abandoned = true
	_ = h.f.SetDeadline(aLongTimeAgo)
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
	var err error
	if len(u.out) > 0 {
		_, err = t.conn.Write(u.out)
		u.out = nil
	}
	flushed := false
	if err == nil {
		flushed, err = t.wire.flush()
	}
	u.sent = u.sent || t.wire.written > before
	if err != nil {
		l.upstreamFailed(c, fmt.Errorf("%w: %w", ErrUpstreamFailed, err), after)
		return false
	}
	if !flushed {
		return false // EPOLLOUT brings us back
	}
	c.state, c.since = stResp, time.Now()
	return true
}

// read is sysRead for a TLS upstream, decrypted: n bytes; (0, EAGAIN)
// once the socket and the tls.Conn hold no more; (0, nil) at the end of
// the peer's stream (a close_notify, or an EOF between records). A short
// read does not mean the socket is drained: the tls.Conn returns one
// record at a time, and may hold more already read.
func (t *tlsUp) read(p []byte) (int, error) {
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
func (t *tlsUp) quiet() bool {
	var b [1]byte
	n, err := t.read(b[:])
	return n == 0 && errors.Is(err, unix.EAGAIN) && len(t.wire.out) == 0
}

// tlsWire is the net.Conn under a TLS upstream's tls.Conn: its
// descriptor, never waited on by the loop (see the top of this file).
type tlsWire struct {
	fd      int
	addr    wireAddr
	out     []byte // bytes the socket has not taken yet, in order
	written int64  // bytes the socket took
	err     error  // a write failed: every later one fails too
	// rc is the descriptor's duplicate in Go's poller during the
	// handshake, where reads and writes wait (until its deadline).
	rc syscall.RawConn
}

// wouldBlock is the wire's EAGAIN: a temporary net.Error, which
// crypto/tls returns without keeping it.
type wouldBlock struct{}

func (wouldBlock) Error() string   { return "relay: tls upstream would block" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

var errWouldBlock net.Error = wouldBlock{}

// Read reads what the socket has: errWouldBlock if nothing yet.
func (w *tlsWire) Read(p []byte) (int, error) {
	if w.rc != nil {
		return w.wait(false, p)
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

// Write writes what the socket takes and keeps the rest for flush; it
// fails only when the socket does.
func (w *tlsWire) Write(p []byte) (int, error) {
	if w.rc != nil {
		return w.wait(true, p)
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

// wait reads into p, or writes all of p, waiting in Go's poller (the
// handshake's side).
func (w *tlsWire) wait(write bool, p []byte) (int, error) {
	done := 0
	var ioErr error
	try := func(fd uintptr) bool {
		for len(p) > done {
			var n int
			var err error
			if write {
				n, err = sysWrite(int(fd), p[done:])
			} else {
				n, err = sysRead(int(fd), p)
			}
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return false
			case err != nil:
				ioErr = err
			case !write && n == 0:
				ioErr = io.EOF
			}
			done += n
			if ioErr != nil || !write {
				return true
			}
		}
		return true
	}
	var err error
	if write {
		err = w.rc.Write(try)
	} else {
		err = w.rc.Read(try)
	}
	if err == nil {
		err = ioErr
	}
	return done, err
}

// Close does nothing: the loop closes the descriptor (closeUp), with no
// close_notify.
func (w *tlsWire) Close() error { return nil }

func (w *tlsWire) LocalAddr() net.Addr { return wireAddr("") }

// RemoteAddr is the upstream's address (crypto/tls keys its session cache
// by it when the config names no server).
func (w *tlsWire) RemoteAddr() net.Addr { return w.addr }

// The deadlines are the handshake's (on its duplicate) and the loop's own.
func (w *tlsWire) SetDeadline(time.Time) error      { return nil }
func (w *tlsWire) SetReadDeadline(time.Time) error  { return nil }
func (w *tlsWire) SetWriteDeadline(time.Time) error { return nil }

// wireAddr is an upstream's address as Forward.Addr names it.
type wireAddr string

func (a wireAddr) Network() string {
	if strings.HasPrefix(string(a), "/") {
		return "unix"
	}
	return "tcp"
}

func (a wireAddr) String() string { return string(a) }
