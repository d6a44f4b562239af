package frontdoor

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/prometheus/client_golang/prometheus"
)

// keptAlive moves client connections between net/http and the kept-alive
// loop (relay.Conns): after a response that went out whole, adopt takes
// the connection out of net/http and the loop serves its next requests
// itself, as far as the router's routeLoop can; a request it does not take
// comes back to net/http unread, on a connection net/http serves again
// (serveHandBacks).
type keptAlive struct {
	conns    *relay.Conns
	handBack *relay.HandBack // where conns gives the front door's connections back
	// peerBack is where it gives the cluster port's back (PeerHandBacks),
	// served by the cluster port's server; peersOn once it is.
	peerBack *relay.HandBack
	peersOn  atomic.Bool
	logger   *slog.Logger
	// never: the access log is on, and every request must pass through
	// net/http to be logged.
	never bool
	// holds: held streams forwarded to another node leave net/http for
	// the relay loop (FastPath).
	holds bool
	// on: connections the loop gives back are served, so the loop may
	// take them (serveHandBacks).
	on atomic.Bool
	// stopped: the node is shutting down; no connection moves to the loop.
	stopped atomic.Bool
	// adopting orders adoption against stop: once stop holds it, no
	// adoption is under way, and every connection adopted is one the
	// loop's Drain sees.
	adopting sync.RWMutex
}

// newKeptAlive builds the loop with rt as its router, its connections
// held to lim (the front door's own bounds).
func newKeptAlive(rt relay.Router, fastPath, accessLog bool, logger *slog.Logger, lim relay.ClientLimits) *keptAlive {
	k := &keptAlive{handBack: relay.NewHandBack(), peerBack: relay.NewHandBack(), logger: logger, never: accessLog, holds: fastPath && relay.Supported}
	k.conns = relay.NewConns(logger, rt, k.giveBack, ownerHeaderTimeout)
	k.conns.SetClientLimits(lim)
	return k
}

// giveBack returns a connection to the server it came from: a peer's to
// the cluster port's, a client's to the front door's.
func (k *keptAlive) giveBack(c net.Conn) {
	if peerNode(c) != "" {
		k.peerBack.Give(c)
		return
	}
	k.handBack.Give(c)
}

// clusterPeer is what the cluster port's connections say of the member at
// the other end (clusterport's peerConn).
type clusterPeer interface {
	PeerNode() string
	// Retired: the CA of its certificate was retired since the handshake.
	Retired() bool
}

// peerOf is the cluster member at the other end of c, nil for a client's
// connection: the cluster port's connections say so (found through their
// wrappers' NetConn).
func peerOf(c net.Conn) clusterPeer {
	for c != nil {
		if p, ok := c.(clusterPeer); ok {
			return p
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	return nil
}

// peerNode is peerOf's node, "" for a client's connection.
func peerNode(c net.Conn) string {
	if p := peerOf(c); p != nil {
		return p.PeerNode()
	}
	return ""
}

// ClusterPortTLS makes the server side of the cluster port's TLS
// connections (clusterport's Config.ServerConn): with the fast path, so
// that the kept-alive loop can adopt them (relay.ServerTLS); without it,
// nil, crypto/tls's own.
func ClusterPortTLS(fastPath bool) func(raw net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	if !fastPath {
		return nil
	}
	return relay.ServerTLS
}

// peerHandBacks lets the loop take the cluster port's connections (made
// with relay.ServerTLS) too: the server that serves the returned listener
// takes back the ones the loop gives up on.
func (k *keptAlive) peerHandBacks() net.Listener {
	k.peersOn.Store(relay.Supported && k.holds && !k.never)
	return k.peerBack
}

// adoptable: r's connection may move to the loop, as far as where it came
// from goes (a peer's only once peerHandBacks is served).
func (k *keptAlive) adoptable(r *http.Request) bool {
	return !fromPeer(r) || k.peersOn.Load()
}

// collectors are the loop's metrics, for the registry.
func (k *keptAlive) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pinboard_kept_alive_connections", Help: "Client connections the kept-alive loop serves now, out of net/http.",
		}, func() float64 { return float64(k.conns.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pinboard_kept_alive_requests_total",
			Help: "Requests the kept-alive loop carried itself: forwarded to their owner's node, or (on the owner) relayed to the plugin.",
		}, func() float64 { return float64(k.conns.Served()) }),
	}
}

