//go:build linux

package relay

import (
	"crypto/tls"
	"net"

	"golang.org/x/sys/unix"
)

// TLS clients: a connection accepted on a TLS port goes to net/http as a
// tls.Conn over a tlsWire in poller mode (ServerTLS), so the handshake and
// net/http use it as any Go conn. Adopt switches the wire to loop mode,
// and the loop reads requests through the tls.Conn and writes responses
// through it, as it does for a TLS upstream (tls_linux.go); giveBackTLS
// switches it back and hands net/http the very object Adopt took.

// ServerTLS makes raw, a connection just accepted (a socket), the server
// side of a TLS connection with cfg, its handshake not yet run (the caller
// runs it, with its deadlines). Its I/O, deadlines and Close are those of
// any Go conn until a Conns adopts it (Adopt). raw's descriptor becomes
// the connection's, and raw is closed, on error too; a slot raw holds
// under a connection cap goes along (slot.go).
func ServerTLS(raw net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	laddr, raddr := raw.LocalAddr(), raw.RemoteAddr()
	fd, release, err := takeClient(raw)
	if err != nil {
		return nil, err
	}
	w := &tlsWire{fd: fd, laddr: laddr, raddr: raddr, release: release}
	if err := w.toPoller(); err != nil {
		_ = unix.Close(fd)
		release()
		return nil, err
	}
	return tls.Server(w, cfg), nil
}

// serverTLSOf finds the tls.Conn made by ServerTLS that c is or wraps
// (through NetConn), and its wire; nil, nil if there is none.
func serverTLSOf(c net.Conn) (*tls.Conn, *tlsWire) {
	for c != nil {
		if tc, ok := c.(*tls.Conn); ok {
			if w, ok := tc.NetConn().(*tlsWire); ok {
				return tc, w
			}
			return nil, nil
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil, nil
		}
		c = u.NetConn()
	}
	return nil, nil
}

// takeTLSClient takes c, which is or wraps tc over w, for the loop: its
// wire goes to loop mode, its slot along. conn is what the loop will hand
// back (ReqHead.Conn): c, or, for a connection the loop gave back
// (a prefixConn), the one it wrapped, with the prefix net/http did not
// read after buffered, so that hand-backs do not nest. On error the slot
// is given back, and c closed unless a loop holds it already.
func takeTLSClient(c net.Conn, tc *tls.Conn, w *tlsWire, buffered []byte) (conn net.Conn, in []byte, t *tlsEnd, release func(), err error) {
	release = detachSlot(c)
	w.mu.Lock()
	taken := w.closed || w.pc == nil
	w.mu.Unlock()
	if taken {
		release()
		return nil, nil, nil, nil, errNotAdoptable
	}
	if !tc.ConnectionState().HandshakeComplete {
		_ = w.Close()
		release()
		return nil, nil, nil, nil, errNotAdoptable
	}
	conn, in = c, append([]byte(nil), buffered...)
	if p, ok := c.(*prefixConn); ok {
		conn, in = p.Conn, append(in, p.prefix...)
		p.prefix = nil
	}
	w.toLoop()
	return conn, in, &tlsEnd{conn: tc, wire: w}, release, nil
}

// giveBackTLS is giveBack for a TLS client: its wire back in poller mode,
// net/http gets what Adopt took, reading pending (the plaintext the loop
// read and did not answer) first.
func (l *Conns) giveBackTLS(c *client, pending []byte, release func(), after *[]func()) {
	w, conn := c.tls.wire, c.conn
	*after = append(*after, func() {
		if err := w.toPoller(); err != nil {
			_ = unix.Close(w.fd)
			release()
			l.log.Debug("keep-alive loop: giving a TLS connection back failed; closed it", "err", err)
			return
		}
		l.handBack(&prefixConn{Conn: conn, prefix: pending, release: release})
	})
}
