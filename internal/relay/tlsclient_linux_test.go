//go:build linux

package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// tlsFront: clients over mutual TLS 1.3 to a front whose connections are
// made by ServerTLS, handshaken with a deadline, and served by net/http,
// which answers each request and then adopts the connection into a Conns
// (as pinboard's keptAlive does). The loop forwards /up/... (and /slow/...)
// to a plain upstream and gives anything else back to net/http, which
// answers and adopts again.
type tlsFront struct {
	t      *testing.T
	client *tls.Config
	addr   string // the front's
	up     string // the plain upstream
	slow   string // the same handlers, a small send buffer, and a signal when a write blocks
	loop   *Conns
	// wrap: net/http gets each *tls.Conn wrapped in a peerConn.
	wrap bool
	mu   sync.Mutex
	// peers: what net/http got for each client (by its address); seen:
	// each routed request's ReqHead.Conn, in order.
	peers    map[string]net.Conn
	seen     []net.Conn
	answered atomic.Int64 // requests net/http answered
	sawTLS   atomic.Int64 // of which net/http saw as TLS, with the client's certificate
	blocked  chan int64   // /slow/big: bytes written when a write first blocked
	bigDone  chan struct{}
	arrived  chan struct{} // /up/held: each request, which waits for release
	release  chan struct{}
}

// peerConn is a caller's wrapper over a TLS connection, carrying what it
// learnt of the peer: the loop hands back this very object.
type peerConn struct {
	net.Conn
	peer string
}

func (p *peerConn) NetConn() net.Conn { return p.Conn }

type tlsFrontRouter struct{ f *tlsFront }

func (r tlsFrontRouter) Route(h *ReqHead) (Forward, bool) {
	r.f.mu.Lock()
	r.f.seen = append(r.f.seen, h.Conn)
	r.f.mu.Unlock()
	addr, target := r.f.up, h.Target
	switch {
	case strings.HasPrefix(target, "/up/"):
	case strings.HasPrefix(target, "/slow/"):
		addr, target = r.f.slow, "/up/"+strings.TrimPrefix(target, "/slow/")
	default:
		return Forward{}, false
	}
	return Forward{Addr: addr, Wire: requestWire(h, target)}, true
}

func newTLSFront(t *testing.T, wrap bool) *tlsFront {
	t.Helper()
	pki := newPKI(t)
	f := &tlsFront{t: t, client: pki.clientConfig(pki.pool), wrap: wrap, peers: map[string]net.Conn{},
		blocked: make(chan int64, 1), bigDone: make(chan struct{}, 1), arrived: make(chan struct{}, 4), release: make(chan struct{})}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/up/fixed", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "fixed "+r.URL.RawQuery)
	})
	mux.HandleFunc("/up/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Len", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
	mux.HandleFunc("/up/big", func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.RawQuery)
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for off := 0; off < size; {
			n := min(size-off, 64<<10)
			if _, err := w.Write(bigBlock[:n]); err != nil { // off is a multiple of 64 KiB
				return
			}
			off += n
		}
		select {
		case f.bigDone <- struct{}{}:
		default:
		}
	})
	mux.HandleFunc("/up/held", func(w http.ResponseWriter, r *http.Request) {
		f.arrived <- struct{}{}
		select {
		case <-f.release:
			_, _ = io.WriteString(w, "released")
		case <-r.Context().Done():
		}
	})
	up := &http.Server{Handler: mux}
	upLn, slowLn := listen(), listen()
	go func() { _ = up.Serve(upLn) }()
	go func() {
		_ = up.Serve(wrapListener{slowLn, func(c net.Conn) net.Conn {
			_ = c.(*net.TCPConn).SetWriteBuffer(64 << 10)
			return &blockSignal{Conn: c, blocked: f.blocked}
		}})
	}()
	f.up, f.slow = upLn.Addr().String(), slowLn.Addr().String()

	// One net/http server takes the front's connections (accepted) and
	// those the loop gives back (back).
	accepted, back := NewHandBack(), NewHandBack()
	srv := &http.Server{Handler: http.HandlerFunc(f.serveHTTP), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(accepted) }()
	go func() { _ = srv.Serve(back) }()
	f.loop = NewConns(nil, tlsFrontRouter{f}, back.Give, time.Minute)

	ln := listen()
	f.addr = ln.Addr().String()
	srvConf := pki.serverConfig(nil)
	var handshakes sync.WaitGroup
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			handshakes.Add(1)
			go func() {
				defer handshakes.Done()
				tc, err := ServerTLS(raw, srvConf)
				if err != nil {
					t.Errorf("ServerTLS: %v", err)
					return
				}
				_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					_ = tc.Close()
					return
				}
				_ = tc.SetDeadline(time.Time{})
				var c net.Conn = tc
				if f.wrap {
					c = &peerConn{Conn: tc, peer: tc.ConnectionState().PeerCertificates[0].Subject.CommonName}
				}
				f.mu.Lock()
				f.peers[tc.RemoteAddr().String()] = c
				f.mu.Unlock()
				accepted.Give(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		handshakes.Wait()
		if err := f.loop.Close(); err != nil {
			t.Errorf("close loop: %v", err)
		}
		_ = srv.Close()
		_ = up.Close()
	})
	return f
}