// serveHandBacks lets the loop take connections from srv, where this
// platform has the loop: the ones it gives back (requests it does not
// serve itself) are served by srv again, until srv shuts down.
func (k *keptAlive) serveHandBacks(srv *http.Server) {
	k.on.Store(relay.Supported)
	go func() { _ = srv.Serve(k.handBack) }()
}

// stop takes no more connections, and drains the loop's.
func (k *keptAlive) stop() {
	k.adopting.Lock()
	k.stopped.Store(true)
	k.adopting.Unlock()
	k.conns.Drain()
}

// shutdown waits until every request the loop is forwarding has had its
// response, or ctx is done, then closes its connections.
func (k *keptAlive) shutdown(ctx context.Context) error { return k.conns.Shutdown(ctx) }

func (k *keptAlive) close() error {
	err := k.conns.Close()
	return errors.Join(err, k.handBack.Close(), k.peerBack.Close())
}

// adopt hands r's connection to the kept-alive loop once its response
// (fixed length, now complete) was written to w, with its slot under the
// connection caps (limitedConn.Detach). It reports whether it did; the
// handler must then return at once.
func (k *keptAlive) adopt(w http.ResponseWriter, r *http.Request) bool {
	if !k.on.Load() || k.stopped.Load() || k.never ||
		r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.TLS != nil || r.Close || !k.adoptable(r) ||
		w.Header().Get("Connection") == "close" { // the answer said the connection ends (boundRequest)
		return false
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return false
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		return false
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending, _ = brw.Reader.Peek(n)
	}
	k.adopting.RLock()
	stopped := k.stopped.Load()
	if !stopped {
		err = k.conns.Adopt(conn, pending)
	}
	k.adopting.RUnlock()
	switch {
	case stopped:
		// stop came after the check above: the response said nothing
		// of the connection ending, so its next request may be on its
		// way; net/http answers it, as a stopping node.
		k.handBack.GiveBuffered(conn, pending)
	case err != nil:
		// The response went out whole; the client reconnects. The loop
		// closed the connection and gave its slot back.
		k.logger.Debug("kept-alive loop refused a connection; closed it", "err", err)
	}
	return true
}

// serveAdopting runs serve, then hands r's connection to the kept-alive
// loop if the response went out whole with a declared length and
// adoptable says the request allows it (none of its body is left unread):
// the connection's next requests are the loop's.
func (k *keptAlive) serveAdopting(w http.ResponseWriter, r *http.Request, adoptable func() bool, serve func(http.ResponseWriter)) {
	if !k.on.Load() || k.never || !k.adoptable(r) {
		serve(w)
		return
	}
	lw := &lengthWriter{ResponseWriter: w}
	serve(lw)
	if lw.complete(r.Method) && adoptable() {
		k.adopt(w, r)
	}
}

// lengthWriter counts a response's final status and body bytes: the
// access log reports them, and complete tells whether a response went out
// whole with a declared length, so its connection can be adopted after it.
type lengthWriter struct {
	http.ResponseWriter
	code    int
	written int64
}

func (w *lengthWriter) WriteHeader(code int) {
	if w.code < 200 { // the final status, not a 1xx before it
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *lengthWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.written += int64(n)
	return n, err
}

func (w *lengthWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// complete: a final response whose Content-Length was all written (none
// for HEAD).
func (w *lengthWriter) complete(method string) bool {
	if w.code < 200 || w.code == http.StatusSwitchingProtocols {
		return false
	}
	cl := w.Header().Get("Content-Length")
	n, err := strconv.ParseInt(cl, 10, 64)
	return err == nil && (n == w.written || method == http.MethodHead && w.written == 0)
}

// eofBody notes whether a request body was read to its end (what is left
// unread would be taken for the next request).
type eofBody struct {
	io.ReadCloser
	eof bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}
