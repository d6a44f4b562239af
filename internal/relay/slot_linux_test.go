//go:build linux

package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// slotted is an accepted connection holding a slot under a connection cap,
// as the front door's are: Close gives it back (once), unless Detach
// handed it over; then each call of the release Detach returned gives it
// back. gaveBack counts every give-back: exactly one per connection is
// right.
type slotted struct {
	net.Conn
	closed   atomic.Bool
	detached atomic.Bool
	gaveBack atomic.Int32
}

func (c *slotted) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) && !c.detached.Load() {
		c.gaveBack.Add(1)
	}
	return err
}

func (c *slotted) Detach() func() {
	c.detached.Store(true)
	return func() { c.gaveBack.Add(1) }
}

func (c *slotted) SyscallConn() (syscall.RawConn, error) { return c.Conn.(syscall.Conn).SyscallConn() }

// wrapped is a connection over another, as a hijack may return: the slot
// is found through Unwrap.
type wrapped struct{ net.Conn }

func (w wrapped) Unwrap() net.Conn { return w.Conn }

func (w wrapped) SyscallConn() (syscall.RawConn, error) { return w.Conn.(syscall.Conn).SyscallConn() }

// slottedPair is a loopback TCP pair whose accepted end holds a slot.
func slottedPair(t *testing.T) (*slotted, net.Conn) {
	t.Helper()
	a, b := tcpPair(t)
	t.Cleanup(func() { _ = b.Close() })
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	return &slotted{Conn: a}, b
}

// held checks that c's slot is still held (the loop has its socket).
func held(t *testing.T, c *slotted) {
	t.Helper()
	if n := c.gaveBack.Load(); n != 0 {
		t.Fatalf("slot given back %d times while the connection is open", n)
	}
}

// givenBackOnce waits until c's slot is given back, and checks it was given
// back once.
func givenBackOnce(t *testing.T, c *slotted, what string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, what+": the slot given back", func() bool { return c.gaveBack.Load() != 0 })
	if n := c.gaveBack.Load(); n != 1 {
		t.Fatalf("%s: slot given back %d times, want 1", what, n)
	}
}

// ask sends a GET for path on b and returns the answer's body.
func ask(t *testing.T, b net.Conn, br *bufio.Reader, path, extra string) (int, string) {
	t.Helper()
	if _, err := fmt.Fprintf(b, "GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n", path, extra); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// A connection the kept-alive loop adopts keeps its slot until the loop
// closes it, whichever way: the client hangs up, it sits idle past the
// bound, the loop shuts down. Then the slot is given back once.
func TestConnsCarrySlot(t *testing.T) {
	for _, end := range []string{"client-closes", "idle", "shutdown", "close"} {
		t.Run(end, func(t *testing.T) {
			rig := newConnsRig(t)
			if end == "idle" {
				rig.loop.idleAfter = 200 * time.Millisecond // before the loop starts
			}
			c, b := slottedPair(t)
			var conn net.Conn = c
			if end == "client-closes" {
				conn = wrapped{c}
			}
			if err := rig.loop.Adopt(conn, nil); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(b)
			if code, body := ask(t, b, br, "/up/fixed?a", ""); code != 200 || body != "fixed a" {
				t.Fatalf("through the loop: %d %q", code, body)
			}
			held(t, c)
			switch end {
			case "client-closes":
				_ = b.Close()
			case "idle":
				if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
					t.Fatalf("an idle connection: %v, want it closed", err)
				}
			case "shutdown":
				if err := rig.loop.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
			case "close":
				if err := rig.loop.Close(); err != nil {
					t.Fatal(err)
				}
			}
			givenBackOnce(t, c, end)
			_ = rig.loop.Close() // whatever was left to run has run
			if n := c.gaveBack.Load(); n != 1 {
				t.Fatalf("after the loop closed: slot given back %d times, want 1", n)
			}
		})
	}
}

// A connection the loop refuses gives its slot back at once.
func TestConnsRefusedGivesSlotBack(t *testing.T) {
	rig := newConnsRig(t)
	if err := rig.loop.Close(); err != nil {
		t.Fatal(err)
	}
	c, _ := slottedPair(t)
	if err := rig.loop.Adopt(c, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Adopt on a closed loop: %v", err)
	}
	if n := c.gaveBack.Load(); n != 1 {
		t.Fatalf("refused: slot given back %d times, want 1", n)
	}
}