// serveHTTP answers any request itself, then adopts its connection.
func (f *tlsFront) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.answered.Add(1)
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "node-a" {
		f.sawTLS.Add(1)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	body := "net/http " + r.Method + " " + r.URL.Path
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = io.WriteString(w, body)
	if r.Close {
		return
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		return
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending, _ = brw.Reader.Peek(n)
	}
	if err := f.loop.Adopt(conn, pending); err != nil && !errors.Is(err, ErrClosed) {
		f.t.Errorf("adopt: %v", err)
	}
}

// dial connects a TLS client (with a receive buffer of rcvbuf, if not 0),
// and checks what net/http got for it: a peerConn, or the bare *tls.Conn.
func (f *tlsFront) dial(rcvbuf int) (*tls.Conn, *bufio.Reader) {
	f.t.Helper()
	d := &tls.Dialer{Config: f.client, NetDialer: &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		if rcvbuf == 0 {
			return nil
		}
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf) })
	}}}
	c, err := d.Dial("tcp", f.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	tc := c.(*tls.Conn)
	f.t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(60 * time.Second))
	if v := tc.ConnectionState().Version; v != tls.VersionTLS13 {
		f.t.Fatalf("TLS version %x, want 1.3", v)
	}
	return tc, bufio.NewReader(tc)
}

// served is what net/http got for the client c.
func (f *tlsFront) served(c net.Conn) net.Conn {
	f.t.Helper()
	var got net.Conn
	testutil.WaitFor(f.t, 10*time.Second, "the server's connection", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = f.peers[c.LocalAddr().String()]
		return got != nil
	})
	return got
}

// first sends the connection's first request, which net/http answers
// before the loop adopts the connection.
func (f *tlsFront) first(c net.Conn, br *bufio.Reader) {
	f.t.Helper()
	if code, body := ask(f.t, c, br, "/first", ""); code != 200 || body != "net/http GET /first" {
		f.t.Fatalf("first request: %d %q", code, body)
	}
	testutil.WaitFor(f.t, 10*time.Second, "the loop adopting the connection", func() bool { return f.loop.Len() == 1 })
}

// seenConns is ReqHead.Conn of every request the Router saw.
func (f *tlsFront) seenConns() []net.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]net.Conn(nil), f.seen...)
}

