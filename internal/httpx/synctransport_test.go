package httpx

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers "got <body>" and counts its connections.
func echoServer(t *testing.T, tls bool) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &conns
}

func newSync(t *testing.T) *SyncTransport {
	tr := &SyncTransport{Fallback: http.DefaultTransport} // the default TCP dial
	t.Cleanup(tr.Close)
	return tr
}

func post(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Post(url, "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// A pooled connection the server closed while idle (a restart, an idle
// timeout) is noticed before a request with a body is written into it:
// the POST goes out on a new connection instead of failing.
func TestSyncTransportSkipsConnectionsClosedWhileIdle(t *testing.T) {
	srv, conns := echoServer(t, false)
	c := &http.Client{Transport: newSync(t)}

	if got := post(t, c, srv.URL); got != "got body" {
		t.Fatalf("first POST: %q", got)
	}
	if got := post(t, c, srv.URL); got != "got body" || conns.Load() != 1 {
		t.Fatalf("second POST: %q on %d connections, want the pooled one", got, conns.Load())
	}
	srv.CloseClientConnections() // the server drops the idle connection
	if got := post(t, c, srv.URL); got != "got body" {
		t.Fatalf("POST after the server closed the idle connection: %q", got)
	}
	if conns.Load() != 2 {
		t.Fatalf("%d connections, want 2", conns.Load())
	}
}

// Anything but plain http goes to the fallback (TLS is its job).
func TestSyncTransportHTTPSUsesFallback(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer srv.Close()
	tr := newSync(t)
	tr.Fallback = srv.Client().Transport
	if got := post(t, &http.Client{Transport: tr}, srv.URL); got != "tls" {
		t.Fatalf("https through SyncTransport: %q", got)
	}
}

// Detach hands over the connection a streamed response arrives on, with
// the raw body bytes already read from it; the transport forgets it.
func TestSyncTransportDetach(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	tr := newSync(t)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	conn, raw, err := Detach(resp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Head and first chunk may come in separate reads: read the rest raw.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !strings.Contains(string(raw), "5\r\nfirst\r\n") {
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("raw body %q: %v", raw, err)
		}
		raw = append(raw, buf[:n]...)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatalf("closing a detached body: %v", err)
	}
	if _, _, err := Detach(resp); err == nil {
		t.Fatal("detached twice")
	}
	if _, ok := RawBody(resp); ok {
		t.Fatal("RawBody of a detached response")
	}
	tr.mu.Lock()
	pooled := len(tr.idle)
	tr.mu.Unlock()
	if pooled != 0 {
		t.Fatal("a detached connection went back to the pool")
	}
}

// A connection that dies after the owner took the request is retried
// only for a method safe to repeat: a body-less POST (an increment) must
// not run twice.
func TestSyncTransportRetriesOnlyIdempotent(t *testing.T) {
	for _, tc := range []struct {
		method string
		calls  int32
		ok     bool
	}{
		{method: "POST", calls: 2, ok: false},
		{method: "GET", calls: 3, ok: true},
	} {
		t.Run(tc.method, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 2 { // the second request: taken, then the connection dies
					c, _, err := http.NewResponseController(w).Hijack()
					if err == nil {
						c.Close()
					}
					return
				}
				io.WriteString(w, "ok")
			}))
			defer srv.Close()
			c := &http.Client{Transport: newSync(t)}
			do := func() error {
				req, _ := http.NewRequest(tc.method, srv.URL, nil)
				resp, err := c.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				_, err = io.ReadAll(resp.Body)
				return err
			}
			if err := do(); err != nil {
				t.Fatalf("first %s: %v", tc.method, err)
			}
			err := do()
			if (err == nil) != tc.ok || calls.Load() != tc.calls {
				t.Fatalf("%s on a connection that died mid-request: err %v after %d calls; want ok=%v after %d", tc.method, err, calls.Load(), tc.ok, tc.calls)
			}
		})
	}
}

