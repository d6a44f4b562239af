package httpx

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"syscall"
	"time"
)

// SyncBodyLimit: requests with a body up to this size take the synchronous
// path; larger or unknown-length bodies (uploads, full-duplex streams) use
// net/http's Transport, which writes and reads concurrently.
const SyncBodyLimit = 64 << 10

// SyncTransport is an HTTP/1.1 RoundTripper that writes each request and
// reads its response head on the calling goroutine, over pooled
// connections (one pool per host). net/http's Transport hands every request
// to a per-connection writer goroutine and every response back from a
// reader goroutine; across a process boundary each hand-off costs a thread
// wake-up, and dropping them takes a large share off a proxy hop (see
// BenchmarkDataPlane in package supervisor), and two goroutines off every
// held stream. Upgrades and streamed or large uploads go to Fallback,
// which writes and reads concurrently, and so does any scheme but its own
// (http, or https with TLS).
type SyncTransport struct {
	// Dial opens a connection to addr (the request's URL host). Default:
	// TCP, with DialTimeout (default 3s) and 30s keep-alives.
	Dial        func(ctx context.Context, addr string) (net.Conn, error)
	DialTimeout time.Duration
	// TLS, if set, makes every connection a TLS client with this config
	// (its handshake bounded by DialTimeout too) and the transport's
	// scheme https: a transport speaks to peers of one kind.
	TLS      *tls.Config
	Fallback http.RoundTripper
	// MaxIdlePerHost bounds the pool per host (default 256).
	MaxIdlePerHost int
	// ResponseHeaderTimeout, if set, bounds the wait for a response head;
	// a request's WithHeadTimeout overrides it, on both paths.
	ResponseHeaderTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*pconn
	closed bool
}

type pconn struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
}

var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, ioBuf) }}

// readers: a detached connection's reader comes back here, so a held
// stream's setup leaves no 4 KB of garbage behind.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, ioBuf) }}

// ioBuf sizes the per-connection buffers small: a held stream keeps its
// connection, and a response head fits (textproto reads longer lines in
// pieces).
const ioBuf = 4 << 10

type headTimeoutKey struct{}

// WithHeadTimeout bounds the wait for the response head of a request made
// with ctx to d (a SyncTransport's ResponseHeaderTimeout for this one
// request): a caller that knows better than the transport-wide bound (an
// owner whose lease lapses sooner) says so here.
func WithHeadTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, headTimeoutKey{}, d)
}

// headTimeout is the bound on req's response head: its WithHeadTimeout, or
// the transport's.
func (t *SyncTransport) headTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(headTimeoutKey{}).(time.Duration); ok {
		return d
	}
	return t.ResponseHeaderTimeout
}

// errHeadTimeout ends a Fallback request whose head did not come in time.
var errHeadTimeout = errors.New("timeout awaiting response headers")

// RoundTrip implements http.RoundTripper.
func (t *SyncTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != t.Scheme() || req.Header.Get("Upgrade") != "" || !(req.Body == nil || req.Body == http.NoBody ||
		(req.ContentLength > 0 && req.ContentLength <= SyncBodyLimit)) {
		return t.fallback(req)
	}
	var got1xx func(int, http.Header)
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil {
		got1xx = func(code int, h http.Header) { _ = trace.Got1xxResponse(code, textproto.MIMEHeader(h)) }
	}
	bodyless := req.Body == nil || req.Body == http.NoBody
	return t.roundTrip(req.Context(), req.URL.Host, req, bodyless, got1xx, func(bw *bufio.Writer) error { return req.Write(bw) })
}