// Pipelined requests on an adopted TLS connection are served by the loop;
// one the Router refuses, in their midst, goes back to net/http on the same
// TLS connection with those after it, and the loop adopts the connection
// again after net/http answered it. Every request the Router sees names
// the connection net/http was given (ReqHead.Conn): a caller's wrapper
// survives the hand-back. Both with and without a wrapper.
func TestConnsTLSClientPipelined(t *testing.T) {
	for _, wrap := range []bool{true, false} {
		t.Run(fmt.Sprintf("wrapped=%v", wrap), func(t *testing.T) {
			f := newTLSFront(t, wrap)
			c, br := f.dial(0)
			f.first(c, br)
			if wrap {
				if f.sawTLS.Load() != 0 {
					t.Fatal("net/http saw a wrapped connection as TLS")
				}
			} else if f.sawTLS.Load() != 1 {
				t.Fatal("net/http did not see the bare connection as TLS with the client's certificate")
			}
			const n = 30
			var reqs strings.Builder
			for i := range n {
				switch {
				case i == 10 || i == 20:
					fmt.Fprintf(&reqs, "GET /refused/%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
				case i%3 == 0:
					// More after a refusal than net/http reads at once:
					// what it did not read of the loop's goes on to the
					// loop again.
					body := strings.Repeat(strconv.Itoa(i), 500)
					fmt.Fprintf(&reqs, "POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				default:
					fmt.Fprintf(&reqs, "GET /up/fixed?%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
				}
			}
			if _, err := io.WriteString(c, reqs.String()); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				method := "GET"
				want := fmt.Sprintf("fixed %d", i)
				switch {
				case i == 10 || i == 20:
					want = fmt.Sprintf("net/http GET /refused/%d", i)
				case i%3 == 0:
					method, want = "POST", strings.Repeat(strconv.Itoa(i), 500)
				}
				if code, _, body := readResp(t, br, method); code != 200 || body != want {
					t.Fatalf("response %d: %d %q, want %q", i, code, body, want)
				}
			}
			testutil.WaitFor(t, 10*time.Second, "the loop adopting the connection again", func() bool { return f.loop.Len() == 1 })
			if got := f.loop.HandedBack(); got != 2 {
				t.Fatalf("%d hand-backs, want 2", got)
			}
			if got := f.loop.Served(); got != n-2 {
				t.Fatalf("the loop served %d requests, want %d", got, n-2)
			}
			if got := f.answered.Load(); got != 3 {
				t.Fatalf("net/http answered %d requests, want 3", got)
			}
			want := f.served(c)
			if p, ok := want.(*peerConn); wrap && (!ok || p.peer != "node-a") {
				t.Fatalf("net/http got %T, want the peerConn", want)
			}
			seen := f.seenConns()
			if len(seen) != n {
				t.Fatalf("the Router saw %d requests, want %d", len(seen), n)
			}
			for i, got := range seen {
				if got != want {
					t.Fatalf("request %d: ReqHead.Conn is %T %p, want what net/http was given, %T %p", i, got, got, want, want)
				}
			}
		})
	}
}

// A connection given back is one net/http serves as it serves any: it
// unwraps (NetConn) to what Adopt was given, reads the unanswered request
// first, and its deadlines and Close work.
func TestConnsTLSClientHandBackConn(t *testing.T) {
	f := newTLSFront(t, true)
	given := make(chan net.Conn, 1)
	f.loop.handBack = func(c net.Conn) { given <- c } // before the loop starts
	c, br := f.dial(0)
	f.first(c, br)
	if _, err := io.WriteString(c, "GET /refused HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	var got net.Conn
	select {
	case got = <-given:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing handed back")
	}
	nc, ok := got.(interface{ NetConn() net.Conn })
	if !ok || nc.NetConn() != f.served(c) {
		t.Fatalf("handed back %T, which does not unwrap to what Adopt was given", got)
	}
	if got.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("handed back with remote address %v, want %v", got.RemoteAddr(), c.LocalAddr())
	}
	br2 := bufio.NewReader(got)
	req, err := http.ReadRequest(br2)
	if err != nil || req.URL.Path != "/refused" {
		t.Fatalf("first request read from what was handed back: %v %v", req, err)
	}
	// Nothing more: a read deadline ends the wait, and is not kept.
	_ = got.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := br2.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	_ = got.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	if b := make([]byte, 4); func() error { _, err := io.ReadFull(br2, b); return err }() != nil || string(b) != "ping" {
		t.Fatal("no read after a deadline passed")
	}
	if _, err := io.WriteString(got, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong"); err != nil {
		t.Fatal(err)
	}
	if code, _, body := readResp(t, br, "GET"); code != 200 || body != "pong" {
		t.Fatalf("answer written to what was handed back: %d %q", code, body)
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after Close: %v, want EOF (close_notify)", err)
	}
}

// Bodies of many TLS records both ways: an upload near the loop's limit,
// one behind Expect: 100-continue, and a 4 MiB response.
func TestConnsTLSClientLarge(t *testing.T) {
	f := newTLSFront(t, true)
	c, br := f.dial(0)
	f.first(c, br)
	up := strings.Repeat("0123456789abcdef", 60<<10/16)
	if _, err := fmt.Fprintf(c, "POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(up), up); err != nil {
		t.Fatal(err)
	}
	if code, h, body := readResp(t, br, "POST"); code != 200 || body != up || h.Get("X-Len") != strconv.Itoa(len(up)) {
		t.Fatalf("upload: %d, %d bytes back", code, len(body))
	}

	if _, err := fmt.Fprintf(c, "POST /up/echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(up)); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := readResp(t, br, "POST"); code != 100 {
		t.Fatalf("before the body: %d, want 100 Continue", code)
	}
	if _, err := io.WriteString(c, up); err != nil {
		t.Fatal(err)
	}
	if code, _, body := readResp(t, br, "POST"); code != 200 || body != up {
		t.Fatalf("upload after 100-continue: %d, %d bytes back", code, len(body))
	}

	const size = 4 << 20
	if _, err := fmt.Fprintf(c, "GET /up/big?%d HTTP/1.1\r\nHost: x\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	readBig(t, br, size)
	if got := f.loop.Served(); got != 3 || f.loop.HandedBack() != 0 {
		t.Fatalf("the loop served %d and handed back %d, want 3 and 0", got, f.loop.HandedBack())
	}
}

// readBig reads a response of size bytes of bigBlock's pattern from br.
func readBig(t *testing.T, br *bufio.Reader, size int) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	chunk := make([]byte, 64<<10)
	for off := 0; off < size; {
		n, err := resp.Body.Read(chunk)
		if n > 0 && !bytes.Equal(chunk[:n], bigBlock[off%(64<<10):off%(64<<10)+n]) {
			t.Fatalf("the body differs from what the upstream wrote at offset %d", off)
		}
		off += n
		if err != nil {
			if off != size {
				t.Fatalf("body: %d bytes of %d: %v", off, size, err)
			}
			break
		}
	}
}

// A TLS client that does not read stops the loop reading from the
// upstream: the loop keeps little for it, the upstream's writes block, and
// once the client reads, every byte arrives in order.
func TestConnsTLSClientSlow(t *testing.T) {
	f := newTLSFront(t, true)
	c, br := f.dial(64 << 10)
	f.first(c, br)
	const size = 64 << 20
	if _, err := fmt.Fprintf(c, "GET /slow/big?%d HTTP/1.1\r\nHost: x\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-f.blocked:
		t.Logf("the upstream's writes blocked after %d bytes", n)
	case <-f.bigDone:
		t.Fatalf("the upstream wrote all %d bytes to a client that reads nothing", size)
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream neither blocked nor finished")
	}
	held := 0
	f.loop.mu.Lock()
	for _, cl := range f.loop.clients {
		if u := cl.up; u != nil {
			held = len(cl.out) + len(cl.tls.wire.out) + len(u.in)
		}
	}
	f.loop.mu.Unlock()
	// A read's worth in each of the upstream's buffer and the client's
	// wire, the latter with its records' overhead.
	if held > 2*readBuf+4<<10 {
		t.Fatalf("the loop holds %d bytes for a client that reads nothing, want at most %d", held, 2*readBuf+4<<10)
	}
	readBig(t, br, size)
	<-f.bigDone
}

// The loop closes an adopted TLS connection idle past its bound, or one
// whose client left, and with it the descriptor.
func TestConnsTLSClientEnds(t *testing.T) {
	for _, end := range []string{"idle", "client-closes"} {
		t.Run(end, func(t *testing.T) {
			f := newTLSFront(t, true)
			if end == "idle" {
				f.loop.idleAfter = 200 * time.Millisecond // before the loop starts
			}
			c, br := f.dial(0)
			f.first(c, br)
			fds := openFDs(t) // the loop's own, and both ends of c
			if code, body := ask(t, c, br, "/up/fixed?x", ""); code != 200 || body != "fixed x" {
				t.Fatalf("through the loop: %d %q", code, body)
			}
			if end == "idle" {
				if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("an idle connection: read %v, want it closed", err)
				}
			}
			_ = c.Close()
			testutil.WaitFor(t, 10*time.Second, "the loop letting go of the connection", func() bool { return f.loop.Len() == 0 })
			// c's two ends closed; the upstream connection stays pooled,
			// a descriptor on each side.
			testutil.WaitFor(t, 10*time.Second, "descriptors back", func() bool { return openFDs(t) <= fds })
		})
	}
}

// Shutdown lets a request in flight on an adopted TLS connection have its
// whole response, which says Connection: close.
func TestConnsTLSClientShutdown(t *testing.T) {
	f := newTLSFront(t, true)
	c, br := f.dial(0)
	f.first(c, br)
	if _, err := io.WriteString(c, "GET /up/held HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-f.arrived
	shut := make(chan error, 1)
	go func() { shut <- f.loop.Shutdown(context.Background()) }()
	testutil.WaitFor(t, 10*time.Second, "the loop draining", func() bool {
		f.loop.mu.Lock()
		defer f.loop.mu.Unlock()
		return f.loop.draining
	})
	close(f.release)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "released" || !resp.Close {
		t.Fatalf("the request under way at Shutdown got %q %v close=%v, want its whole answer", b, err, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection is open after Shutdown")
	}
}

// Close with adopted TLS clients, one given back and taken again, one
// waiting for a response, leaves no goroutine and no descriptor behind.
func TestConnsTLSClientCloseLeaksNothing(t *testing.T) {
	f := newTLSFront(t, true)
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	idle, ibr := f.dial(0)
	f.first(idle, ibr)
	if code, body := ask(t, idle, ibr, "/refused", ""); code != 200 || body != "net/http GET /refused" {
		t.Fatalf("handed back: %d %q", code, body)
	}
	if code, body := ask(t, idle, ibr, "/up/fixed?y", ""); code != 200 || body != "fixed y" {
		t.Fatalf("adopted again: %d %q", code, body)
	}
	busy, bbr := f.dial(0)
	if code, body := ask(t, busy, bbr, "/first", ""); code != 200 || body != "net/http GET /first" {
		t.Fatalf("first request: %d %q", code, body)
	}
	testutil.WaitFor(t, 10*time.Second, "both adopted", func() bool { return f.loop.Len() == 2 })
	if _, err := io.WriteString(busy, "GET /up/held HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-f.arrived

	if err := f.loop.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []net.Conn{idle, busy} {
		// The loop closes the socket (no close_notify), as a plain one.
		if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("after Close: the connection is still open")
		}
		_ = c.Close()
	}
	testutil.WaitFor(t, 10*time.Second, "goroutines and descriptors back to where they were", func() bool {
		return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds
	})
}

// ServerTLS's connection is any Go conn under net/http: its addresses are
// the socket's, a deadline ends a wait without spoiling the connection,
// Close sends close_notify and closes the descriptors, and the slot the
// accepted connection held goes along and is given back once.
func TestServerTLSConn(t *testing.T) {
	pki := newPKI(t)
	raw, peer := slottedPair(t)
	laddr, raddr := raw.LocalAddr(), raw.RemoteAddr()
	fds := openFDs(t)
	tc, err := ServerTLS(raw, pki.serverConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	held(t, raw)
	cfg := pki.clientConfig(pki.pool)
	cfg.ServerName = "127.0.0.1"
	client := tls.Client(peer, cfg)
	shaken := make(chan error, 1)
	go func() { shaken <- client.Handshake() }()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-shaken; err != nil {
		t.Fatal(err)
	}
	if tc.LocalAddr().String() != laddr.String() || tc.RemoteAddr().String() != raddr.String() {
		t.Fatalf("addresses %v %v, want %v %v", tc.LocalAddr(), tc.RemoteAddr(), laddr, raddr)
	}
	_ = tc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	b := make([]byte, 16)
	var ne net.Error
	if _, err := tc.Read(b); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout net.Error", err)
	}
	_ = tc.SetReadDeadline(time.Time{})
	go func() { _, _ = client.Write([]byte("hello")) }()
	if n, err := tc.Read(b); err != nil || string(b[:n]) != "hello" {
		t.Fatalf("read after the deadline: %q %v", b[:n], err)
	}
	if _, err := tc.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if n, err := io.ReadFull(client, b[:5]); err != nil || string(b[:n]) != "world" {
		t.Fatalf("client read %q %v", b[:n], err)
	}
	held(t, raw)
	if err := tc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(b); err != io.EOF {
		t.Fatalf("after Close: %v, want EOF (close_notify)", err)
	}
	givenBackOnce(t, raw, "Close")
	if got := openFDs(t); got > fds-1 {
		t.Fatalf("%d descriptors open after Close, want at most %d", got, fds-1)
	}
}

// BenchmarkConnsServe: sequential requests on one adopted client
// connection, plain or TLS, through a Conns to a local plain upstream:
// what serving a TLS client costs a request.
func BenchmarkConnsServe(b *testing.B) {
	pki := newPKI(b)
	for _, name := range []string{"plain", "tls"} {
		b.Run(name, func(b *testing.B) {
			upLn, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer upLn.Close()
			go serveCanned(upLn)
			fwd := Forward{Addr: upLn.Addr().String(), Wire: []byte("GET /x HTTP/1.1\r\nHost: up\r\n\r\n")}
			loop := NewConns(nil, benchRouter{fwd}, func(c net.Conn) { _ = c.Close() }, time.Minute)
			defer loop.Close()
			front, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer front.Close()
			adopted := make(chan error, 1)
			go func() {
				c, err := front.Accept()
				if err == nil && name == "tls" {
					var tc *tls.Conn
					if tc, err = ServerTLS(c, pki.serverConfig(nil)); err == nil {
						err = tc.Handshake()
						c = tc
					}
				}
				if err == nil {
					err = loop.Adopt(c, nil)
				}
				adopted <- err
			}()
			var conn net.Conn
			if name == "tls" {
				conn, err = tls.Dial("tcp", front.Addr().String(), pki.clientConfig(pki.pool))
			} else {
				conn, err = net.Dial("tcp", front.Addr().String())
			}
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			if err := <-adopted; err != nil {
				b.Fatal(err)
			}
			measureRoundTrips(b, conn)
		})
	}
}

// The slot an accepted connection holds goes with it through ServerTLS,
// the loop, a hand-back and the loop again, and is given back once: when
// the loop closes the connection, or net/http the one given back.
func TestConnsTLSClientCarriesSlot(t *testing.T) {
	for _, end := range []string{"loop-closes", "net/http-closes"} {
		t.Run(end, func(t *testing.T) {
			f := newTLSFront(t, false)
			pki := newPKI(t) // the front's CA is the rig's own: this pair gets another
			raw, peer := slottedPair(t)
			tc, err := ServerTLS(raw, pki.serverConfig(nil))
			if err != nil {
				t.Fatal(err)
			}
			cfg := pki.clientConfig(pki.pool)
			cfg.ServerName = "127.0.0.1"
			client := tls.Client(peer, cfg)
			shaken := make(chan error, 1)
			go func() { shaken <- client.Handshake() }()
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			if err := <-shaken; err != nil {
				t.Fatal(err)
			}
			if err := f.loop.Adopt(tc, nil); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(client)
			if code, body := ask(t, client, br, "/refused", ""); code != 200 || body != "net/http GET /refused" {
				t.Fatalf("handed back: %d %q", code, body)
			}
			if code, body := ask(t, client, br, "/up/fixed?z", ""); code != 200 || body != "fixed z" {
				t.Fatalf("adopted again: %d %q", code, body)
			}
			held(t, raw)
			if end == "loop-closes" {
				_ = client.Close()
			} else if code, body := ask(t, client, br, "/refused", "Connection: close\r\n"); code != 200 || body != "net/http GET /refused" {
				t.Fatalf("handed back to close: %d %q", code, body)
			}
			givenBackOnce(t, raw, end)
		})
	}
}
