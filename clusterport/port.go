package clusterport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/logrepeat"
)

// The Raft port carries two protocols under the cluster's mutual TLS, told apart by the
// application protocol the client asked for in its handshake (ALPN): Raft's own RPCs, and
// HTTP between nodes (Port.Serve). A client that asks for none (a node of an earlier version
// dialing Raft, or a proxy that cannot set ALPN) is told apart by its first byte: Raft's RPCs
// start with a small type number, HTTP with a method's capital letter.
const (
	ALPNRaft = "pinnedd-raft"
	ALPNHTTP = "pinnedd-http"
)

// handshakeTimeout bounds an inbound TLS handshake (and its membership check), so a peer that
// connects and sends nothing holds a goroutine this long at most.
const handshakeTimeout = 5 * time.Second

// Port is the cluster port: a raft.StreamLayer over mutual TLS, and the
// node-to-node HTTP server on the same listener (Serve). Accept hands raft
// only connections whose handshake succeeded with a certificate from the
// cluster CA and whose node passed Admit; the rest are closed before raft
// reads a byte.
type Port struct {
	ln        net.Listener
	advertise net.Addr
	id        *clustertls.Identity
	server    func(net.Conn, *tls.Config) (*tls.Conn, error)
	allow     func(nodeID string) error
	log       *slog.Logger

	conns    chan net.Conn // Raft's
	http     chan net.Conn // the cluster port's HTTP (Serve)
	httpDone chan struct{} // closed when HTTP is no longer served (stopHTTP)
	httpOnce sync.Once
	dialCfg  *tls.Config
	slots    *handshakeSlots    // admission to a handshake, by source (handshakes.go)
	refused  *logrepeat.Repeats // refusals, summarised by source
	done     chan struct{}
	once     sync.Once

	mu       sync.Mutex
	accepted map[*peerConn]string // live inbound connections by peer node id
	// httpPeers are the live inbound HTTP connections, wherever they are
	// served (net/http, or a kept-alive loop that adopted them).
	httpPeers map[*peerConn]struct{}

	httpSrv   atomic.Pointer[http.Server] // Serve's
	httpConns httpx.ConnStates            // its connections
}

// Admit's refusals of a cluster certificate whose node is not a member: ErrLeft when the node
// left the configuration less than departedGrace ago (a leaving node dials until its process
// stops, and a removed node that has not heard of its removal asks for votes), which is
// routine; otherwise ErrNotMember.
var (
	ErrNotMember = errors.New("not a member of the Raft configuration (removed, or never joined)")
	ErrLeft      = fmt.Errorf("%w; it left moments ago", ErrNotMember)
)

var _ raft.StreamLayer = (*Port)(nil)

// Options wire a Port to the cluster it guards.
type Options struct {
	// Admit says whether a node whose certificate the handshake verified
	// may connect: nil, or why not (ErrNotMember, ErrLeft).
	Admit func(nodeID string) error
	// MemberHost says whether a source IP is a current member's: its
	// handshakes are admitted from the members' pool.
	MemberHost func(ip string) bool
	// ServerConn, if set, makes the server side of TLS over an accepted
	// connection in place of tls.Server (the front door's kept-alive loop
	// supplies one whose connections it can later serve itself). The
	// handshake still runs here.
	ServerConn func(raw net.Conn, cfg *tls.Config) (*tls.Conn, error)
	Logger     *slog.Logger
}

// New serves the cluster port on ln, advertised as advertise, with this
// node's identity id.
func New(ln net.Listener, advertise net.Addr, id *clustertls.Identity, opts Options) *Port {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Port{
		ln: ln, advertise: advertise, id: id, allow: opts.Admit, log: opts.Logger,
		server:    opts.ServerConn,
		conns:     make(chan net.Conn),
		http:      make(chan net.Conn),
		httpDone:  make(chan struct{}),
		dialCfg:   id.ClientConfig(ALPNRaft),
		slots:     newHandshakeSlots(opts.MemberHost),
		refused:   logrepeat.New(logrepeat.Window),
		done:      make(chan struct{}),
		accepted:  map[*peerConn]string{},
		httpPeers: map[*peerConn]struct{}{},
	}
	if s.server == nil {
		s.server = func(raw net.Conn, cfg *tls.Config) (*tls.Conn, error) { return tls.Server(raw, cfg), nil }
	}
	go s.acceptLoop()
	return s
}

func (s *Port) acceptLoop() {
	cfg := s.id.ServerConfig(ALPNRaft, ALPNHTTP)
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Error("raft listener failed", "err", err)
			s.Close()
			return
		}
		ip := sourceIP(raw.RemoteAddr())
		release, member, ok := s.slots.take(ip)
		if !ok {
			s.refuse(ip, "", "refused a cluster connection: too many handshakes under way from its address", "remote", raw.RemoteAddr().String(), "member_address", member)
			_ = raw.Close()
			continue
		}
		timeout := strangerHandshakeTimeout
		if member {
			timeout = handshakeTimeout
		}
		go s.handshake(raw, cfg, ip, release, timeout)
	}
}

// refuse logs a refused connection from ip (and node, once its certificate named one): one
// line per source and reason per window, with the count held back (a flood of refusals must not fill the disk the node needs).
func (s *Port) refuse(ip, node, msg string, args ...any) {
	s.refused.Log(context.Background(), s.log, slog.LevelWarn, ip+"\x00"+node+"\x00"+msg, msg, args...)
}

