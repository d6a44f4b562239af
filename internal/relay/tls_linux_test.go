//go:build linux

package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/pinnedd/pinnedd/internal/clustertls"
	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// testPKI is a throwaway cluster CA, with a server certificate for
// 127.0.0.1 and a client certificate it issued.
type testPKI struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

func newPKI(t testing.TB) testPKI {
	t.Helper()
	ca, err := clustertls.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(name string) tls.Certificate {
		certPEM, keyPEM, err := ca.Issue(name, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	caCert, err := clustertls.ParseCert(ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return testPKI{pool: pool, server: leaf("node-b"), client: leaf("node-a")}
}

// serverConfig takes TLS 1.3 clients with a certificate from the CA and
// counts the handshakes it completes (full or resumed) in handshakes.
func (p testPKI) serverConfig(handshakes *atomic.Int64) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.server},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.pool,
		VerifyConnection: func(tls.ConnectionState) error {
			if handshakes != nil {
				handshakes.Add(1)
			}
			return nil
		}}
}

// clientConfig presents the client certificate and trusts the servers
// trust issues.
func (p testPKI) clientConfig(trust *x509.CertPool) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.client},
		RootCAs: trust, ClientSessionCache: tls.NewLRUClientSessionCache(8)}
}

// tlsRig: TLS upstreams for a connsRig, each a route prefix (tlsRoute).
type tlsRig struct {
	client     *tls.Config  // trusts the rig's CA
	handshakes atomic.Int64 // completed by the TLS upstreams
	stalls     atomic.Int64 // connections the stalling upstream accepted
	counted    atomic.Int64 // requests that reached /up/count
	routes     []tlsRoute
	// /tlsslow/big: the upstream's first write that blocked (the bytes
	// written by then), and the end of its body.
	blocked chan int64
	bigDone chan struct{}
}

// tlsRoute: a request for prefix/rest goes to addr as target/rest.
type tlsRoute struct {
	prefix, addr, target string
	cfg                  *tls.Config
	final                bool
	timeout              time.Duration
}

func (tr *tlsRig) route(target string) (addr, to string, final bool, timeout time.Duration, cfg *tls.Config, ok bool) {
	for _, r := range tr.routes {
		if rest, found := strings.CutPrefix(target, r.prefix+"/"); found {
			return r.addr, r.target + "/" + rest, r.final, r.timeout, r.cfg, true
		}
	}
	return "", "", false, 0, nil, false
}

// bigBlock holds twice the 64 KiB block /up/big repeats, so that a
// window of up to a block's length at any offset is a slice of it.
var bigBlock = func() []byte {
	b := make([]byte, 2*64<<10)
	for i := range b {
		b[i] = byte(i % (64 << 10) % 251)
	}
	return b
}()

