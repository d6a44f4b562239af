package clusterport

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

type nodeKey struct{}

type connKey struct{}

// retiredFrom reports whether the connection a request to Serve's handler
// came on was retired (Port.SweepUntrusted).
func retiredFrom(ctx context.Context) bool {
	pc, _ := ctx.Value(connKey{}).(*peerConn)
	return pc != nil && pc.Retired()
}

// NodeFrom is the member node a request to Serve's handler came from
// ("" if the context is no such request's).
func NodeFrom(ctx context.Context) string {
	node, _ := ctx.Value(nodeKey{}).(string)
	return node
}

// Serve serves HTTP between nodes on the cluster port with h, until
// StopHTTP or Close; NodeFrom names each request's node, whose
// certificate the handshake checked (h checks its membership again per
// request: a removal does not cut the connections it made).
//
// handBacks are more listeners of connections the port accepted (a
// kept-alive loop that served some of their requests itself gives them
// back there); a connection from them is known by unwrapping NetConn() to
// the accepted one.
func (s *Port) Serve(h http.Handler, handBacks ...net.Listener) {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if retiredFrom(r.Context()) {
				// Its certificate's CA was retired after the handshake:
				// this answer is the connection's last.
				w.Header().Set("Connection", "close")
			}
			h.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			for c != nil {
				if pc, ok := c.(*peerConn); ok {
					return context.WithValue(context.WithValue(ctx, nodeKey{}, pc.node), connKey{}, pc)
				}
				w, ok := c.(interface{ NetConn() net.Conn })
				if !ok {
					break
				}
				c = w.NetConn()
			}
			return ctx
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			s.httpConns.Track(c, st)
			if pc, ok := c.(*peerConn); ok && st == http.StateIdle && pc.Retired() {
				_ = c.Close() // retired while it carried a request: that was its last
			}
		},
		ReadHeaderTimeout: handshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.httpSrv.Store(srv)
	for _, ln := range append([]net.Listener{s.httpListener()}, handBacks...) {
		if ln == nil {
			continue
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				s.log.Error("serving the cluster port's HTTP failed", "err", err)
			}
		}()
	}
}

// StopHTTP stops the cluster port's HTTP: no new connection (the port
// closes those at once), idle ones closed, and those with a request under
// way closed once it is answered, until ctx ends or shutdownBound passes
// (then they are cut). A request cut mid-way would leave its sender
// unsure whether it ran. Not graceful (a storage fault): everything is
// cut at once.
func (s *Port) StopHTTP(ctx context.Context, graceful bool) {
	s.stopHTTP()
	srv := s.httpSrv.Load()
	if srv != nil && !graceful {
		_ = srv.Close()
	} else if srv != nil {
		ctx, cancel := context.WithTimeout(ctx, shutdownBound)
		defer cancel()
		// A request on a connection accepted just before would reach net/http
		// after its Shutdown began, which drops it unanswered.
		s.httpConns.AwaitFirstRequests(ctx)
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn("requests on the cluster port still under way at the shutdown deadline; cut them off", "err", err)
			_ = srv.Close()
		}
	}
}

// shutdownBound bounds the wait for the cluster port's requests under way at shutdown.
const shutdownBound = 5 * time.Second
