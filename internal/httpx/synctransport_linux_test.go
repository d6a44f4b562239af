//go:build linux

package httpx

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// resetServer answers every request "ok <n>" (n counts its connections),
// keeping each connection open, and can reset them (RST, not FIN: a peer
// that crashed, or closed with bytes unread).
type resetServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func newResetServer(t *testing.T) *resetServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &resetServer{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); s.reset() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c.(*net.TCPConn))
			s.mu.Unlock()
			go func() {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					body := fmt.Sprintf("ok %d", n)
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			}()
		}
	}()
	return s
}

func (s *resetServer) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	s.conns = nil
}

// control runs f on the descriptor of tr's one pooled connection to addr.
func control(t *testing.T, tr *SyncTransport, addr string, f func(fd int)) {
	t.Helper()
	tr.mu.Lock()
	idle := tr.idle[addr]
	tr.mu.Unlock()
	if len(idle) != 1 {
		t.Fatalf("%d pooled connections to %s, want 1", len(idle), addr)
	}
	rc, err := idle[0].c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(fd uintptr) { f(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}

// A GET written into a pooled connection its peer had reset fails its
// write with ECONNRESET, or with EPIPE once that error was reported: the
// connection was dead, not the request, and the GET goes again on a
// fresh connection. (A request that may not go twice is checked alive
// before reuse instead: TestSyncTransportRetriesOnlyIdempotent.)
func TestSyncTransportRetriesResetPooledConnections(t *testing.T) {
	for _, werr := range []syscall.Errno{syscall.ECONNRESET, syscall.EPIPE} {
		t.Run(werr.Error(), func(t *testing.T) {
			srv := newResetServer(t)
			addr := srv.ln.Addr().String()
			tr := newSync(t)
			c := &http.Client{Transport: tr}
			get := func(method string) (string, error) {
				req, _ := http.NewRequest(method, "http://"+addr+"/", nil)
				resp, err := c.Do(req)
				if err != nil {
					return "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return string(b), err
			}
			if got, err := get("GET"); err != nil || got != "ok 1" {
				t.Fatalf("first GET: %q %v", got, err)
			}
			srv.reset()
			// The RST has arrived once the pooled socket is closed.
			testutil.WaitFor(t, 10*time.Second, "the pooled connection sees the reset", func() bool {
				closed := false
				control(t, tr, addr, func(fd int) {
					info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
					closed = err == nil && info.State == 7 // TCP_CLOSE
				})
				return closed
			})
			if werr == syscall.EPIPE {
				// Reported (and cleared) here: the next write says EPIPE.
				control(t, tr, addr, func(fd int) {
					if e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || syscall.Errno(e) != syscall.ECONNRESET {
						t.Fatalf("SO_ERROR %v %v, want ECONNRESET", syscall.Errno(e), err)
					}
				})
			}
			if got, err := get("GET"); err != nil || got != "ok 2" {
				t.Fatalf("GET on a reset pooled connection: %q %v, want it sent again on a fresh one", got, err)
			}
		})
	}
}

// A pooled connection on which a response began and then broke off was
// not dead before the request: the upstream got it and may have run it,
// so even a GET is not sent again.
func TestSyncTransportKeepsAResponseBegun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					if i == 1 {
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n") // and no more
						return
					}
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nok %d", n)
				}
			}()
		}
	}()
	c := &http.Client{Transport: newSync(t)}
	url := "http://" + ln.Addr().String() + "/"
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok 1" {
		t.Fatalf("first GET: %q", b)
	}
	if resp, err := c.Get(url); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("a GET whose response broke off: %q, want the error (not sent again)", b)
	}
}