// With TLS the transport speaks https on the caller's goroutine: one
// handshake for many requests, a POST after the server dropped the idle
// connection goes out on a new one, and plain http goes to Fallback.
func TestSyncTransportTLS(t *testing.T) {
	srv, conns := echoServer(t, true)
	var fellBack atomic.Int32
	tr := &SyncTransport{
		TLS: srv.Client().Transport.(*http.Transport).TLSClientConfig,
		Fallback: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			fellBack.Add(1)
			return nil, errors.New("fallback")
		}),
	}
	t.Cleanup(tr.Close)
	c := &http.Client{Transport: tr}
	for i := 0; i < 3; i++ {
		if got := post(t, c, srv.URL); got != "got body" {
			t.Fatalf("POST %d: %q", i, got)
		}
	}
	if conns.Load() != 1 || fellBack.Load() != 0 {
		t.Fatalf("3 POSTs took %d connections and %d fallbacks, want 1 and 0", conns.Load(), fellBack.Load())
	}
	srv.CloseClientConnections()
	if got := post(t, c, srv.URL); got != "got body" {
		t.Fatalf("POST after the server closed the idle connection: %q", got)
	}
	if _, err := c.Get("http://" + srv.Listener.Addr().String()); err == nil || fellBack.Load() != 1 {
		t.Fatalf("plain http through a TLS transport: err %v, %d fallbacks, want Fallback's error", err, fellBack.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A GET whose pooled connection turns out dead goes again on a new one,
// not on the next pooled one: when a peer closes its idle connections, it
// closes all of them together.
func TestSyncTransportRetriesOnAFreshConnection(t *testing.T) {
	var arrived sync.WaitGroup
	arrived.Add(3)
	var first atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !first.Load() {
			arrived.Done()
			arrived.Wait() // three at once: three pooled connections after
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	c := &http.Client{Transport: newSync(t)}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := c.Get(srv.URL); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // read to the end: pooled
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	first.Store(true)
	tr := c.Transport.(*SyncTransport)
	tr.mu.Lock()
	pooled := len(tr.idle[strings.TrimPrefix(srv.URL, "http://")])
	tr.mu.Unlock()
	if pooled != 3 {
		t.Fatalf("%d pooled connections, want 3", pooled)
	}
	srv.CloseClientConnections() // all three, while pooled
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatalf("GET after the server closed every pooled connection: %v", err)
	}
	resp.Body.Close()
}

// WithHeadTimeout bounds one request's wait for its response head, on the
// transport's own path and on Fallback's (a large upload); the body of an
// answer that came in time streams on past the bound.
func TestSyncTransportWithHeadTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hang" {
			<-release
			return
		}
		w.(http.Flusher).Flush() // the head now, the body after the bound
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, "late body")
	}))
	defer srv.Close()
	defer close(release)
	tr := newSync(t)
	tr.ResponseHeaderTimeout = time.Minute
	for _, body := range []string{"", strings.Repeat("x", SyncBodyLimit+1)} {
		path := "sync"
		if body != "" {
			path = "fallback"
		}
		req, _ := http.NewRequestWithContext(WithHeadTimeout(t.Context(), 100*time.Millisecond), "POST", srv.URL+"/hang", strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		start := time.Now()
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
			t.Fatalf("%s: a head that never comes answered %d", path, resp.StatusCode)
		} else if errors.Is(err, ErrNotSent) {
			t.Fatalf("%s: %v: the request was sent, its outcome is unknown", path, err)
		}
		if waited := time.Since(start); waited > 30*time.Second {
			t.Fatalf("%s: waited %s, the transport's bound, not the request's", path, waited)
		}
		req, _ = http.NewRequestWithContext(WithHeadTimeout(t.Context(), 100*time.Millisecond), "POST", srv.URL+"/slowbody", strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "late body" {
			t.Fatalf("%s: the body after the head's bound: %q %v", path, b, err)
		}
	}
}
