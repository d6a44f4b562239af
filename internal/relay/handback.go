package relay

import (
	"net"
	"sync"
	"syscall"
)

// HandBack is the listener an http.Server takes back the connections a
// Conns loop gives up on (NewConns' handBack is its Give).
type HandBack struct {
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

// NewHandBack returns an open HandBack.
func NewHandBack() *HandBack {
	return &HandBack{ch: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for a connection given back.
func (l *HandBack) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		select {
		case <-l.closed:
			// Close raced the hand-over: a server that stopped
			// serving must not be handed a connection after.
			_ = c.Close()
			return nil, net.ErrClosed
		default:
			return c, nil
		}
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops Accept; connections given back after it are closed.
func (l *HandBack) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is a placeholder: the connections come from another listener.
func (l *HandBack) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// Give passes c to the server, or closes it once the server stopped
// taking connections. It runs on the loop's goroutine, so it must not wait
// long: Serve's accept loop takes connections as fast as it can.
func (l *HandBack) Give(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

// GiveBuffered is Give for a connection whose first bytes, pending, were
// read off it already: the server reads them first.
func (l *HandBack) GiveBuffered(c net.Conn, pending []byte) {
	if len(pending) > 0 {
		c = &prefixConn{Conn: c, prefix: pending}
	}
	l.Give(c)
}

// prefixConn is a connection given back to net/http: it reads prefix
// before the connection's own bytes, and holds the connection's slot
// (release) until Close, or until Detach hands it to whoever takes the
// socket next (the loops again). Its Conn is a socket in Go's poller, or
// the TLS connection Adopt took (giveBackTLS).
type prefixConn struct {
	net.Conn
	prefix  []byte
	mu      sync.Mutex
	release func()
}

// Close closes the connection and gives its slot back (once).
func (p *prefixConn) Close() error {
	err := p.Conn.Close()
	if rel := p.takeRelease(); rel != nil {
		rel()
	}
	return err
}

// Detach hands the slot over: Close no longer gives it back, the release
// returned does (once).
func (p *prefixConn) Detach() func() {
	if rel := p.takeRelease(); rel != nil {
		return rel
	}
	return func() {}
}

func (p *prefixConn) takeRelease() func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	rel := p.release
	p.release = nil
	return rel
}

// NetConn is the connection under the prefix (for a TLS one, what Adopt
// was given: a caller unwraps to its own type from here).
func (p *prefixConn) NetConn() net.Conn { return p.Conn }

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// SyscallConn lets a connection given back be taken again.
func (p *prefixConn) SyscallConn() (syscall.RawConn, error) {
	if len(p.prefix) > 0 {
		return nil, ErrNotSocket // its buffered bytes would be lost
	}
	sc, ok := p.Conn.(syscall.Conn)
	if !ok {
		return nil, ErrNotSocket
	}
	return sc.SyscallConn()
}