// handshake authenticates raw (from ip) within timeout and hands it to Raft or HTTP; release
// gives its admission slot back.
func (s *Port) handshake(raw net.Conn, cfg *tls.Config, ip string, release func(), timeout time.Duration) {
	defer release()
	conn, err := s.server(raw, cfg)
	if err != nil {
		s.refuse(ip, "", "refused a cluster connection", "remote", raw.RemoteAddr().String(), "err", err)
		_ = raw.Close()
		return
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	err = conn.Handshake()
	var node string
	if err == nil {
		node = clustertls.PeerNodeID(conn.ConnectionState())
		err = s.allow(node)
	}
	var pre []byte
	proto := conn.ConnectionState().NegotiatedProtocol
	if err == nil && proto == "" {
		// No ALPN: the first byte tells (see ALPNRaft).
		var b [1]byte
		if _, err = io.ReadFull(conn, b[:]); err == nil {
			pre = b[:]
			if 'A' <= b[0] && b[0] <= 'Z' {
				proto = ALPNHTTP
			}
		}
	}
	switch {
	case err != nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		// The dialer hung up before the handshake ended (a peer shutting down, a dial
		// it gave up on): nothing was refused.
		s.log.Debug("a cluster connection closed during its handshake", "remote", raw.RemoteAddr().String(), "err", err)
		_ = conn.Close()
		return
	case errors.Is(err, ErrLeft): // its last attempts after a leave or removal
		s.log.Info("refused a cluster connection", "remote", raw.RemoteAddr().String(), "node", node, "err", err)
		_ = conn.Close()
		return
	case err != nil:
		s.refuse(ip, node, "refused a cluster connection", "remote", raw.RemoteAddr().String(), "node", node, "err", err)
		_ = conn.Close()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	pc := &peerConn{Conn: conn, stream: s, node: node, pre: pre}
	if certs := conn.ConnectionState().PeerCertificates; len(certs) > 0 {
		pc.leaf = certs[0]
	}
	to := s.http
	if proto == ALPNHTTP {
		s.mu.Lock()
		s.httpPeers[pc] = struct{}{}
		s.mu.Unlock()
	} else {
		// Raft's connections are swept when their node is removed; HTTP's
		// check membership per request instead (Serve's handler), so a removal
		// does not cut the answer to the request that made it.
		to = s.conns
		s.mu.Lock()
		s.accepted[pc] = node
		s.mu.Unlock()
	}
	t := time.NewTimer(handshakeTimeout) // nobody serving HTTP (Serve never called)
	defer t.Stop()
	var stopped chan struct{} // nil, never ready, for Raft's connections
	if proto == ALPNHTTP {
		stopped = s.httpDone
	}
	select {
	case to <- pc:
	case <-s.done:
		_ = pc.Close()
	case <-stopped:
		_ = pc.Close()
	case <-t.C:
		_ = pc.Close()
	}
}

// stopHTTP makes the port close HTTP connections at once: nobody serves them any more.
func (s *Port) stopHTTP() { s.httpOnce.Do(func() { close(s.httpDone) }) }

// Accept returns the next authenticated inbound connection.
func (s *Port) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the listener; connections already handed out are raft's.
func (s *Port) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
	})
	return err
}

// Addr is the advertised address.
func (s *Port) Addr() net.Addr { return s.advertise }

// Dial connects to a member, presenting this node's certificate and accepting only a server
// certificate from the cluster CA.
func (s *Port) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.dialCfg}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, "tcp", string(address))
}

// Sweep closes inbound connections from nodes that keep is false for: a node removed from the
// configuration loses the connections it opened before, not only new ones.
func (s *Port) Sweep(keep func(nodeID string) bool) {
	s.mu.Lock()
	var drop []*peerConn
	for c, node := range s.accepted {
		if !keep(node) {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		s.log.Info("closing a raft connection from a node no longer a member", "node", s.nodeOf(c))
		_ = c.Close()
	}
}

// SweepUntrusted ends inbound connections whose peer's certificate trusts no longer accepts
// (its CA was retired): they were authenticated under a trust that has ended. Raft's are
// closed. HTTP's are retired: net/http closes the idle ones now, and every one closes after
// answering the request it carries (Cluster.Serve's handler, or a kept-alive loop that gives
// a retired connection back to net/http), so a member's request under way is answered, not
// cut.
func (s *Port) SweepUntrusted(trusts func(*x509.Certificate) bool) {
	s.mu.Lock()
	var drop []*peerConn
	for c := range s.accepted {
		if c.leaf != nil && !trusts(c.leaf) {
			drop = append(drop, c)
		}
	}
	var retired []*peerConn
	for c := range s.httpPeers {
		if c.leaf != nil && !trusts(c.leaf) && !c.retired.Swap(true) {
			retired = append(retired, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		s.log.Info("closing a connection whose certificate's CA was retired", "node", s.nodeOf(c))
		_ = c.Close()
	}
	if len(retired) > 0 {
		n := s.httpConns.CloseIdle(func(c net.Conn) bool { pc, ok := c.(*peerConn); return ok && pc.retired.Load() })
		s.log.Info("retired HTTP connections whose certificate's CA was retired", "connections", len(retired), "closed_idle", n)
	}
}

func (s *Port) nodeOf(c *peerConn) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[c]
}