// startTLS serves the rig's handlers over mutual TLS 1.3:
//
//	/tls/X          /up/X on the TLS upstream
//	/tlsfinal/X     the same, Final
//	/tlstimeout/X   the same, with a 300 ms response bound
//	/tlsbadca/X     the same, trusting another CA (/tlsbadcafinal/X: Final)
//	/tlsflaky/X     serveFlaky over TLS, Final
//	/tlsstall/X     an upstream that accepts and never handshakes (/tlsstallfinal/X: Final)
//	/tlsdeadfinal/X an address nothing listens on, Final
//	/tlssplit/X     /up/X from an upstream writing one byte per write
//	/tlsslow/X      /up/X from an upstream with a small send buffer that reports a blocked write
func (rig *connsRig) startTLS() *tlsRig {
	t := rig.t
	pki := newPKI(t)
	tr := &tlsRig{client: pki.clientConfig(pki.pool), blocked: make(chan int64, 1), bigDone: make(chan struct{}, 1)}
	wrongCA := pki.clientConfig(newPKI(t).pool)
	srvConf := pki.serverConfig(&tr.handshakes)

	rig.mux.HandleFunc("/up/eof", func(w http.ResponseWriter, r *http.Request) {
		// A body that ends with the connection: several TLS records.
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
		_, _ = bw.Write(bigBlock[:100<<10])
		_ = bw.Flush()
	})
	rig.mux.HandleFunc("/up/hangup", func(w http.ResponseWriter, r *http.Request) {
		// A whole answer on a kept-alive connection, then the connection
		// closes: pooled, it is dead.
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye")
		_ = bw.Flush()
	})
	rig.mux.HandleFunc("/up/count", func(w http.ResponseWriter, r *http.Request) {
		tr.counted.Add(1)
		_, _ = io.WriteString(w, "counted")
	})
	rig.mux.HandleFunc("/up/trickle", func(w http.ResponseWriter, r *http.Request) {
		for i := range 300 {
			_, _ = w.Write(bigBlock[i : i+1])
			w.(http.Flusher).Flush()
		}
	})
	rig.mux.HandleFunc("/up/early", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "after hints")
	})
	rig.mux.HandleFunc("/up/big", func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.RawQuery)
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for off := 0; off < size; {
			n := min(size-off, 64<<10)
			if _, err := w.Write(bigBlock[:n]); err != nil { // off is a multiple of 64 KiB
				return
			}
			off += n
		}
		tr.bigDone <- struct{}{}
	})

	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	serve := func(wrap func(net.Conn) net.Conn) string {
		ln := listen()
		// Refused handshakes are the point of some tests: not logged.
		srv := &http.Server{Handler: rig.mux, ErrorLog: log.New(io.Discard, "", 0)}
		go func() { _ = srv.Serve(tls.NewListener(wrapListener{ln, wrap}, srvConf)) }()
		t.Cleanup(func() { _ = srv.Close() })
		return ln.Addr().String()
	}
	main := serve(nil)
	split := serve(func(c net.Conn) net.Conn { return byteWriter{c} })
	slow := serve(func(c net.Conn) net.Conn {
		_ = c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		return &blockSignal{Conn: c, blocked: tr.blocked}
	})
	flakyLn := listen()
	go serveFlaky(tls.NewListener(flakyLn, srvConf), new(atomic.Int64))
	t.Cleanup(func() { _ = flakyLn.Close() })
	stallLn := listen()
	go func() {
		for {
			c, err := stallLn.Accept()
			if err != nil {
				return
			}
			tr.stalls.Add(1)
			go func() {
				// Reads the ClientHello, answers nothing, ends when the
				// loop closes its end.
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() { _ = stallLn.Close() })
	stall := stallLn.Addr().String()

	tr.routes = []tlsRoute{
		{prefix: "/tls", addr: main, target: "/up", cfg: tr.client},
		{prefix: "/tlsfinal", addr: main, target: "/up", cfg: tr.client, final: true},
		{prefix: "/tlstimeout", addr: main, target: "/up", cfg: tr.client, timeout: 300 * time.Millisecond},
		{prefix: "/tlsbadca", addr: main, target: "/up", cfg: wrongCA},
		{prefix: "/tlsbadcafinal", addr: main, target: "/up", cfg: wrongCA, final: true},
		{prefix: "/tlsflaky", addr: flakyLn.Addr().String(), target: "/flaky", cfg: tr.client, final: true},
		{prefix: "/tlsstall", addr: stall, target: "/up", cfg: tr.client},
		{prefix: "/tlsstallfinal", addr: stall, target: "/up", cfg: tr.client, final: true},
		{prefix: "/tlsdeadfinal", addr: rig.deadAddr, target: "/up", cfg: tr.client, final: true},
		{prefix: "/tlssplit", addr: split, target: "/up", cfg: tr.client},
		{prefix: "/tlsslow", addr: slow, target: "/up", cfg: tr.client},
	}
	rig.tls.Store(tr)
	return tr
}

// setHandshakeTimeout shortens (or lengthens) the loop's handshake bound.
func (rig *connsRig) setHandshakeTimeout(d time.Duration) {
	rig.loop.mu.Lock()
	rig.loop.hsTimeout = d
	rig.loop.mu.Unlock()
}

type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.wrap == nil {
		return c, err
	}
	return l.wrap(c), nil
}