// fallback is Fallback's round trip of req, the wait for its head bounded
// by its WithHeadTimeout if it has one (a Transport's
// ResponseHeaderTimeout is one for all requests; Fallback's own still
// applies). An Upgrade keeps
// Fallback's: its 101 body is the connection itself.
func (t *SyncTransport) fallback(req *http.Request) (*http.Response, error) {
	d, ok := req.Context().Value(headTimeoutKey{}).(time.Duration)
	if !ok || req.Header.Get("Upgrade") != "" {
		return t.Fallback.RoundTrip(req)
	}
	// The bound starts once the request is written, as on the synchronous
	// path: a slow upload is not the head's wait.
	ctx, cancel := context.WithCancelCause(req.Context())
	var mu sync.Mutex
	var timer *time.Timer
	returned := false
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		mu.Lock()
		defer mu.Unlock()
		if !returned {
			timer = time.AfterFunc(d, func() { cancel(errHeadTimeout) })
		}
	}}
	resp, err := t.Fallback.RoundTrip(req.WithContext(httptrace.WithClientTrace(ctx, trace)))
	mu.Lock()
	returned = true
	if timer != nil {
		timer.Stop()
	}
	mu.Unlock()
	if err != nil {
		if context.Cause(ctx) == errHeadTimeout {
			err = fmt.Errorf("%w: %w", errHeadTimeout, err)
		}
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends a fallback request's context with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// Scheme is the URL scheme the transport carries itself: https with TLS,
// else http.
func (t *SyncTransport) Scheme() string {
	if t.TLS != nil {
		return "https"
	}
	return "http"
}

// RoundTripHead sends a request whose head (and body, if any) the caller
// wrote already, as HTTP/1.1 bytes, to the host addr (over TLS with TLS), and reads
// the response head. in is the request it answers (its method and context
// count: cancelling the context interrupts the exchange). A caller that
// builds the bytes itself skips http.Request's cloning and header sorting;
// it must only send bodies of known length, and no Upgrade or Expect.
// got1xx, if set, sees informational responses (never 101).
func (t *SyncTransport) RoundTripHead(addr string, in *http.Request, wire []byte, bodyless bool, got1xx func(int, http.Header)) (*http.Response, error) {
	return t.roundTrip(in.Context(), addr, in, bodyless, got1xx, func(bw *bufio.Writer) error {
		_, err := bw.Write(wire)
		return err
	})
}

func (t *SyncTransport) roundTrip(ctx context.Context, addr string, req *http.Request, bodyless bool, got1xx func(int, http.Header), write func(*bufio.Writer) error) (*http.Response, error) {
	// A body-less request whose method is safe to repeat goes again if its
	// pooled connection turns out dead, so only the others pay for the
	// liveness peek before reuse.
	retryable := bodyless && idempotent(req.Method)
	for attempt := 0; ; attempt++ {
		// The one retry takes a new connection: the pooled ones may all
		// have died together (the peer's idle timeout, its restart).
		pc, reused, err := t.get(ctx, addr, !retryable, attempt > 0)
		if err != nil {
			return nil, notSent(err) // no connection, nothing written
		}
		resp, dead, err := t.exchange(ctx, req, pc, got1xx, write)
		if err == nil {
			return resp, nil
		}
		pc.c.Close()
		// A pooled connection can die before the request was processed
		// (closed while idle) or after; only a request safe to repeat
		// goes again, once, and only if nothing of a response came back.
		if reused && attempt == 0 && retryable && ctx.Err() == nil && dead {
			continue
		}
		return nil, err
	}
}

func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// isConnGone: err is a connection's end as the peer made it: EOF, or a
// write or read refused because the peer had closed (EPIPE) or reset
// (ECONNRESET) it.
func isConnGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// max1xx bounds the informational responses before a final one (as
// net/http's Transport does).
const max1xx = 5

// exchange writes a request on pc (write) and reads the response head. The
// response body reads from pc; closing it returns pc to the pool once the
// body was read to its end. dead: it failed because the connection was
// gone (isConnGone) before any byte of a response came back.
func (t *SyncTransport) exchange(ctx context.Context, req *http.Request, pc *pconn, got1xx func(int, http.Header), write func(*bufio.Writer) error) (resp *http.Response, dead bool, err error) {
	// Cancellation interrupts whatever I/O is blocked on the connection.
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(time.Unix(1, 0)) })
	// The writer is only needed while the request goes out: pooled, so a
	// held stream does not keep one.
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(pc.c)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	if err != nil {
		stop()
		return nil, isConnGone(err), err
	}
	headTimeout := t.headTimeout(ctx)
	if headTimeout > 0 {
		_ = pc.c.SetReadDeadline(time.Now().Add(headTimeout))
	}
	// The first byte tells a connection that was gone (EOF, reset) from
	// a response that failed part way, which is the request's outcome.
	if _, err = pc.br.Peek(1); err != nil {
		stop()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, false, ctxErr
		}
		return nil, isConnGone(err), err
	}
	for n1xx := 0; ; n1xx++ {
		resp, err = http.ReadResponse(pc.br, req)
		if err != nil || resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// An informational response (100 Continue to an Expect, 103
		// Early Hints) has no body; the final response follows.
		if n1xx == max1xx {
			err = errors.New("too many 1xx informational responses")
			break
		}
		if got1xx != nil && resp.StatusCode != http.StatusContinue {
			got1xx(resp.StatusCode, resp.Header)
		}
	}
	if headTimeout > 0 && err == nil {
		_ = pc.c.SetReadDeadline(time.Time{})
		if ctx.Err() != nil { // cancelled while we cleared it
			_ = pc.c.SetDeadline(time.Unix(1, 0))
		}
	}
	if err != nil {
		stop()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, false, ctxErr
		}
		return nil, false, err
	}
	resp.Body = &pooledBody{rc: resp.Body, t: t, pc: pc, stop: stop, keep: !resp.Close}
	return resp, false, nil
}

// pooledBody returns its connection to the pool when the body was read to
// EOF and closed; anything else closes the connection.
type pooledBody struct {
	rc   io.ReadCloser
	t    *SyncTransport
	pc   *pconn
	stop func() bool
	keep bool
	eof  bool
	done bool
	read bool // the body has been read from: the wire bytes are no longer whole
}

