package supervisor

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// syncBodyLimit: requests with a body up to this size take the synchronous
// path; larger or unknown-length bodies (uploads, full-duplex streams) use
// net/http's Transport, which writes and reads concurrently.
const syncBodyLimit = 64 << 10

// unixTransport is the data plane's fast path: HTTP/1.1 over the plugin's
// unix socket, written and read by the calling goroutine on a pooled
// connection. net/http's Transport hands every request to a per-connection
// writer goroutine and every response back from a reader goroutine; on
// these machines each hand-off across the process boundary costs a thread
// wake-up, and dropping them roughly halves the hop (see
// BenchmarkDataPlane). Upgrades and streamed uploads go to fallback.
type unixTransport struct {
	path     string
	fallback http.RoundTripper
	maxIdle  int

	mu     sync.Mutex
	idle   []*pconn
	closed bool
}

type pconn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func newUnixTransport(path string, fallback http.RoundTripper) *unixTransport {
	return &unixTransport{path: path, fallback: fallback, maxIdle: 256}
}

func (t *unixTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Upgrade") != "" || !(req.Body == nil || req.Body == http.NoBody ||
		(req.ContentLength > 0 && req.ContentLength <= syncBodyLimit)) {
		return t.fallback.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		pc, reused, err := t.get(req.Context())
		if err != nil {
			return nil, err
		}
		resp, err := t.exchange(req, pc)
		if err == nil {
			return resp, nil
		}
		pc.c.Close()
		// A pooled connection the plugin closed while idle fails before
		// anything was processed; a body-less request can go again.
		if reused && attempt == 0 && (req.Body == nil || req.Body == http.NoBody) && req.Context().Err() == nil && isConnGone(err) {
			continue
		}
		return nil, err
	}
}

func isConnGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, errConnReset)
}

var errConnReset = errors.New("connection reset")

// exchange writes req and reads the response head on pc. The response body
// reads from pc; closing it returns pc to the pool once the body was read
// to its end.
func (t *unixTransport) exchange(req *http.Request, pc *pconn) (*http.Response, error) {
	// Cancellation interrupts whatever I/O is blocked on the connection.
	stop := context.AfterFunc(req.Context(), func() { _ = pc.c.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(pc.bw); err != nil {
		stop()
		return nil, err
	}
	if err := pc.bw.Flush(); err != nil {
		stop()
		return nil, err
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		stop()
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	resp.Body = &pooledBody{rc: resp.Body, t: t, pc: pc, stop: stop, keep: !resp.Close}
	return resp, nil
}

// pooledBody returns its connection to the pool when the body was read to
// EOF and closed; anything else closes the connection.
type pooledBody struct {
	rc   io.ReadCloser
	t    *unixTransport
	pc   *pconn
	stop func() bool
	keep bool
	eof  bool
	done bool
}

func (b *pooledBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *pooledBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.rc.Close()
	if !b.stop() || !b.eof || !b.keep || err != nil {
		// The context fired (the deadline is poisoned), the body was cut
		// short, or the plugin asked to close: the connection is done.
		b.pc.c.Close()
		return err
	}
	b.t.put(b.pc)
	return nil
}

func (t *unixTransport) get(ctx context.Context) (*pconn, bool, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false, net.ErrClosed
	}
	if n := len(t.idle); n > 0 {
		pc := t.idle[n-1]
		t.idle = t.idle[:n-1]
		t.mu.Unlock()
		return pc, true, nil
	}
	t.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", t.path)
	if err != nil {
		return nil, false, err
	}
	return &pconn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 16<<10)}, false, nil
}

func (t *unixTransport) put(pc *pconn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || len(t.idle) >= t.maxIdle {
		pc.c.Close()
		return
	}
	t.idle = append(t.idle, pc)
}

// CloseIdleConnections closes pooled connections; after close (the plugin
// is gone) nothing is pooled again.
func (t *unixTransport) close() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.closed = nil, true
	t.mu.Unlock()
	for _, pc := range idle {
		pc.c.Close()
	}
}