// A connection the loop gives back to net/http takes its slot along:
// net/http's Close gives it back, once; taken by the loop again, it is the
// loop's to give back.
func TestConnsHandBackCarriesSlot(t *testing.T) {
	rig := newConnsRig(t) // the upstream, and a router
	back := NewHandBack()
	var loop *Conns
	readopted := make(chan error, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		_, _ = io.WriteString(w, "nh")
		if r.URL.Path != "/local/readopt" {
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			readopted <- err
			return
		}
		conn, _, err := rc.Hijack()
		if err != nil {
			readopted <- err
			return
		}
		readopted <- loop.Adopt(conn, nil)
	})}
	go func() { _ = srv.Serve(back) }()
	loop = NewConns(nil, testRouter{rig}, back.Give, time.Minute)
	t.Cleanup(func() {
		_ = loop.Close()
		_ = srv.Close()
		_ = back.Close()
	})

	// Given back, then closed by net/http (Connection: close).
	c, b := slottedPair(t)
	if err := loop.Adopt(c, nil); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(b)
	if code, body := ask(t, b, br, "/up/fixed?1", ""); code != 200 || body != "fixed 1" {
		t.Fatalf("through the loop: %d %q", code, body)
	}
	if code, body := ask(t, b, br, "/local/x", ""); code != 200 || body != "nh" {
		t.Fatalf("given back: %d %q", code, body)
	}
	held(t, c) // net/http holds the connection now
	if code, body := ask(t, b, br, "/local/y", "Connection: close\r\n"); code != 200 || body != "nh" {
		t.Fatalf("closing: %d %q", code, body)
	}
	givenBackOnce(t, c, "closed by net/http")

	// Given back, then the client hangs up on net/http.
	c, b = slottedPair(t)
	if err := loop.Adopt(c, nil); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(b)
	if code, body := ask(t, b, br, "/local/x", ""); code != 200 || body != "nh" {
		t.Fatalf("given back: %d %q", code, body)
	}
	held(t, c)
	_ = b.Close()
	givenBackOnce(t, c, "client left net/http")

	// Given back, taken by the loop again, then closed by it.
	c, b = slottedPair(t)
	if err := loop.Adopt(c, nil); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(b)
	if code, body := ask(t, b, br, "/local/readopt", ""); code != 200 || body != "nh" {
		t.Fatalf("given back: %d %q", code, body)
	}
	if err := <-readopted; err != nil {
		t.Fatalf("adopted again: %v", err)
	}
	if code, body := ask(t, b, br, "/up/fixed?2", ""); code != 200 || body != "fixed 2" {
		t.Fatalf("through the loop again: %d %q", code, body)
	}
	held(t, c)
	_ = b.Close()
	givenBackOnce(t, c, "adopted again, then closed")
	if err := loop.Close(); err != nil {
		t.Fatal(err)
	}
	if n := c.gaveBack.Load(); n != 1 {
		t.Fatalf("after the loop closed: slot given back %d times, want 1", n)
	}
}

// A held stream's client keeps its slot until the loop closes the stream,
// whichever way it ends; a stream the loop refuses gives it back at once.
func TestLoopCarriesSlot(t *testing.T) {
	for _, end := range []string{"client-gone", "complete", "shutdown", "refused"} {
		t.Run(end, func(t *testing.T) {
			l := New(nil)
			t.Cleanup(func() { _ = l.Close() })
			if end == "refused" {
				_ = l.Close()
			}
			c, client := slottedPair(t)
			owner, up := tcpPair(t)
			t.Cleanup(func() { _ = owner.Close() })
			var conn net.Conn = c
			if end == "client-gone" {
				conn = wrapped{c}
			}
			var e ends
			err := l.Add(Stream{Client: conn, Upstream: up, Head: []byte("H\r\n\r\n"), Chunked: true, Done: e.done})
			if end == "refused" {
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("Add on a closed loop: %v", err)
				}
				if n := c.gaveBack.Load(); n != 1 {
					t.Fatalf("refused: slot given back %d times, want 1", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			readN(t, client, 5)
			held(t, c)
			switch end {
			case "client-gone":
				_ = client.Close()
			case "complete":
				if _, err := io.WriteString(owner, "0\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				expectEOF(t, client, "0\r\n\r\n")
			case "shutdown":
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if n := c.gaveBack.Load(); n != 1 {
					t.Fatalf("once Close returned: slot given back %d times, want 1", n)
				}
			}
			givenBackOnce(t, c, end)
			_ = l.Close()
			if n := c.gaveBack.Load(); n != 1 {
				t.Fatalf("after the loop closed: slot given back %d times, want 1", n)
			}
		})
	}
}
