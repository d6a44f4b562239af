//go:build linux

package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"golang.org/x/sys/unix"
)

// connsRig: an upstream HTTP server, a front listener whose connections go
// straight into a Conns loop, and a net/http server taking connections the
// loop gives back.
type connsRig struct {
	t        *testing.T
	upAddr   string
	front    net.Listener
	loop     *Conns
	back     *HandBack
	upClosed chan struct{} // a stream's upstream request ended
	deadAddr string
	upConns  atomic.Int64 // connections the upstream accepted
	// Final routes: the upstream on a unix socket, one that drops the
	// second request on each of its connections, what their hooks saw.
	unixPath  string
	flakyPath string
	hooks     chan string
	barelf    atomic.Int64 // bare-LF answers the flaky upstream gave
	ticket    atomic.Value // Ticket of the latest Final exchange
	// /up/held: arrived gets each request, which waits for release.
	arrived, release chan struct{}
	mux              *http.ServeMux         // the upstreams' handlers
	tls              atomic.Pointer[tlsRig] // TLS upstreams, once startTLS ran (tls_linux_test.go)
}

// testRouter forwards /up/... to the upstream; /local/... goes back to
// net/http; /dead/... goes to an address nothing listens on.
type testRouter struct{ rig *connsRig }

func (r testRouter) Route(h *ReqHead) (Forward, bool) {
	addr, target, final := r.rig.upAddr, h.Target, false
	var timeout time.Duration
	var tlsConf *tls.Config
	switch {
	case strings.HasPrefix(h.Target, "/up/"):
	case strings.HasPrefix(h.Target, "/dead/"):
		addr = r.rig.deadAddr
	case strings.HasPrefix(h.Target, "/slow/"):
		target, timeout = "/up/hang", 300*time.Millisecond
	case strings.HasPrefix(h.Target, "/final/"):
		addr, target, final = r.rig.unixPath, strings.TrimPrefix(h.Target, "/final"), true
	case strings.HasPrefix(h.Target, "/finalrel/"):
		addr, target, final = "./"+filepath.Base(r.rig.unixPath), strings.TrimPrefix(h.Target, "/finalrel"), true
	case strings.HasPrefix(h.Target, "/finaldead/"):
		addr, target, final = r.rig.unixPath+".missing", "/up/fixed", true
	case strings.HasPrefix(h.Target, "/flaky/"):
		addr, final = r.rig.flakyPath, true
	case strings.HasPrefix(h.Target, "/tls") && r.rig.tls.Load() != nil:
		var ok bool
		if addr, target, final, timeout, tlsConf, ok = r.rig.tls.Load().route(h.Target); !ok {
			return Forward{}, false
		}
	default:
		return Forward{}, false
	}
	w := requestWire(h, target)
	fwd := Forward{Addr: addr, Wire: w, TLS: tlsConf, Refusal: "X-Refused", Refused: refusedIf("draining"), Timeout: timeout}
	if final {
		fwd.Final, fwd.FailMsg = true, "plugin gone"
		r.rig.ticket.Store(h.Ticket)
		fwd.Head = func(status int, stream bool) { r.rig.hooks <- fmt.Sprintf("head %d %v", status, stream) }
		fwd.Done = func(status int, err error) { r.rig.hooks <- fmt.Sprintf("done %d %v", status, err) }
	}
	return fwd, true
}

// requestWire is h's request for target, as a Router writes it upstream.
func requestWire(h *ReqHead, target string) []byte {
	w := fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\n", h.Method, target, h.Host)
	for _, f := range h.Fields {
		w = fmt.Appendf(w, "%s: %s\r\n", f.Name, f.Value)
	}
	if len(h.Body) > 0 || h.Method != "GET" && h.Method != "HEAD" {
		w = fmt.Appendf(w, "Content-Length: %d\r\n", len(h.Body))
	}
	return append(append(w, "\r\n"...), h.Body...)
}