// byteWriter writes each byte with a write of its own: the peer gets TLS
// records split across many reads.
type byteWriter struct{ net.Conn }

func (c byteWriter) Write(p []byte) (int, error) {
	for i := range p {
		if _, err := c.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// blockSignal reports on blocked (once) how many bytes it had written when
// a write first waited 300 ms for room, and goes on writing.
type blockSignal struct {
	net.Conn
	once    sync.Once
	written int64
	blocked chan int64
}

func (c *blockSignal) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Conn.Write(p[done:])
		done += n
		c.written += int64(n)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			c.once.Do(func() { c.blocked <- c.written })
		case err != nil:
			return done, err
		}
	}
	return done, nil
}

// fetch is connsRig.get for any goroutine: it reports what failed.
func fetch(c *http.Client, method, url, body string) (int, http.Header, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	if body == "" {
		req.Body = nil
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// rawConn is a client connection to the loop, read as HTTP.
func (rig *connsRig) rawConn(reqs string) (net.Conn, *bufio.Reader) {
	rig.t.Helper()
	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		rig.t.Fatal(err)
	}
	rig.t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, reqs); err != nil {
		rig.t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

func readResp(t *testing.T, br *bufio.Reader, method string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// hookPrefix waits for the next hook and checks it starts with want.
func (rig *connsRig) hookPrefix(want string) string {
	rig.t.Helper()
	select {
	case got := <-rig.hooks:
		if !strings.HasPrefix(got, want) {
			rig.t.Fatalf("hook: got %q, want %q...", got, want)
		}
		return got
	case <-time.After(20 * time.Second):
		rig.t.Fatalf("hook %q... never ran", want)
	}
	return ""
}

// Requests on one kept-alive connection go to a TLS upstream over one
// pooled TLS connection: fixed, chunked, close-delimited and large bodies
// (many TLS records), uploads, HEAD, an upstream that closes after its
// answer.
func TestConnsTLSForwarding(t *testing.T) {
	rig := newConnsRig(t)
	tr := rig.startTLS()
	c := rig.client()
	const n = 20
	for i := range n {
		code, _, body := rig.get(c, "GET", fmt.Sprintf("/tls/fixed?i=%d", i), "")
		if code != 200 || body != fmt.Sprintf("fixed i=%d", i) {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if got := tr.handshakes.Load(); got != 1 {
		t.Fatalf("%d sequential requests took %d TLS handshakes, want 1 (pooled connection dropped?)", n, got)
	}
	upload := strings.Repeat("x", 60000)
	if code, h, body := rig.get(c, "POST", "/tls/echo", upload); code != 200 || body != upload || h.Get("X-Len") != "60000" {
		t.Fatalf("upload: %d %q (%d bytes)", code, h.Get("X-Len"), len(body))
	}
	if code, _, body := rig.get(c, "GET", "/tls/chunked", ""); code != 200 || body != "part0;part1;part2;" {
		t.Fatalf("chunked: %d %q", code, body)
	}
	if code, h, body := rig.get(c, "HEAD", "/tls/head", ""); code != 200 || body != "" || h.Get("Content-Length") != "5" {
		t.Fatalf("HEAD: %d %q %v", code, body, h)
	}
	for _, q := range []string{"fixed", "chunked"} {
		if code, _, body := rig.get(c, "GET", "/tls/large?"+q, ""); code != 200 || len(body) != 4<<20 || body[:16] != "0123456789abcdef" || body[len(body)-16:] != "0123456789abcdef" {
			t.Fatalf("large %s body: %d, %d bytes", q, code, len(body))
		}
	}
	if got := tr.handshakes.Load(); got != 1 {
		t.Fatalf("%d TLS handshakes so far, want 1", got)
	}
	if code, _, body := rig.get(c, "GET", "/tls/eof", ""); code != 200 || body != string(bigBlock[:100<<10]) {
		t.Fatalf("close-delimited: %d, %d bytes", code, len(body))
	}
	if code, _, body := rig.get(c, "GET", "/tls/closing", ""); code != 200 || body != "bye" {
		t.Fatalf("upstream closing: %d %q", code, body)
	}
	if code, _, body := rig.get(c, "GET", "/tls/fixed?after=close", ""); code != 200 || body != "fixed after=close" {
		t.Fatalf("after the upstream closed: %d %q", code, body)
	}
	if got := rig.loop.Served(); got != n+8 {
		t.Fatalf("the loop forwarded %d requests, want %d", got, n+8)
	}
	if got := rig.loop.HandedBack(); got != 0 {
		t.Fatalf("%d connections handed back, want 0", got)
	}
	// The closed connections were replaced: resumed, with the ticket the
	// first one got while the loop held it.
	if got := tr.handshakes.Load(); got != 3 {
		t.Fatalf("%d TLS handshakes, want 3 (one, then one after each upstream close)", got)
	}
}

// Requests written at once are answered in order; an informational
// response goes through before its final one, from a TLS upstream as from
// a plain one.
func TestConnsTLSPipelined(t *testing.T) {
	rig := newConnsRig(t)
	rig.startTLS()
	for _, up := range []string{"/up", "/tls"} {
		_, br := rig.rawConn(strings.ReplaceAll("GET /U/fixed?a HTTP/1.1\r\nHost: x\r\n\r\n"+
			"GET /U/early HTTP/1.1\r\nHost: x\r\n\r\n"+
			"GET /U/chunked HTTP/1.1\r\nHost: x\r\n\r\n"+
			"GET /U/fixed?b HTTP/1.1\r\nHost: x\r\n\r\n", "/U", up))
		if code, _, body := readResp(t, br, "GET"); code != 200 || body != "fixed a" {
			t.Fatalf("%s first: %d %q", up, code, body)
		}
		if code, h, _ := readResp(t, br, "GET"); code != http.StatusEarlyHints || h.Get("Link") == "" {
			t.Fatalf("%s: %d %v, want 103 Early Hints with its Link", up, code, h)
		}
		if code, h, body := readResp(t, br, "GET"); code != 200 || body != "after hints" || h.Get("Link") != "" {
			t.Fatalf("%s after the hints: %d %v %q", up, code, h, body)
		}
		if code, _, body := readResp(t, br, "GET"); code != 200 || body != "part0;part1;part2;" {
			t.Fatalf("%s chunked: %d %q", up, code, body)
		}
		if code, _, body := readResp(t, br, "GET"); code != 200 || body != "fixed b" {
			t.Fatalf("%s last: %d %q", up, code, body)
		}
	}
}

// A Final request to a TLS upstream: its hooks, a refusal, a pooled
// connection that died idle or under it (a GET is sent again on a fresh
// one, a POST is not), Abort, a route's own response bound.
func TestConnsTLSFinal(t *testing.T) {
	rig := newConnsRig(t)
	rig.startTLS()
	c := rig.client()
	if code, _, body := rig.get(c, "GET", "/tlsfinal/fixed?u", ""); code != 200 || body != "fixed u" {
		t.Fatalf("final: %d %q", code, body)
	}
	rig.hook("head 200 false")
	rig.hook("done 200 <nil>")
	code, h, body := rig.get(c, "POST", "/tlsfinal/refuse", "x")
	if code != 503 || h.Get("Retry-After") != "1" || body != `{"error":"plugin gone"}`+"\n" {
		t.Fatalf("refused: %d %v %q", code, h, body)
	}
	rig.hook("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrRefused.Error())
	if code, _, body := rig.get(rig.client(), "POST", "/tls/refuse", "x"); code != 200 || body != "net/http POST /tls/refuse" {
		t.Fatalf("refused, not Final: %d %q, want net/http's answer", code, body)
	}

	// The upstream closes a connection after its answer: the next request
	// on it is sent again on a fresh one, or never reaches it.
	for _, path := range []string{"/tlsfinal/hangup", "/tlsfinal/fixed?after"} {
		if code, _, body := rig.get(c, "GET", path, ""); code != 200 {
			t.Fatalf("%s: %d %q", path, code, body)
		}
		rig.hook("head 200 false")
		rig.hook("done 200 <nil>")
	}
	for _, want := range []string{"ok 1", "ok 2"} {
		if code, _, body := rig.get(c, "GET", "/tlsflaky/x", ""); code != 200 || body != want {
			t.Fatalf("flaky upstream: %d %q, want %q", code, body, want)
		}
		rig.hook("head 200 false")
		rig.hook("done 200 <nil>")
	}
	if code, h, _ := rig.get(c, "POST", "/tlsflaky/y", "b"); code != 504 || h.Get("Retry-After") != "" {
		t.Fatalf("POST on a connection that dies under it: %d %v, want 504", code, h)
	}
	rig.hook("done 504 " + ErrUpstreamFailed.Error())

	_, br := rig.rawConn("GET /tlsfinal/stream HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: tick\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	rig.hook("head 200 true")
	rig.ticket.Load().(Ticket).Abort()
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("after Abort the connection should end: %v", err)
	}
	select {
	case <-rig.upClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream stream outlived its aborted exchange")
	}
	rig.hook("done 200 " + ErrAborted.Error())

	if code, _, _ := rig.get(rig.client(), "GET", "/tlstimeout/hang", ""); code != 504 {
		t.Fatalf("a route bounded to 300ms: %d, want 504", code)
	}
}

// An upstream that takes the connection and never handshakes: the request
// waits for the handshake's bound without holding up the loop (another
// client is served meanwhile), then fails as an unreachable upstream does:
// a Final request gets 503 + Retry-After (nothing was sent), another goes
// to net/http.
func TestConnsTLSHandshakeStall(t *testing.T) {
	rig := newConnsRig(t)
	tr := rig.startTLS()
	rig.setHandshakeTimeout(2 * time.Second)
	type answer struct {
		code int
		h    http.Header
		body string
		err  error
	}
	stalled := make(chan answer, 1)
	go func() {
		var a answer
		a.code, a.h, a.body, a.err = fetch(rig.client(), "GET", "http://"+rig.front.Addr().String()+"/tlsstallfinal/x", "")
		stalled <- a
	}()
	testutil.WaitFor(t, 10*time.Second, "the stalling upstream took the loop's connection", func() bool { return tr.stalls.Load() == 1 })
	if code, _, body := rig.get(rig.client(), "GET", "/tls/fixed?during", ""); code != 200 || body != "fixed during" {
		t.Fatalf("another client during the stall: %d %q", code, body)
	}
	select {
	case a := <-stalled:
		t.Fatalf("the stalled request was answered (%d %v) before its handshake's bound", a.code, a.err)
	default:
	}
	a := <-stalled
	if a.err != nil || a.code != 503 || a.h.Get("Retry-After") != "1" || a.body != `{"error":"plugin gone"}`+"\n" {
		t.Fatalf("stalled handshake: %d %v %q %v, want 503 + Retry-After", a.code, a.h, a.body, a.err)
	}
	rig.hookPrefix("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrUpstreamFailed.Error() + ": tls handshake")

	if code, _, body := rig.get(rig.client(), "GET", "/tlsstall/y", ""); code != 200 || body != "net/http GET /tlsstall/y" {
		t.Fatalf("stalled handshake, not Final: %d %q, want net/http's answer", code, body)
	}
	if got := rig.loop.HandedBack(); got != 1 {
		t.Fatalf("%d connections handed back, want 1", got)
	}
}

// An upstream whose certificate the config does not trust: the handshake
// fails and nothing is sent; a Final request gets 503, another goes to
// net/http. A refused connection is the same.
func TestConnsTLSWrongCA(t *testing.T) {
	rig := newConnsRig(t)
	tr := rig.startTLS()
	if code, h, body := rig.get(rig.client(), "POST", "/tlsdeadfinal/count", "x"); code != 503 || h.Get("Retry-After") != "1" {
		t.Fatalf("refused connection: %d %v %q, want 503 + Retry-After", code, h, body)
	}
	rig.hookPrefix("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrUpstreamFailed.Error() + ": tls handshake")
	code, h, body := rig.get(rig.client(), "POST", "/tlsbadcafinal/count", "x")
	if code != 503 || h.Get("Retry-After") != "1" {
		t.Fatalf("untrusted upstream: %d %v %q, want 503 + Retry-After", code, h, body)
	}
	if got := rig.hookPrefix("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrUpstreamFailed.Error() + ": tls handshake"); !strings.Contains(got, "certificate") {
		t.Fatalf("the handshake failed for another reason: %q", got)
	}
	if code, _, body := rig.get(rig.client(), "GET", "/tlsbadca/count", ""); code != 200 || body != "net/http GET /tlsbadca/count" {
		t.Fatalf("untrusted upstream, not Final: %d %q, want net/http's answer", code, body)
	}
	if got, hs := tr.counted.Load(), tr.handshakes.Load(); got != 0 || hs != 0 {
		t.Fatalf("the untrusted upstream got %d requests over %d handshakes, want none", got, hs)
	}
}

// An upstream that writes its TLS records a byte per write: the loop
// decodes records that arrive across many reads (and bodies written a
// byte per record).
func TestConnsTLSSplitRecords(t *testing.T) {
	rig := newConnsRig(t)
	rig.startTLS()
	c := rig.client()
	if code, _, body := rig.get(c, "GET", "/tlssplit/trickle", ""); code != 200 || body != string(bigBlock[:300]) {
		t.Fatalf("a body a byte per record, each record a byte per write: %d %q", code, body)
	}
	if code, _, body := rig.get(c, "GET", "/tlssplit/fixed?s", ""); code != 200 || body != "fixed s" {
		t.Fatalf("fixed: %d %q", code, body)
	}
	upload := strings.Repeat("y", 20000)
	if code, _, body := rig.get(c, "POST", "/tlssplit/echo", upload); code != 200 || body != upload {
		t.Fatalf("echo: %d, %d bytes", code, len(body))
	}
}

// A client that does not read stops the loop reading from its TLS
// upstream: the loop keeps little for it, the upstream's writes block,
// and once the client reads, every byte arrives in order.
func TestConnsTLSSlowClient(t *testing.T) {
	rig := newConnsRig(t)
	tr := rig.startTLS()
	const size = 64 << 20
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10) })
	}}
	conn, err := d.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(conn, "GET /tlsslow/big?%d HTTP/1.1\r\nHost: x\r\n\r\n", size)
	select {
	case n := <-tr.blocked:
		t.Logf("the upstream's writes blocked after %d bytes", n)
	case <-tr.bigDone:
		t.Fatalf("the upstream wrote all %d bytes to a client that reads nothing", size)
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream neither blocked nor finished")
	}
	held := 0
	rig.loop.mu.Lock()
	for _, c := range rig.loop.clients {
		if u := c.up; u != nil {
			held = len(c.out) + len(u.in) + len(u.tls.wire.out)
		}
	}
	rig.loop.mu.Unlock()
	if held > 2*readBuf {
		t.Fatalf("the loop holds %d bytes for a client that reads nothing, want at most %d", held, 2*readBuf)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	<-tr.bigDone
}

// Shutdown lets a request forwarded over TLS have its response.
func TestConnsTLSShutdown(t *testing.T) {
	rig := newConnsRig(t)
	rig.startTLS()
	answered := make(chan string, 1)
	go func() {
		resp, err := rig.client().Post("http://"+rig.front.Addr().String()+"/tls/held", "text/plain", strings.NewReader("x"))
		if err != nil {
			answered <- err.Error()
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- fmt.Sprintf("%d %s %v close=%v", resp.StatusCode, b, err, resp.Close)
	}()
	<-rig.arrived
	shut := make(chan error, 1)
	go func() { shut <- rig.loop.Shutdown(context.Background()) }()
	testutil.WaitFor(t, 10*time.Second, "the loop draining", func() bool {
		rig.loop.mu.Lock()
		defer rig.loop.mu.Unlock()
		return rig.loop.draining
	})
	close(rig.release)
	if got := <-answered; got != "200 released <nil> close=true" {
		t.Fatalf("the request under way at Shutdown got %q, want its whole answer", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Close with TLS upstreams pooled, relaying, and in a handshake leaves no
// goroutine and no descriptor behind.
func TestConnsTLSCloseLeaksNothing(t *testing.T) {
	rig := newConnsRig(t)
	tr := rig.startTLS()
	rig.setHandshakeTimeout(time.Minute) // still under way at Close
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	pooled, br := rig.rawConn("GET /tls/fixed?p HTTP/1.1\r\nHost: x\r\n\r\n")
	if code, _, body := readResp(t, br, "GET"); code != 200 || body != "fixed p" {
		t.Fatalf("pooled: %d %q", code, body)
	}
	streaming, sbr := rig.rawConn("GET /tls/stream HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(sbr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: tick\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	stalled, _ := rig.rawConn("GET /tlsstall/x HTTP/1.1\r\nHost: x\r\n\r\n")
	testutil.WaitFor(t, 10*time.Second, "a handshake under way", func() bool { return tr.stalls.Load() == 1 })

	if err := rig.loop.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []net.Conn{pooled, streaming, stalled} {
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("after Close: %v, want EOF", err)
		}
		_ = c.Close()
	}
	select {
	case <-rig.upClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream stream outlived the loop")
	}
	testutil.WaitFor(t, 10*time.Second, "goroutines and descriptors back to where they were", func() bool {
		return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds
	})
}

// tlsPair is a TLS upstream connection made as the loop makes one, over a
// socketpair whose other end a tls.Server serves through hold.
func tlsPair(t *testing.T) (*tlsEnd, *tls.Conn, *holdConn, *tls.Config) {
	t.Helper()
	pki := newPKI(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fds[0]) })
	f := os.NewFile(uintptr(fds[1]), "server")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	hold := &holdConn{Conn: nc}
	srv := tls.Server(hold, pki.serverConfig(nil))
	cfg := pki.clientConfig(pki.pool)
	up, err := newTLSUp(fds[0], "127.0.0.1:1", cfg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Handshake() }()
	up.handshook(up.conn.Handshake())
	if err := up.hs.err; err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	up.hs = nil
	return up, srv, hold, cfg
}

// holdConn keeps what is written to it while hold is set.
type holdConn struct {
	net.Conn
	hold bool
	held []byte
}

func (c *holdConn) Write(p []byte) (int, error) {
	if c.hold {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// A record that arrives a byte at a time decodes once whole: each read
// before that is a temporary error crypto/tls does not keep, and the
// record's first bytes stay buffered.
func TestTLSWireSplitRecord(t *testing.T) {
	up, srv, hold, _ := tlsPair(t)
	buf := make([]byte, 64)
	if n, err := up.read(buf); n != 0 || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("an idle connection read %d, %v; want EAGAIN", n, err)
	}
	const msg = "a record split across reads decodes"
	hold.hold = true
	if _, err := srv.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	hold.hold = false
	rec := hold.held
	for i := range rec {
		if _, err := hold.Conn.Write(rec[i : i+1]); err != nil {
			t.Fatal(err)
		}
		n, err := up.read(buf)
		if i < len(rec)-1 {
			if n != 0 || !errors.Is(err, unix.EAGAIN) {
				t.Fatalf("byte %d of %d: read %d, %v; want EAGAIN", i+1, len(rec), n, err)
			}
			continue
		}
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("the whole record: %q, %v", buf[:n], err)
		}
	}
	if n, err := up.read(buf); n != 0 || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("after the record: %d, %v; want EAGAIN", n, err)
	}
}

// What the socket does not take waits in the wire, with no error for
// crypto/tls to keep, and goes out as the socket takes it.
func TestTLSWireWriteBuffer(t *testing.T) {
	up, srv, _, _ := tlsPair(t)
	big := bytes.Repeat(bigBlock, 16) // 2 MiB, far more than a socket buffer
	if _, err := up.conn.Write(big); err != nil {
		t.Fatal(err)
	}
	if len(up.wire.out) == 0 {
		t.Fatal("the socket took 2 MiB at once: nothing was left to buffer")
	}
	got := make(chan error, 1)
	go func() {
		b := make([]byte, len(big))
		_, err := io.ReadFull(srv, b)
		if err == nil && !bytes.Equal(b, big) {
			err = errors.New("bytes differ")
		}
		got <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		done, err := up.wire.flush()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still buffered", len(up.wire.out))
		}
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(up.wire.fd), Events: unix.POLLOUT}}, 1000)
	}
	if err := <-got; err != nil {
		t.Fatalf("what the server read: %v", err)
	}
}

// A pooled TLS connection is quiet through a session ticket that arrives
// while it is idle (consumed, and cached), not with application data or
// after a close_notify.
func TestTLSQuiet(t *testing.T) {
	up, srv, _, cfg := tlsPair(t)
	if quiet(up.wire.fd) {
		t.Fatal("no session ticket arrived after the handshake")
	}
	if !up.quiet() {
		t.Fatal("a connection with only a session ticket to read is not quiet")
	}
	if _, ok := cfg.ClientSessionCache.Get("127.0.0.1"); !ok {
		t.Fatal("the session ticket was not consumed into the cache")
	}
	if !quiet(up.wire.fd) || !up.quiet() {
		t.Fatal("a drained connection is not quiet")
	}
	if _, err := srv.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if up.quiet() {
		t.Fatal("a connection with application data is quiet")
	}
	up2, srv2, _, _ := tlsPair(t)
	if !up2.quiet() {
		t.Fatal("an idle connection is not quiet")
	}
	if err := srv2.Close(); err != nil {
		t.Fatal(err)
	}
	if up2.quiet() {
		t.Fatal("a connection closed with close_notify is quiet")
	}
}

// benchRouter sends every request to one Forward.
type benchRouter struct{ fwd Forward }

func (r benchRouter) Route(*ReqHead) (Forward, bool) { return r.fwd, true }

const cannedResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// serveCanned answers every request head on every connection with
// cannedResponse.
func serveCanned(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) == 2 {
					if _, err := io.WriteString(c, cannedResponse); err != nil {
						return
					}
				}
			}
		}()
	}
}

