package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// keptAliveProxy is the HTTP proxy the README's kept-alive pass points
// curl at (http_proxy): it carries every request to its node over a
// connection it keeps open, so each request after a node's first reaches
// it on a connection that already carried others, as a browser's or an
// SDK's does (a README curl opens a new connection each time). Responses
// stream through as they arrive (SSE), and the proxy adds nothing to a
// request but the connection it rides.
type keptAliveProxy struct {
	srv      *httptest.Server
	tr       *http.Transport
	dials    atomic.Int64 // connections opened to nodes
	requests atomic.Int64 // requests carried
}

func startKeptAliveProxy(t *testing.T) *keptAliveProxy {
	t.Helper()
	p := &keptAliveProxy{}
	d := &net.Dialer{Timeout: 5 * time.Second}
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				p.dials.Add(1)
			}
			return c, err
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true, // curl's Accept-Encoding, or none, as it sent it
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() {
		p.srv.Close()
		p.tr.CloseIdleConnections()
	})
	return p
}

// env is what a session's environment gets: curl uses the proxy for
// every http URL, loopback included.
func (p *keptAliveProxy) env() []string {
	return []string{"http_proxy=" + p.srv.URL, "no_proxy=", "NO_PROXY="}
}

func (p *keptAliveProxy) serve(w http.ResponseWriter, r *http.Request) {
	if !r.URL.IsAbs() {
		http.Error(w, "keptAliveProxy: not a proxy request", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	out.Header.Del("Proxy-Authorization")
	if r.ContentLength == 0 {
		out.Body = nil
	}
	p.requests.Add(1)
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, "keptAliveProxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				panic(http.ErrAbortHandler) // the client sees the cut, as it would without the proxy
			}
			return
		}
	}
}

// reused reports whether any connection carried more than one request.
func (p *keptAliveProxy) reused() bool { return p.requests.Load() > p.dials.Load() }
