package clusterport

import (
	"crypto/tls"
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
	stream  *Port
	node    string
	pre     []byte
	once    sync.Once
	verdict atomic.Pointer[trustVerdict] // PeerTrusted's, for one generation of the identity
}

type trustVerdict struct {
	gen uint64
	ok  bool
}

// NetConn is the connection this one wraps (the TLS connection), as tls.Conn's NetConn.
func (c *peerConn) NetConn() net.Conn { return c.Conn }

// PeerNode is the member node at the other end.
func (c *peerConn) PeerNode() string { return c.node }

// PeerTrusted reports whether the certificate the peer presented in its handshake is one this
// node still trusts: a CA retired since stops the requests of a connection kept alive across
// the retirement (Raft's are swept; HTTP's are asked here, per request). The verdict is kept
// until the identity changes, so a request costs two atomic loads.
func (c *peerConn) PeerTrusted() bool {
	id := c.stream.id
	gen := id.Generation()
	if v := c.verdict.Load(); v != nil && v.gen == gen {
		return v.ok
	}
	v := &trustVerdict{gen: gen}
	if tc, is := c.Conn.(interface{ ConnectionState() tls.ConnectionState }); is {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			v.ok = id.Trusts(certs[0])
		}
	}
	c.verdict.Store(v)
	return v.ok
}

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
		c.stream.mu.Unlock()
	})
	return c.Conn.Close()
}