func newConnsRig(t *testing.T) *connsRig {
	t.Helper()
	rig := &connsRig{t: t, upClosed: make(chan struct{}, 16), hooks: make(chan string, 64),
		arrived: make(chan struct{}, 16), release: make(chan struct{})}
	mux := http.NewServeMux()
	rig.mux = mux
	mux.HandleFunc("/up/fixed", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "fixed "+r.URL.RawQuery)
	})
	mux.HandleFunc("/up/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Len", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
	mux.HandleFunc("/up/chunked", func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			fmt.Fprintf(w, "part%d;", i)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/up/stream", func(w http.ResponseWriter, r *http.Request) {
		// One event, then silence until the client leaves: only the
		// client's hang-up can end it (no write fails first).
		defer func() { rig.upClosed <- struct{}{} }()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: tick\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	mux.HandleFunc("/up/hang", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	mux.HandleFunc("/up/held", func(w http.ResponseWriter, r *http.Request) {
		rig.arrived <- struct{}{}
		select {
		case <-rig.release:
			_, _ = io.WriteString(w, "released")
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/up/refuse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Refused", "draining")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/up/answer", func(w http.ResponseWriter, r *http.Request) {
		// The refusal field, with a value the Router does not call one.
		w.Header().Set("X-Refused", "other")
		_, _ = io.WriteString(w, "answered")
	})
	mux.HandleFunc("/up/large", func(w http.ResponseWriter, r *http.Request) {
		// Far more than one turn's read budget, chunked and fixed.
		if r.URL.RawQuery == "fixed" {
			w.Header().Set("Content-Length", strconv.Itoa(4<<20))
		}
		block := []byte(strings.Repeat("0123456789abcdef", 4096))
		for range (4 << 20) / len(block) {
			_, _ = w.Write(block)
		}
	})
	mux.HandleFunc("/up/closing", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bye")
	})
	mux.HandleFunc("/up/head", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		if r.Method != "HEAD" {
			_, _ = io.WriteString(w, "hello")
		}
	})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: mux, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			rig.upConns.Add(1)
		}
	}}
	go func() { _ = up.Serve(upLn) }()
	rig.upAddr = upLn.Addr().String()
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	rig.deadAddr = dead.Addr().String()
	dead.Close()
	rig.unixPath = t.TempDir() + "/up.sock"
	unixLn, err := net.Listen("unix", rig.unixPath)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = up.Serve(unixLn) }()
	rig.flakyPath = rig.unixPath + ".flaky"
	flakyLn, err := net.Listen("unix", rig.flakyPath)
	if err != nil {
		t.Fatal(err)
	}
	go serveFlaky(flakyLn, &rig.barelf)
	t.Cleanup(func() { _ = flakyLn.Close() })

	// net/http's side: what it answers proves it took the connection.
	rig.back = NewHandBack()
	back := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "net/http "+r.Method+" "+r.URL.Path)
	})}
	go func() { _ = back.Serve(rig.back) }()
	// The loop's own response bound is past the client's 10 s, so a 504
	// within it can only be a route's own bound (/slow/).
	rig.loop = NewConns(nil, testRouter{rig}, rig.back.Give, time.Minute)

	rig.front, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := rig.front.Accept()
			if err != nil {
				return
			}
			if err := rig.loop.Adopt(c, nil); err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("adopt: %v", err)
			}
		}
	}()
	t.Cleanup(func() {
		_ = rig.front.Close()
		if err := rig.loop.Close(); err != nil {
			t.Errorf("close loop: %v", err)
		}
		_ = back.Close()
		_ = rig.back.Close()
		_ = up.Close()
	})
	return rig
}

func (rig *connsRig) client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
}

