package relay

import (
	"net"
	"sync"
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
		return c, nil
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
