//go:build linux

package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/testutil"
)

// ends records how streams ended.
type ends struct {
	mu sync.Mutex
	r  []Reason
}

func (e *ends) done(r Reason) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.r = append(e.r, r)
}

func (e *ends) snapshot() []Reason {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Reason(nil), e.r...)
}

// tcpPair is a connected loopback TCP pair: a (accepted) and b (dialed).
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	b, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.c, b
}

// relayed is one stream through the loop: the test plays the client
// (reading from client) and the owner (writing to owner).
type relayed struct {
	client net.Conn // the end a real client would hold
	owner  net.Conn // the end the owner's server would hold
}

func openStream(t *testing.T, l *Loop, head, body string, chunked bool, e *ends) relayed {
	t.Helper()
	front, client := tcpPair(t) // front: the accepted connection net/http would hijack
	owner, up := tcpPair(t)     // up: the proxy's connection to the owner
	t.Cleanup(func() { client.Close(); owner.Close() })
	if err := l.Add(Stream{Client: front, Upstream: up, Head: []byte(head), Body: []byte(body), Chunked: chunked, Done: e.done}); err != nil {
		t.Fatalf("Add: %v", err)
	}
	return relayed{client: client, owner: owner}
}

func newLoop(t *testing.T) *Loop {
	t.Helper()
	l := New(nil)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// readN reads exactly n bytes within a deadline.
func readN(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %d bytes: %v (got %q)", n, err, buf)
	}
	return string(buf)
}

// expectEOF waits for c's peer to close: every byte before it must be in want.
func expectEOF(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("waiting for EOF: %v (read %q)", err, b)
	}
	if string(b) != want {
		t.Fatalf("read %q before EOF, want %q", b, want)
	}
}

// Each chunk reaches the client while the stream stays open; the last
// chunk ends it, closing both connections.
func TestRelayFlushesChunksAndEndsAtTheLastOne(t *testing.T) {
	l := newLoop(t)
	var e ends
	s := openStream(t, l, "HEAD\r\n\r\n", "7\r\ndata: 0\r\n", true, &e)
	if got := readN(t, s.client, len("HEAD\r\n\r\n7\r\ndata: 0\r\n")); got != "HEAD\r\n\r\n7\r\ndata: 0\r\n" {
		t.Fatalf("first bytes %q", got)
	}
	for i := 1; i <= 3; i++ {
		chunk := fmt.Sprintf("7\r\ndata: %d\r\n", i)
		if _, err := io.WriteString(s.owner, chunk); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, s.client, len(chunk)); got != chunk {
			t.Fatalf("chunk %d = %q", i, got)
		}
	}
	if l.Len() != 1 {
		t.Fatalf("Len = %d", l.Len())
	}
	// The last chunk, then bytes the relay must not pass on.
	if _, err := io.WriteString(s.owner, "0\r\n\r\nHTTP/1.1 200 OK\r\n"); err != nil {
		t.Fatal(err)
	}
	expectEOF(t, s.client, "0\r\n\r\n")
	expectEOF(t, s.owner, "")
	testutil.WaitFor(t, 5*time.Second, "Done(Complete)", func() bool { r := e.snapshot(); return len(r) == 1 && r[0] == Complete })
	if l.Len() != 0 {
		t.Fatalf("Len = %d after the end", l.Len())
	}
}

// A body already complete in what came with the head goes out and ends.
func TestRelayBodyCompleteAtAdd(t *testing.T) {
	l := newLoop(t)
	var e ends
	s := openStream(t, l, "H\r\n\r\n", "2\r\nhi\r\n0\r\n\r\n", true, &e)
	expectEOF(t, s.client, "H\r\n\r\n2\r\nhi\r\n0\r\n\r\n")
	testutil.WaitFor(t, 5*time.Second, "Done(Complete)", func() bool { r := e.snapshot(); return len(r) == 1 && r[0] == Complete })
}

// The client hanging up closes the upstream connection, so the owner
// sees its client gone.
func TestRelayClientDisconnectClosesUpstream(t *testing.T) {
	l := newLoop(t)
	var e ends
	s := openStream(t, l, "H\r\n\r\n", "", true, &e)
	readN(t, s.client, 5)
	s.client.Close()
	expectEOF(t, s.owner, "")
	testutil.WaitFor(t, 5*time.Second, "Done(ClientGone)", func() bool { r := e.snapshot(); return len(r) == 1 && r[0] == ClientGone })
}

// A close-delimited body ends with the upstream's EOF, every byte passed
// on; a chunked body cut short fails, and the client sees it closed too.
func TestRelayUpstreamEOFClosesClient(t *testing.T) {
	l := newLoop(t)
	var e ends
	plain := openStream(t, l, "H\r\n\r\n", "abc", false, &e)
	if _, err := io.WriteString(plain.owner, "def"); err != nil {
		t.Fatal(err)
	}
	plain.owner.Close()
	expectEOF(t, plain.client, "H\r\n\r\nabcdef")
	testutil.WaitFor(t, 5*time.Second, "Done(Complete)", func() bool { r := e.snapshot(); return len(r) == 1 && r[0] == Complete })

	var e2 ends
	cut := openStream(t, l, "H\r\n\r\n", "10\r\nshort", true, &e2)
	cut.owner.Close()
	expectEOF(t, cut.client, "H\r\n\r\n10\r\nshort")
	testutil.WaitFor(t, 5*time.Second, "Done(UpstreamFailed)", func() bool { r := e2.snapshot(); return len(r) == 1 && r[0] == UpstreamFailed })
}