// BenchmarkConnsForward: sequential requests on one kept-alive client
// connection, through a Conns, to a local upstream over a pooled plain or
// TLS connection: what TLS costs a request.
func BenchmarkConnsForward(b *testing.B) {
	pki := newPKI(b)
	for _, name := range []string{"plain", "tls"} {
		b.Run(name, func(b *testing.B) {
			upLn, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer upLn.Close()
			var served net.Listener = upLn
			var cfg *tls.Config
			if name == "tls" {
				served, cfg = tls.NewListener(upLn, pki.serverConfig(nil)), pki.clientConfig(pki.pool)
			}
			go serveCanned(served)
			fwd := Forward{Addr: upLn.Addr().String(), Wire: []byte("GET /x HTTP/1.1\r\nHost: up\r\n\r\n"), TLS: cfg}
			loop := NewConns(nil, benchRouter{fwd}, func(c net.Conn) { _ = c.Close() }, time.Minute)
			defer loop.Close()
			front, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer front.Close()
			go func() {
				c, err := front.Accept()
				if err == nil {
					_ = loop.Adopt(c, nil)
				}
			}()
			conn, err := net.Dial("tcp", front.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			measureRoundTrips(b, conn)
		})
	}
}

// measureRoundTrips times sequential GETs on conn, a client connection to
// a loop forwarding to serveCanned, after a first one (which connects and
// handshakes), with the process's CPU a request.
func measureRoundTrips(b *testing.B, conn net.Conn) {
	req := []byte("GET /x HTTP/1.1\r\nHost: front\r\n\r\n")
	resp := make([]byte, len(cannedResponse))
	roundTrip := func() {
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, resp); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip()
	if string(resp) != cannedResponse {
		b.Fatalf("response %q", resp)
	}
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for b.Loop() {
		roundTrip()
	}
	b.StopTimer()
	// The process's CPU (client, loop and upstream together): the round
	// trip's time is mostly waiting, and noisy.
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
