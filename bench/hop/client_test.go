package hop

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
)

// getter is the benchmark's load client: one keep-alive connection sending
// GET for one URL, reading fixed-length answers. net/http's client cost
// the shared machine about half a core at this benchmark's rates (a
// request, a response and header maps per call, a background read per
// connection); this spends a fraction of that, so more of the two cores
// goes to what is measured, and less of the machine's noise comes from
// the measuring.
type getter struct {
	addr string
	req  []byte
	conn net.Conn
	br   *bufio.Reader
	used bool // the connection has carried a request: the server may have closed it
}

func newGetter(u string) (*getter, error) {
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "http" {
		return nil, fmt.Errorf("getter: %q is not an http URL", u)
	}
	req := "GET " + pu.RequestURI() + " HTTP/1.1\r\nHost: " + pu.Host + "\r\nUser-Agent: bench-hop\r\n\r\n"
	return &getter{addr: pu.Host, req: []byte(req)}, nil
}

// get sends the request and reads a 200 answer with a Content-Length. A
// kept-alive connection the server closed before answering is replaced
// once, as net/http's client does for a GET.
func (g *getter) get() error {
	reused := g.used
	err := g.exchange()
	if err != nil && reused && errors.Is(err, errNoAnswer) {
		err = g.exchange()
	}
	return err
}

var errNoAnswer = errors.New("connection closed before an answer")

func (g *getter) exchange() error {
	if g.conn == nil {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			return err
		}
		g.conn, g.br, g.used = c, bufio.NewReaderSize(c, 4096), false
	}
	g.used = true
	if _, err := g.conn.Write(g.req); err != nil {
		g.close()
		return fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	status, err := g.br.ReadSlice('\n')
	if err != nil {
		g.close()
		if len(status) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)) {
			return fmt.Errorf("%w: %w", errNoAnswer, err)
		}
		return err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 200 ")) {
		g.close()
		return fmt.Errorf("GET %s: %q", g.addr, bytes.TrimSpace(status))
	}
	length, closing := -1, false
	for {
		line, err := g.br.ReadSlice('\n')
		if err != nil {
			g.close()
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				g.close()
				return fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			closing = true
		}
	}
	if length < 0 {
		g.close()
		return errors.New("an answer without a Content-Length")
	}
	if _, err := g.br.Discard(length); err != nil {
		g.close()
		return err
	}
	if closing {
		g.close()
	}
	return nil
}

func (g *getter) close() {
	if g.conn != nil {
		_ = g.conn.Close()
		g.conn, g.br = nil, nil
	}
}

// The load client reads fixed-length answers on one connection, comes
// back from a server that closed a kept-alive connection, and refuses
// what it cannot measure.
func TestGetter(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = io.WriteString(w, "fine")
		case "/chunked":
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "no length")
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	g, err := newGetter(srv.URL + "/ok")
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	for i := range 50 {
		if err := g.get(); err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("50 gets took %d connections, want 1", n)
	}
	srv.CloseClientConnections()
	if err := g.get(); err != nil {
		t.Fatalf("after the server closed the connection: %v", err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections after a reconnect, want 2", n)
	}
	for _, path := range []string{"/chunked", "/missing"} {
		bad, _ := newGetter(srv.URL + path)
		if err := bad.get(); err == nil {
			t.Errorf("%s: no error", path)
		}
		bad.close()
	}
}