func (b *pooledBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, http.ErrBodyReadAfterClose
	}
	b.read = true
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

// ErrNotDetachable: the response's body is not an untouched SyncTransport
// body, or its request was cancelled.
var ErrNotDetachable = errors.New("response body cannot be detached")

// RawBody returns the body bytes of resp (a SyncTransport response whose
// body nobody has read yet) that arrived with its head: as they were on
// the wire, chunk framing included. The slice is only valid until the body
// is read, closed or detached.
func RawBody(resp *http.Response) ([]byte, bool) {
	b, ok := resp.Body.(*pooledBody)
	if !ok || b.done || b.read {
		return nil, false
	}
	raw, _ := b.pc.br.Peek(b.pc.br.Buffered())
	return raw, true
}

// Detach takes the connection resp's body would be read from out of the
// transport, for a caller that relays the body's bytes itself: it returns
// the connection (now the caller's, never pooled) and a copy of the raw
// body bytes already read from it (see RawBody). resp.Body becomes inert:
// closing it does nothing. The request's cancellation no longer touches the
// connection.
func Detach(resp *http.Response) (net.Conn, []byte, error) {
	b, ok := resp.Body.(*pooledBody)
	if !ok || b.done || b.read {
		return nil, nil, ErrNotDetachable
	}
	b.done = true
	if !b.stop() {
		// Cancelled already: the connection's deadline is poisoned.
		b.pc.c.Close()
		return nil, nil, ErrNotDetachable
	}
	raw, _ := b.pc.br.Peek(b.pc.br.Buffered())
	raw = bytes.Clone(raw)
	b.pc.br.Reset(nil)
	readers.Put(b.pc.br)
	b.pc.br = nil
	return b.pc.c, raw, nil
}

// get takes a pooled connection to addr, or dials one (always, with
// fresh). With peek, a pooled one must pass alive first.
func (t *SyncTransport) get(ctx context.Context, addr string, peek, fresh bool) (*pconn, bool, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false, net.ErrClosed
	}
	for idle := t.idle[addr]; len(idle) > 0 && !fresh; idle = t.idle[addr] {
		pc := idle[len(idle)-1]
		t.idle[addr] = idle[:len(idle)-1]
		t.mu.Unlock()
		if pc.br.Buffered() == 0 && (!peek || alive(pc.c)) {
			return pc, true, nil
		}
		pc.c.Close()
		t.mu.Lock()
	}
	t.mu.Unlock()
	c, err := t.dial(ctx, addr)
	if err != nil {
		return nil, false, err
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	return &pconn{addr: addr, c: c, br: br}, false, nil
}

// alive reports whether an idle connection is still open and quiet: the
// peer closed it (a restart, an idle timeout) if a non-blocking peek sees
// EOF, and it is out of step if it sees bytes. Checking costs one syscall
// and spares a request with a body from being written into a dead
// connection, where its outcome could not be told.
func alive(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		// Bytes waiting under TLS on an idle connection are an alert (a
		// close_notify) or data nothing asked for: either way not reusable.
		// A server's session tickets came before the first response, which
		// the connection's first exchange read past.
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var b [1]byte
	cerr := rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true // never wait for readiness
	})
	return cerr == nil && ok
}

func (t *SyncTransport) dial(ctx context.Context, addr string) (net.Conn, error) {
	timeout := t.DialTimeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	var c net.Conn
	var err error
	if t.Dial != nil {
		c, err = t.Dial(ctx, addr)
	} else {
		d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil || t.TLS == nil {
		return c, err
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg := t.TLS
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		// As net/http's Transport does: the name checked is the host dialed.
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(hctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return tc, nil
}

func (t *SyncTransport) put(pc *pconn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	max := t.MaxIdlePerHost
	if max <= 0 {
		max = 256
	}
	if t.closed || len(t.idle[pc.addr]) >= max {
		pc.c.Close()
		return
	}
	if t.idle == nil {
		t.idle = map[string][]*pconn{}
	}
	t.idle[pc.addr] = append(t.idle[pc.addr], pc)
}

// Close closes the pooled connections; nothing is pooled afterwards.
func (t *SyncTransport) Close() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.closed = nil, true
	t.mu.Unlock()
	for _, pcs := range idle {
		for _, pc := range pcs {
			pc.c.Close()
		}
	}
}

// BufferPool hands ReverseProxy small copy buffers: its default is 32 KB
// per response, held for as long as a stream stays open.
type BufferPool struct{ p sync.Pool }

// Get implements httputil.BufferPool.
func (b *BufferPool) Get() []byte {
	if v := b.p.Get(); v != nil {
		return *(v.(*[]byte))
	}
	return make([]byte, 4<<10)
}

// Put implements httputil.BufferPool.
func (b *BufferPool) Put(buf []byte) { b.p.Put(&buf) }
