//go:build linux

package frontdoor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/testutil"
)

// relayRig is an owner server and a front server that forwards every
// request to it through the front door's proxy, as forward does (without
// the placement and attestation around it).
type relayRig struct {
	f        *FrontDoor
	front    *httptest.Server
	hijacked atomic.Int32
	accepted atomic.Int32
}

func newRelayRig(t *testing.T, owner http.Handler) *relayRig {
	t.Helper()
	return newRelayRigWith(t, owner, true)
}

// newRelayRigWith is newRelayRig with the fast path on or off.
func newRelayRigWith(t *testing.T, owner http.Handler, fastPath bool) *relayRig {
	t.Helper()
	ow := httptest.NewServer(owner)
	t.Cleanup(ow.Close)
	base, _ := url.Parse(ow.URL)
	rig := &relayRig{f: New(Config{
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry(),
		FastPath:   fastPath,
	})}
	rig.front = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := &fwdInfo{rq: &instanceRequest{}, w: w, orig: r}
		out := outbound{r: r, hop: httpx.Hop{RemoteAddr: r.RemoteAddr, Host: r.Host}, scheme: "http", addr: base.Host,
			path: r.URL.EscapedPath(), got1xx: got1xx(w)}
		resp, err := rig.f.fwd.std.roundTrip(out)
		if err == nil {
			err = rig.f.fwd.writeAnswer(w, r, info, resp)
		}
		if err != nil {
			rig.f.fwd.forwardError(w, info, err)
		}
	}))
	rig.front.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			rig.accepted.Add(1)
		case http.StateHijacked:
			rig.hijacked.Add(1)
		}
	}
	rig.front.Start()
	t.Cleanup(func() {
		rig.front.Close()
		if err := rig.f.Close(); err != nil {
			t.Errorf("front door close: %v", err)
		}
	})
	return rig
}

// steppedEvents is an owner that streams server-sent events, event i+1
// only once next says the client has event i; gone closes when the
// client's leaving ends the stream.
func steppedEvents(next <-chan struct{}, gone chan<- struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			if rc.Flush() != nil {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				close(gone)
				return
			}
		}
	})
}

// readSteppedEvents reads n of steppedEvents' events, each before asking
// for the next.
func readSteppedEvents(t *testing.T, br *bufio.Reader, n int, next chan<- struct{}) {
	t.Helper()
	for i := range n {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		next <- struct{}{}
	}
}

func (rig *relayRig) ended(reason string) float64 {
	var m dto.Metric
	if err := rig.f.fwd.relayEnds.WithLabelValues(reason).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// A held SSE stream through the proxy leaves net/http for the relay loop:
// each event reaches the client while the owner waits to send the next,
// and the client going away ends the owner's request.
func TestForwardedStreamIsRelayed(t *testing.T) {
	next := make(chan struct{})
	ownerGone := make(chan struct{})
	rig := newRelayRig(t, steppedEvents(next, ownerGone))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", rig.front.URL+"/sse", nil)
	resp, err := rig.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || !resp.Close || resp.ContentLength != -1 {
		t.Fatalf("head: %d %v close=%v length=%d", resp.StatusCode, resp.Header, resp.Close, resp.ContentLength)
	}
	readSteppedEvents(t, bufio.NewReader(resp.Body), 3, next)
	if rig.hijacked.Load() != 1 || rig.f.fwd.held.Len() != 1 {
		t.Fatalf("hijacked %d, relayed %d: the stream did not leave net/http", rig.hijacked.Load(), rig.f.fwd.held.Len())
	}
	cancel()
	select {
	case <-ownerGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's request outlived its client")
	}
	testutil.WaitFor(t, 5*time.Second, "the relay counts the client gone", func() bool {
		return rig.ended("client-gone") == 1 && rig.f.fwd.held.Len() == 0
	})
}

// With the fast path off a held stream stays in net/http, events flowing
// as they come.
func TestHeldStreamStaysInNetHTTPWithoutFastPath(t *testing.T) {
	next := make(chan struct{})
	rig := newRelayRigWith(t, steppedEvents(next, make(chan struct{})), false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", rig.front.URL+"/sse", nil)
	resp, err := rig.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	readSteppedEvents(t, bufio.NewReader(resp.Body), 3, next)
	if rig.hijacked.Load() != 0 || rig.f.fwd.held.Len() != 0 {
		t.Fatalf("hijacked %d, relayed %d with the fast path off", rig.hijacked.Load(), rig.f.fwd.held.Len())
	}
}

// A long chunked body of unknown length is relayed whole and ends the
// connection; one that ends within its first read is proxied as before,
// on a connection that stays alive; so is one of known length.
func TestForwardedFiniteBodies(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 4096) // 64 KB, sent in flushed pieces
	small := strings.Repeat("s", 3000)
	rig := newRelayRig(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			for i := 0; i < len(big); i += 8 << 10 {
				io.WriteString(w, big[i:i+8<<10])
				_ = http.NewResponseController(w).Flush()
			}
		case "/small":
			// Past net/http's 2 KB before chunking, within one write.
			io.WriteString(w, small)
		case "/fixed":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "fixed")
		}
	}))
	c := rig.front.Client()
	get := func(path string) (string, bool) {
		t.Helper()
		resp, err := c.Get(rig.front.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return string(b), resp.Close
	}
	for _, path := range []string{"/small", "/fixed", "/small"} {
		want := map[string]string{"/small": small, "/fixed": "fixed"}[path]
		if body, closed := get(path); body != want || closed {
			t.Fatalf("%s: %d bytes close=%v", path, len(body), closed)
		}
	}
	if rig.accepted.Load() != 1 || rig.hijacked.Load() != 0 {
		t.Fatalf("%d connections, %d hijacked: short responses must keep the connection", rig.accepted.Load(), rig.hijacked.Load())
	}
	if body, closed := get("/big"); body != big || !closed {
		t.Fatalf("/big: %d bytes close=%v", len(body), closed)
	}
	testutil.WaitFor(t, 5*time.Second, "the relay counts /big complete", func() bool {
		return rig.ended("complete") == 1 && rig.f.fwd.held.Len() == 0
	})
}

// Closing the front door ends the streams it relays, on both sides.
func TestFrontDoorCloseEndsRelayedStreams(t *testing.T) {
	ownerGone := make(chan struct{})
	rig := newRelayRig(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: hello\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
		close(ownerGone)
	}))
	resp, err := rig.front.Client().Get(rig.front.URL + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: hello\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	if err := rig.f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(br); err == nil {
		t.Fatal("the stream ended as if complete; a cut chunked body must read as an error")
	}
	select {
	case <-ownerGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's request outlived the front door")
	}
	if rig.ended("shutdown") != 1 {
		t.Fatalf("shutdown ends: %v", rig.ended("shutdown"))
	}
}
