package clusterport

import (
	"crypto/x509"
	"net"
	"sync"
	"sync/atomic"
)

// httpListener hands out the authenticated connections that asked for HTTP.
func (s *Port) httpListener() net.Listener { return httpListener{s} }

type httpListener struct{ s *Port }

func (l httpListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.s.http:
		return c, nil
	case <-l.s.done:
		return nil, net.ErrClosed
	case <-l.s.httpDone:
		return nil, net.ErrClosed
	}
}

func (l httpListener) Close() error   { return nil } // the stream's Close closes the port
func (l httpListener) Addr() net.Addr { return l.s.advertise }

// peerConn is an inbound connection from the member node, with the byte read to tell its
// protocol, if one was.
type peerConn struct {
	net.Conn
	stream *Port
	node   string
	leaf   *x509.Certificate // the certificate the handshake checked
	pre    []byte
	once   sync.Once
	// retired: the CA that issued leaf was retired since (SweepUntrusted).
	// The connection serves no request past the one it carries: the
	// answer closes it.
	retired atomic.Bool
}

// Retired reports whether the connection's certificate chains to a CA the
// cluster retired since its handshake: serve at most the request under
// way, and close it after the answer.
func (c *peerConn) Retired() bool { return c.retired.Load() }

// NetConn is the connection this one wraps (the TLS connection), as tls.Conn's NetConn.
func (c *peerConn) NetConn() net.Conn { return c.Conn }

// PeerNode is the member node at the other end.
func (c *peerConn) PeerNode() string { return c.node }

func (c *peerConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 && len(p) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *peerConn) Close() error {
	c.once.Do(func() {
		c.stream.mu.Lock()
		delete(c.stream.accepted, c)
		delete(c.stream.httpPeers, c)
		c.stream.mu.Unlock()
	})
	return c.Conn.Close()
}