// A client that does not read stops the relay reading from the upstream:
// the loop keeps at most one read's worth for it, the owner's writes
// block (TCP's flow control reaches it), and once the client reads, every
// byte arrives in order.
func TestRelayBackpressureSlowClient(t *testing.T) {
	l := newLoop(t)
	var e ends
	s := openStream(t, l, "", "", false, &e)
	chunk := make([]byte, 64<<10)
	var sent bytes.Buffer
	for i := 0; ; i++ {
		for j := range chunk {
			chunk[j] = byte(i + j/7)
		}
		_ = s.owner.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := s.owner.Write(chunk)
		sent.Write(chunk[:n])
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			break // the whole path is full: backpressure reached the owner
		}
		if sent.Len() > 256<<20 {
			t.Fatalf("the owner wrote %d bytes to a client that reads nothing", sent.Len())
		}
	}
	l.mu.Lock()
	var pending int
	for _, st := range l.streams {
		pending = len(st.pending)
	}
	l.mu.Unlock()
	if pending > readBuf {
		t.Fatalf("the loop holds %d bytes for a slow client, want at most %d", pending, readBuf)
	}
	t.Logf("%d bytes in flight when the owner blocked; %d held by the loop", sent.Len(), pending)

	want := sent.Bytes()
	done := make(chan error, 1)
	go func() {
		_ = s.client.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(want))
		_, err := io.ReadFull(s.client, got)
		if err == nil && !bytes.Equal(got, want) {
			err = errors.New("bytes differ")
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("reading what the owner sent: %v", err)
	}
	s.owner.Close()
	expectEOF(t, s.client, "")
	testutil.WaitFor(t, 5*time.Second, "Done(Complete)", func() bool { r := e.snapshot(); return len(r) == 1 && r[0] == Complete })
}

// Many streams share the one loop: each gets its own events, and they end
// independently.
func TestRelayManyStreams(t *testing.T) {
	l := newLoop(t)
	var e ends
	const n = 200
	streams := make([]relayed, n)
	for i := range streams {
		streams[i] = openStream(t, l, "", "", false, &e)
	}
	if l.Len() != n {
		t.Fatalf("Len = %d, want %d", l.Len(), n)
	}
	for round := range 3 {
		for i, s := range streams {
			if _, err := fmt.Fprintf(s.owner, "%04d-%d;", i, round); err != nil {
				t.Fatal(err)
			}
		}
		for i, s := range streams {
			want := fmt.Sprintf("%04d-%d;", i, round)
			if got := readN(t, s.client, len(want)); got != want {
				t.Fatalf("stream %d round %d: %q", i, round, got)
			}
		}
	}
	for i, s := range streams {
		if i%2 == 0 {
			s.client.Close()
		} else {
			s.owner.Close()
		}
	}
	for i, s := range streams {
		if i%2 == 0 {
			expectEOF(t, s.owner, "")
		} else {
			expectEOF(t, s.client, "")
		}
	}
	testutil.WaitFor(t, 5*time.Second, "every stream ended", func() bool { return len(e.snapshot()) == n && l.Len() == 0 })
}

// Close ends every stream (both peers see EOF), and leaves no goroutine
// or descriptor behind; a closed loop takes nothing.
func TestRelayShutdownLeaksNothing(t *testing.T) {
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	l := New(nil)
	var e ends
	var streams []relayed
	for range 20 {
		streams = append(streams, openStream(t, l, "H\r\n\r\n", "", true, &e))
	}
	for _, s := range streams {
		readN(t, s.client, 5)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r := e.snapshot(); len(r) != len(streams) || r[0] != Shutdown {
		t.Fatalf("ends after Close: %v", r)
	}
	for _, s := range streams {
		expectEOF(t, s.client, "")
		expectEOF(t, s.owner, "")
		s.client.Close()
		s.owner.Close()
	}
	front, client := tcpPair(t)
	owner, up := tcpPair(t)
	if err := l.Add(Stream{Client: front, Upstream: up}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v", err)
	}
	// What Add refused, it closed.
	expectEOF(t, client, "")
	expectEOF(t, owner, "")
	client.Close()
	owner.Close()
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "goroutines and descriptors back to where they were", func() bool {
		return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds
	})
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A loop nobody used holds nothing and closes at once.
func TestRelayUnusedLoop(t *testing.T) {
	l := New(nil)
	if err := l.Close(); err != nil || l.started {
		t.Fatalf("Close of an unused loop: %v (started %v)", err, l.started)
	}
}