func (rig *connsRig) get(c *http.Client, method, path, body string) (int, http.Header, string) {
	rig.t.Helper()
	req, _ := http.NewRequest(method, "http://"+rig.front.Addr().String()+path, strings.NewReader(body))
	if body == "" {
		req.Body = nil
	}
	resp, err := c.Do(req)
	if err != nil {
		rig.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rig.t.Fatalf("%s %s: body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// Requests on one kept-alive connection are forwarded by the loop: fixed
// and chunked bodies, uploads, HEAD, an upstream that closes after its
// answer; the connection stays with the loop throughout.
func TestConnsKeepAliveForwarding(t *testing.T) {
	rig := newConnsRig(t)
	c := rig.client()
	for i := range 50 {
		code, _, body := rig.get(c, "GET", fmt.Sprintf("/up/fixed?i=%d", i), "")
		if code != 200 || body != fmt.Sprintf("fixed i=%d", i) {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	upload := strings.Repeat("x", 40000)
	if code, h, body := rig.get(c, "POST", "/up/echo", upload); code != 200 || body != upload || h.Get("X-Len") != "40000" {
		t.Fatalf("upload: %d %q (%d bytes)", code, h.Get("X-Len"), len(body))
	}
	// A client that waits for 100 Continue before its body gets it from
	// the loop.
	raw, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(raw, "PUT /up/echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 14\r\n\r\n")
	rbr := bufio.NewReader(raw)
	if resp, err := http.ReadResponse(rbr, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue before the body: %v %v", resp, err)
	}
	_, _ = io.WriteString(raw, "after-continue")
	if resp, err := http.ReadResponse(rbr, nil); err != nil {
		t.Fatal(err)
	} else if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "after-continue" {
		t.Fatalf("after 100 Continue: %d %q", resp.StatusCode, b)
	}
	if code, _, body := rig.get(c, "GET", "/up/chunked", ""); code != 200 || body != "part0;part1;part2;" {
		t.Fatalf("chunked: %d %q", code, body)
	}
	if code, h, body := rig.get(c, "HEAD", "/up/head", ""); code != 200 || body != "" || h.Get("Content-Length") != "5" {
		t.Fatalf("HEAD: %d %q %v", code, body, h)
	}
	for _, q := range []string{"fixed", "chunked"} {
		if code, _, body := rig.get(c, "GET", "/up/large?"+q, ""); code != 200 || len(body) != 4<<20 || body[:16] != "0123456789abcdef" || body[len(body)-16:] != "0123456789abcdef" {
			t.Fatalf("large %s body: %d, %d bytes", q, code, len(body))
		}
	}
	if code, _, body := rig.get(c, "GET", "/up/closing", ""); code != 200 || body != "bye" {
		t.Fatalf("upstream closing: %d %q", code, body)
	}
	if code, _, body := rig.get(c, "GET", "/up/fixed?after=close", ""); code != 200 || body != "fixed after=close" {
		t.Fatalf("after the upstream closed: %d %q", code, body)
	}
	if got := rig.loop.Served(); got != 58 {
		t.Fatalf("the loop forwarded %d requests, want 58", got)
	}
	if got := rig.loop.HandedBack(); got != 0 {
		t.Fatalf("%d connections handed back, want 0", got)
	}
	// Pooled upstream connections carry the sequential requests: one,
	// another after the upstream closed its own, and at most one more.
	if got := rig.upConns.Load(); got > 3 {
		t.Fatalf("the upstream accepted %d connections for sequential requests, want at most 3 (pooled connections dropped?)", got)
	}
	if got := rig.loop.Len(); got != 2 { // the client's and the raw one
		t.Fatalf("the loop holds %d client connections, want 2", got)
	}
}

// Two requests written at once are answered in order.
func TestConnsPipelined(t *testing.T) {
	rig := newConnsRig(t)
	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /up/fixed?a HTTP/1.1\r\nHost: x\r\n\r\nGET /up/fixed?b HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	for _, want := range []string{"fixed a", "fixed b"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != want {
			t.Fatalf("got %q, want %q", b, want)
		}
	}
}

// What the loop does not forward itself goes to net/http with the request
// unread: a route it is not given, an owner refusing in-band (replayed),
// an upstream it cannot reach, a request it will not parse.
func TestConnsHandBack(t *testing.T) {
	rig := newConnsRig(t)
	c := rig.client()
	if code, _, body := rig.get(c, "GET", "/up/fixed?1", ""); code != 200 || body != "fixed 1" {
		t.Fatalf("forwarded: %d %q", code, body)
	}
	if code, h, body := rig.get(c, "GET", "/up/answer", ""); code != 200 || body != "answered" || h.Get("X-Refused") != "other" {
		t.Fatalf("a refusal field Refused does not call one: %d %v %q, want the answer relayed", code, h, body)
	}
	if code, _, body := rig.get(c, "GET", "/local/x", ""); code != 200 || body != "net/http GET /local/x" {
		t.Fatalf("local: %d %q", code, body)
	}
	// The same connection is net/http's now, and keeps working.
	if code, _, body := rig.get(c, "POST", "/local/y", "z"); code != 200 || body != "net/http POST /local/y" {
		t.Fatalf("after hand-back: %d %q", code, body)
	}
	for _, path := range []string{"/up/refuse", "/dead/x"} {
		c := rig.client()
		if code, _, body := rig.get(c, "POST", path, "payload"); code != 200 || body != "net/http POST "+path {
			t.Fatalf("%s: %d %q, want net/http to answer", path, code, body)
		}
	}
	for name, raw := range map[string]string{
		"bad request line": "GET /up/fixed HTTP/1.0\r\nHost: x\r\n\r\n",
		"two lengths":      "POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"length and chunked": "POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"0\r\n\r\n",
		"no host":  "GET /up/fixed HTTP/1.1\r\n\r\n",
		"obs-fold": "GET /up/fixed HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", rig.front.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		before := rig.loop.Served()
		_, _ = io.WriteString(conn, raw)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rig.loop.Served() != before {
			t.Fatalf("%s: the loop forwarded it itself", name)
		}
		if b, _ := io.ReadAll(resp.Body); strings.HasPrefix(string(b), "fixed") {
			t.Fatalf("%s: reached the upstream: %d %q", name, resp.StatusCode, b)
		}
	}
}

// ClientLimits hold the loop's connections to the front door's bounds: a
// body over MaxBody goes back to net/http unread (which refuses it there),
// and a connection idle for Idle closes.
func TestConnsClientLimits(t *testing.T) {
	rig := newConnsRig(t)
	rig.loop.SetClientLimits(ClientLimits{Idle: 300 * time.Millisecond, MaxBody: 100})
	c := rig.client()
	at := strings.Repeat("a", 100)
	if code, _, body := rig.get(c, "POST", "/up/echo", at); code != 200 || body != at {
		t.Fatalf("a body at the cap: %d %q, want it forwarded", code, body)
	}
	if code, _, body := rig.get(c, "POST", "/up/echo", at+"b"); code != 200 || body != "net/http POST /up/echo" {
		t.Fatalf("a body over the cap: %d %q, want net/http to answer", code, body)
	}
	if rig.loop.Served() != 1 || rig.loop.HandedBack() != 1 {
		t.Fatalf("the loop served %d and handed back %d, want 1 and 1", rig.loop.Served(), rig.loop.HandedBack())
	}
	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle connection: read %d, %v after %s, want it closed", n, err, time.Since(start))
	}
	// The sweep runs once a second.
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("an idle connection closed after %s, want about 300ms and a sweep", d)
	}
}

// A client that goes away mid-stream takes the upstream request with it;
// closing the loop leaves no descriptor behind.
func TestConnsClientGoneAndClose(t *testing.T) {
	rig := newConnsRig(t)
	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "GET /up/stream HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: tick\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	conn.Close()
	select {
	case <-rig.upClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream stream outlived its client")
	}
	// An idle kept-alive connection, then Close.
	c := rig.client()
	rig.get(c, "GET", "/up/fixed", "")
	if err := rig.loop.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("http://" + rig.front.Addr().String() + "/up/fixed"); err == nil {
		// The transport retried on a fresh connection: that one the
		// closed loop refused to adopt, so it must fail too.
		t.Fatal("a request after Close succeeded")
	}
	c.CloseIdleConnections()
	l := rig.loop
	l.mu.Lock()
	held, ups, epfd := len(l.clients), len(l.ups), l.epfd
	l.mu.Unlock()
	if held != 0 || ups != 0 || epfd != -1 || l.Len() != 0 {
		t.Fatalf("the closed loop holds %d clients, %d upstreams, epoll fd %d", held, ups, epfd)
	}
}

// quiet tells a pooled connection with nothing to read from one with bytes
// out of turn or a closed peer.
func TestQuiet(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	if !quiet(fds[0]) {
		t.Fatal("an idle connection is not quiet")
	}
	_, _ = unix.Write(fds[1], []byte("x"))
	if quiet(fds[0]) {
		t.Fatal("a connection with a byte to read is quiet")
	}
	var b [1]byte
	_, _ = unix.Read(fds[0], b[:])
	if !quiet(fds[0]) {
		t.Fatal("a drained connection is not quiet")
	}
	_ = unix.Close(fds[1])
	if quiet(fds[0]) {
		t.Fatal("a connection whose peer closed is quiet")
	}
}

// serveFlaky answers the first request on each connection with "ok <n>"
// (n counts connections), then closes the connection on reading the next
// one, unanswered: a kept-alive connection that dies under a request.
// A request for /flaky/barelf is answered, wherever it comes, with a head
// whose lines end in bare LFs (counted in barelf).
func serveFlaky(ln net.Listener, barelf *atomic.Int64) {
	for n := 1; ; n++ {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for i := 0; ; i++ {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if req.URL.Path == "/flaky/barelf" {
					barelf.Add(1)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\nContent-Length: 2\n\nok")
					continue
				}
				if i == 1 {
					return
				}
				body := fmt.Sprintf("ok %d", n)
				_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}
		}()
	}
}

func (rig *connsRig) hook(want string) {
	rig.t.Helper()
	select {
	case got := <-rig.hooks:
		if got != want {
			rig.t.Fatalf("hook: got %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		rig.t.Fatalf("hook %q never ran", want)
	}
}

// A unix socket named by a relative path (a plugin's socket under a data
// dir given as data/n1) is reached from the working directory, as
// net.Dial("unix") reaches it, on every request of a kept-alive
// connection; an address that is neither a path nor an IP and a port is
// answered 503 with why.
func TestConnsRelativeUnixSocket(t *testing.T) {
	rig := newConnsRig(t)
	t.Chdir(filepath.Dir(rig.unixPath))
	c := rig.client()
	for i := range 3 {
		if code, _, body := rig.get(c, "GET", "/finalrel/up/fixed?r", ""); code != 200 || body != "fixed r" {
			t.Fatalf("request %d over the relative unix socket: %d %q", i+1, code, body)
		}
		rig.hook("head 200 false")
		rig.hook("done 200 <nil>")
	}
	if _, _, err := sockaddr("localhost:8080"); err == nil || !strings.Contains(err.Error(), "neither a unix socket path") {
		t.Fatalf("a host name: %v, want refused", err)
	}
}

// A Final request (one the router spent something on) never goes back to
// net/http: it reaches a unix-socket upstream; a refusal, an upstream it
// cannot reach, answer 503 with the route's message; a pooled connection
// that dies under it is replaced once, whatever the method; its hooks see
// the head and the end; its Ticket ends it.
func TestConnsFinal(t *testing.T) {
	rig := newConnsRig(t)
	c := rig.client()
	if code, _, body := rig.get(c, "GET", "/final/up/fixed?u", ""); code != 200 || body != "fixed u" {
		t.Fatalf("over the unix socket: %d %q", code, body)
	}
	rig.hook("head 200 false")
	rig.hook("done 200 <nil>")
	if code, _, body := rig.get(c, "GET", "/final/up/chunked", ""); code != 200 || body != "part0;part1;part2;" {
		t.Fatalf("chunked over the unix socket: %d %q", code, body)
	}
	rig.hook("head 200 true")
	rig.hook("done 200 <nil>")

	code, h, body := rig.get(c, "POST", "/final/up/refuse", "x")
	if code != 503 || h.Get("Retry-After") != "1" || h.Get("Cache-Control") != "no-store" || h.Get("X-Refused") != "" || body != `{"error":"plugin gone"}`+"\n" {
		t.Fatalf("refused: %d %v %q", code, h, body)
	}
	rig.hook("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrRefused.Error()) // it ran nothing
	if code, _, body := rig.get(c, "POST", "/finaldead/x", "x"); code != 503 || body != `{"error":"plugin gone"}`+"\n" {
		t.Fatalf("unreachable: %d %q", code, body)
	}
	rig.hookPrefix("done 503 " + httpx.ErrNotSent.Error() + ": " + ErrUpstreamFailed.Error() + ": connect " + rig.unixPath + ".missing: ") // nothing was sent, and why
	if got := rig.loop.HandedBack(); got != 0 {
		t.Fatalf("%d connections handed back, want 0", got)
	}

	// The second GET goes out on the pooled connection, which dies under
	// it: it is sent again on a fresh one. A POST is not (the upstream may
	// have run it): 504, outcome unknown, no Retry-After.
	for _, want := range []string{"ok 1", "ok 2"} {
		if code, _, body := rig.get(c, "GET", "/flaky/x", ""); code != 200 || body != want {
			t.Fatalf("flaky upstream: %d %q, want %q", code, body, want)
		}
		rig.hook("head 200 false")
		rig.hook("done 200 <nil>")
	}
	if code, h, body := rig.get(c, "POST", "/flaky/y", "b"); code != 504 || h.Get("Retry-After") != "" ||
		body != `{"error":"owner did not answer in time; the request may have run","outcome":"unknown"}`+"\n" {
		t.Fatalf("POST on a connection that dies under it: %d %v %q, want 504 outcome unknown", code, h, body)
	}
	rig.hook("done 504 " + ErrUpstreamFailed.Error())

	// A response head with bare LFs is refused: the request was sent, so
	// 504, whether its connection was fresh or pooled (a response begun is
	// not a dead connection: the GET is not sent again).
	for _, path := range []string{"/flaky/x", "/flaky/barelf", "/flaky/barelf"} {
		code, _, body := rig.get(c, "GET", path, "")
		if path == "/flaky/x" {
			if code != 200 {
				t.Fatalf("flaky upstream: %d %q", code, body)
			}
			rig.hook("head 200 false")
			rig.hook("done 200 <nil>")
			continue
		}
		if code != 504 || strings.Contains(body, "ok") {
			t.Fatalf("a response head with bare LFs: %d %q, want 504", code, body)
		}
		rig.hook("done 504 " + ErrUpstreamProtocol.Error())
	}
	if got := rig.barelf.Load(); got != 2 {
		t.Fatalf("the upstream answered %d bare-LF heads for two GETs: a begun response was taken for a dead connection", got)
	}

	// Abort ends a stream: the client's connection closes, the upstream
	// request ends, Done says why.
	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /final/up/stream HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: tick\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	rig.hook("head 200 true")
	tk := rig.ticket.Load().(Ticket)
	tk.Abort()
	tk.Abort() // once over, it does nothing
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("after Abort the connection should end: %v", err)
	}
	select {
	case <-rig.upClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream stream outlived its aborted exchange")
	}
	rig.hook("done 200 " + ErrAborted.Error())

	// A route's own response bound: a head that does not come in time is
	// a 504 (it was sent: it may have run). The loop's own bound (a
	// minute) is past the client's timeout, so the 504 is the route's,
	// with no upper bound on time to measure (none holds under -race).
	if code, _, _ := rig.get(rig.client(), "GET", "/slow/x", ""); code != 504 {
		t.Fatalf("a route bounded to 300ms: %d, want 504", code)
	}
}

// Shutdown lets a request the loop is forwarding have its response before
// the loop closes (it may have run upstream already: cut short, its client
// would not know), and ends one still waiting when ctx is done.
func TestConnsShutdown(t *testing.T) {
	rig := newConnsRig(t) // its connections go straight into the loop
	c := rig.client()
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+rig.front.Addr().String()+"/up/held", strings.NewReader("x"))
		resp, err := c.Do(req)
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
	err := testutil.Eventually(10*time.Second, func() bool {
		rig.loop.mu.Lock()
		defer rig.loop.mu.Unlock()
		return rig.loop.draining
	})
	if err != nil {
		t.Fatal("Shutdown did not drain the loop")
	}
	close(rig.release)
	if got := <-answered; got != "200 released <nil> close=true" {
		t.Fatalf("the request under way at Shutdown got %q, want its whole answer", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if rig.loop.Len() != 0 {
		t.Fatalf("%d connections left after Shutdown", rig.loop.Len())
	}

	// An answer that never comes: Shutdown ends the exchange when ctx is done.
	rig2 := newConnsRig(t)
	c2 := rig2.client()
	failed := make(chan error, 1)
	go func() {
		resp, err := c2.Get("http://" + rig2.front.Addr().String() + "/up/held")
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	<-rig2.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := rig2.loop.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with an exchange that never ends: %v, want the deadline", err)
	}
	if err := <-failed; err == nil {
		t.Fatal("the cut-off request got an answer")
	}
}

// A draining loop closes no connection a request may be on its way on: an
// idle connection's next request is answered 503 + Retry-After +
// Connection: close (it did not run), even with a body the loop never
// reads (it lingers, so no reset destroys the answer), and only Shutdown
// closes the connections still idle.
func TestConnsDrainAnswersBeforeClosing(t *testing.T) {
	rig := newConnsRig(t) // its connections go straight into the loop
	dial := func() (net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", rig.front.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(conn)
		_, _ = io.WriteString(conn, "GET /up/fixed?a HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "fixed a" {
			t.Fatalf("before the drain: %d %q", resp.StatusCode, b)
		}
		return conn, br
	}
	plain, plainR := dial()
	upload, uploadR := dial()
	idle, idleR := dial()
	rig.loop.Drain()

	refused := func(br *bufio.Reader, what string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s after the drain: %v", what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !resp.Close || !strings.Contains(string(b), "shutting down") {
			t.Fatalf("%s after the drain: %d %v %q", what, resp.StatusCode, resp.Header, b)
		}
		if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("%s: after the answer the connection must end cleanly: %d %v", what, n, err)
		}
	}
	_, _ = io.WriteString(plain, "POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	refused(plainR, "a request")
	// A body the loop never reads, larger than the sockets' buffers.
	body := strings.Repeat("x", 4<<20)
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(upload, fmt.Sprintf("POST /up/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
		wrote <- err
	}()
	refused(uploadR, "an upload")
	if err := <-wrote; err != nil {
		t.Fatalf("the upload's body was not taken (dropped) while the loop lingered: %v", err)
	}
	// The clients close once answered; the loop lets go of them then.
	plain.Close()
	upload.Close()
	if err := testutil.Eventually(10*time.Second, func() bool { return rig.loop.Len() == 1 }); err != nil {
		t.Fatalf("%d connections held, want the idle one: %v", rig.loop.Len(), err)
	}
	if err := rig.loop.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n, err := idleR.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("an idle connection after Shutdown: %d %v, want EOF", n, err)
	}
	_ = idle
}

// headWork is how many head bytes the loop has looked at so far.
func (rig *connsRig) headWork() int64 {
	rig.loop.mu.Lock()
	defer rig.loop.mu.Unlock()
	return rig.loop.headWork
}

// A head trickled in a byte per read costs the loop work linear in its
// length (the search for its end resumes where it stopped), and a bare LF
// is not waited on: the connection goes to net/http at once, which
// refuses it.
func TestConnsTrickledHead(t *testing.T) {
	rig := newConnsRig(t)

	conn, err := net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second)) // the loop's own head timeout is 10 s
	_, _ = io.WriteString(conn, "\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bare LF: %v %v, want net/http's 400 at once", resp, err)
	}
	if got := rig.loop.HandedBack(); got != 1 {
		t.Fatalf("%d connections handed back, want 1", got)
	}

	req := "GET /up/fixed?trickled HTTP/1.1\r\nHost: x\r\n"
	for i := range 40 {
		req += fmt.Sprintf("X-Pad-%d: %s\r\n", i, strings.Repeat("v", 10))
	}
	req += "\r\n"
	conn, err = net.Dial("tcp", rig.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	base := rig.headWork()
	for i := range len(req) {
		if _, err := io.WriteString(conn, req[i:i+1]); err != nil {
			t.Fatal(err)
		}
		// One read per byte: wait until the loop has looked at it.
		deadline := time.Now().Add(10 * time.Second)
		for rig.headWork()-base < int64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("the loop did not read byte %d of the head", i)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "fixed trickled" {
		t.Fatalf("trickled request: %d %q", resp.StatusCode, b)
	}
	// The request's head: searched once, parsed once; the response's
	// head (under 200 bytes) the same.
	if work := rig.headWork() - base; work > int64(2*len(req)+400) {
		t.Fatalf("the loop looked at %d head bytes for a %d-byte head trickled a byte at a time (the search starts over on every read)", work, len(req))
	}
}

// refusedIf calls a response refused when its refusal field says want.
func refusedIf(want string) func(int, string) bool {
	return func(_ int, v string) bool { return v == want }
}
