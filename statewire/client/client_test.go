package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statewire"
	"github.com/pinnedd/pinnedd/statewire/client"
	"github.com/pinnedd/pinnedd/statewire/wire"
)

// newServer is a real Statewire server on an in-memory instance: a "say"
// command that needs a text, a document with a list of messages.
func newServer(t *testing.T) (*statewire.Server, *sdk.Instance) {
	t.Helper()
	inst := sdk.NewMemoryInstance("/threads", "t1")
	t.Cleanup(inst.Stop)
	s, err := statewire.New(inst, statewire.Config{
		Initial: map[string]any{"msgs": []any{}},
		Commands: map[string]statewire.CommandSpec{"say": {Validate: func(f json.RawMessage) error {
			var v struct{ Text string }
			if err := json.Unmarshal(f, &v); err != nil || v.Text == "" {
				return errors.New("say needs a text")
			}
			return nil
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, inst
}

// front is what the client talks to over real HTTP: it hands each request
// to the current handler, after answering 503 + Retry-After (or the error
// status failNext set, with no Retry-After) to as many requests for a
// route as the test asked, and counts requests per route.
type front struct {
	mu     sync.Mutex
	h      http.Handler
	refuse map[string]int
	status int // what a refusal answers; 0: 503 + Retry-After: 1
	hits   map[string]int
	srv    *httptest.Server
}

func newFront(t *testing.T, h http.Handler) *front {
	t.Helper()
	f := &front{h: h, refuse: map[string]int{}, hits: map[string]int{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hits[r.URL.Path]++
	refuse := f.refuse[r.URL.Path] > 0
	if refuse {
		f.refuse[r.URL.Path]--
	}
	h, status := f.h, f.status
	f.mu.Unlock()
	if refuse {
		if status == 0 {
			status = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, `{"error":"instance not ready"}`)
		return
	}
	h.ServeHTTP(w, r)
}

func (f *front) set(h http.Handler) { f.mu.Lock(); f.h = h; f.mu.Unlock() }

func (f *front) refuseNext(path string, n int) { f.mu.Lock(); f.refuse[path] = n; f.mu.Unlock() }

func (f *front) failNext(path string, n, status int) {
	f.mu.Lock()
	f.refuse[path], f.status = n, status
	f.mu.Unlock()
}

func (f *front) count(path string) int { f.mu.Lock(); defer f.mu.Unlock(); return f.hits[path] }

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serverState is the server's document as GET /state gives it.
func serverState(t *testing.T, s *statewire.Server) (any, uint64) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/state", nil))
	var f wire.Frame
	if err := json.Unmarshal(rec.Body.Bytes(), &f); err != nil {
		t.Fatalf("state %s: %v", rec.Body, err)
	}
	var st any
	if err := json.Unmarshal(f.State, &st); err != nil {
		t.Fatal(err)
	}
	return st, f.Version
}

// A session mirrors the server's document through a snapshot and every
// ops frame after it, whatever the ops (set, append, delete), in order.
func TestSessionMirrorsTheDocument(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	ctx := waitCtx(t)
	if err := sess.Wait(ctx, func(s *client.Session) bool { return s.Stats().Attached }); err != nil {
		t.Fatal(err)
	}
	doc := s.Doc()
	for i := range 3 {
		err := doc.Update(func(tx *statewire.Tx) error {
			if err := tx.Set(statewire.Path{"msgs", i}, map[string]any{"text": ""}); err != nil {
				return err
			}
			return tx.Set(statewire.Path{"count"}, i+1)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"echo", ": ", fmt.Sprint(i)} {
			if err := doc.AppendText(statewire.Path{"msgs", i, "text"}, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := doc.Delete(statewire.Path{"msgs", 1}); err != nil {
		t.Fatal(err)
	}
	want, version := serverState(t, s)
	if err := sess.Wait(ctx, func(s *client.Session) bool { _, v := s.State(); return v == version }); err != nil {
		t.Fatalf("session never reached version %d: %v", version, err)
	}
	got, _ := sess.State()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("session holds %v, server %v", got, want)
	}
	st := sess.Stats()
	if st.Snapshots != 1 || len(st.Ops) != int(version) || len(st.Fins) != 0 {
		t.Fatalf("stats %+v, want one snapshot and %d ops frames", st, version)
	}
	for i, f := range st.Ops {
		if f.Version != uint64(i+1) {
			t.Fatalf("ops frame %d has version %d", i, f.Version)
		}
	}
	var typed struct {
		Count int
		Msgs  []struct{ Text string }
	}
	if err := sess.Decode(&typed); err != nil || typed.Count != 3 || len(typed.Msgs) != 2 || typed.Msgs[1].Text != "echo: 2" {
		t.Fatalf("decoded %+v (%v)", typed, err)
	}
}

// Send numbers commands and returns once the server acked them; a resend
// of an acked seq is a duplicate.
func TestSendIsAcked(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	c := client.New(fr.srv.URL)
	for want := int64(1); want <= 2; want++ {
		seq, err := c.Send(waitCtx(t), "say", map[string]any{"text": "hi"})
		if err != nil || seq != want {
			t.Fatalf("send: seq %d (%v), want %d", seq, err, want)
		}
	}
	resp, err := c.PostFrames(waitCtx(t), []byte(`{"clientId":"`+c.ID()+`","frames":[{"seq":2,"type":"say","text":"hi"}]}`))
	if err != nil || resp.Acked != 2 || resp.Duplicates != 1 || resp.Admitted != 0 {
		t.Fatalf("resend of seq 2: %+v %v", resp, err)
	}
}

// A 4xx is the client's to fix: Send returns it at once as ErrRejected,
// with the server's message, and does not resend.
func TestSendRejectedIsNotResent(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	c := client.New(fr.srv.URL)
	_, err := c.Send(waitCtx(t), "say", map[string]any{})
	var he *client.HTTPError
	if !errors.Is(err, client.ErrRejected) || !errors.As(err, &he) || he.Code != http.StatusBadRequest || !strings.Contains(he.Message, "say needs a text") {
		t.Fatalf("invalid frame: %v", err)
	}
	if n := fr.count("/frames"); n != 1 {
		t.Fatalf("%d POST /frames for a rejected frame, want 1", n)
	}
	// The rejected frame was not admitted: the next one takes its seq, or
	// the server would refuse it as a gap.
	if seq, err := c.Send(waitCtx(t), "say", map[string]any{"text": "hi"}); err != nil || seq != 1 {
		t.Fatalf("send after a rejection: seq %d, %v; want seq 1 acked", seq, err)
	}
}

// Sends from many goroutines of one client all get acked: they go out one
// at a time in seq order, never as a gap the server refuses.
func TestConcurrentSendsAreAcked(t *testing.T) {
	s, _ := newServer(t)
	c := client.New(newFront(t, s).srv.URL)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Send(waitCtx(t), "say", map[string]any{"text": "hi"}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent send: %v", err)
	}
}

// A stream that goes silent (no frame, not even a keepalive) for
// SilenceLimit is taken for dead: the session reconnects.
func TestSessionReconnectsAfterSilence(t *testing.T) {
	defer func(d time.Duration) { client.SilenceLimit = d }(client.SilenceLimit)
	client.SilenceLimit = 300 * time.Millisecond
	var mu sync.Mutex
	n := 0
	fr := newFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		fmt.Fprintf(w, `{"type":"snapshot","epoch":"e%d","version":0,"state":{}}`+"\n", i)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // then silence
	}))
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	if err := sess.Wait(waitCtx(t), func(s *client.Session) bool { return s.Stats().Snapshots >= 2 }); err != nil {
		t.Fatalf("no reconnect after a silent stream: %v", err)
	}
}

// A 503 with Retry-After is waited out as the server asked, then the same
// frame (same seq) is resent and acked.
func TestSendHonoursRetryAfter(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	fr.refuseNext("/frames", 2)
	c := client.New(fr.srv.URL)
	start := time.Now()
	seq, err := c.Send(waitCtx(t), "say", map[string]any{"text": "hi"})
	if err != nil || seq != 1 {
		t.Fatalf("send: %d %v", seq, err)
	}
	if n := fr.count("/frames"); n != 3 {
		t.Fatalf("%d POST /frames, want 3 (two refused)", n)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("acked after %v: two Retry-After: 1 not waited out", d)
	}
}

// An instance that stops ends its streams with fin "evicted", reconnect:
// the session reconnects by itself, to the instance's next activation,
// and mirrors it from its snapshot on.
func TestSessionReconnectsAfterEviction(t *testing.T) {
	first, inst := newServer(t)
	fr := newFront(t, first)
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	ctx := waitCtx(t)
	if err := sess.Wait(ctx, func(s *client.Session) bool { return s.Stats().Attached }); err != nil {
		t.Fatal(err)
	}
	epoch := sess.Stats().Epoch

	second, _ := newServer(t)
	if err := second.Doc().Set(statewire.Path{"where"}, "second"); err != nil {
		t.Fatal(err)
	}
	fr.set(second)
	inst.Stop()
	if err := sess.Wait(ctx, func(s *client.Session) bool { st := s.Stats(); return st.Attached && st.Snapshots == 2 }); err != nil {
		t.Fatalf("no reconnect after the eviction: %v (%+v)", err, sess.Stats())
	}
	st := sess.Stats()
	if len(st.Fins) != 1 || st.Fins[0].Code != wire.FinEvicted || st.Epoch == epoch {
		t.Fatalf("after the move: %+v (first epoch %s)", st, epoch)
	}
	var d struct{ Where string }
	if err := sess.Decode(&d); err != nil || d.Where != "second" {
		t.Fatalf("document after the reconnect: %+v %v", d, err)
	}
}

// A stream refused with 503 + Retry-After is retried after the wait the
// server named.
func TestSessionHonoursRetryAfter(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	fr.refuseNext("/stream", 1)
	start := time.Now()
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	if err := sess.Wait(waitCtx(t), func(s *client.Session) bool { return s.Stats().Attached }); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("attached after %v: Retry-After: 1 not waited out", d)
	}
	if n := fr.count("/stream"); n != 2 {
		t.Fatalf("%d stream requests, want 2", n)
	}
}

// stream is a hand-written Statewire stream for what a real server never
// sends: each connection gets the next list of lines, then the response
// ends (or, past the list, waits for the client to leave).
func stream(conns ...[]string) http.Handler {
	var mu sync.Mutex
	n := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		// Read the body as the real server does: only then does net/http
		// notice the client leaving, and end r.Context().
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		if i >= len(conns) {
			<-r.Context().Done()
			return
		}
		for _, l := range conns[i] {
			fmt.Fprintln(w, l)
		}
	})
}

// A fin without reconnect ends the session: Wait reports it, nothing
// reconnects.
func TestSessionEndsOnFinWithoutReconnect(t *testing.T) {
	fr := newFront(t, stream([]string{
		`{"type":"snapshot","epoch":"e","version":1,"state":{"a":1}}`,
		`{"type":"fin","code":"closed","reconnect":false}`,
	}))
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	err := sess.Wait(waitCtx(t), func(s *client.Session) bool { return false })
	if err == nil || !strings.Contains(err.Error(), "fin closed without reconnect") {
		t.Fatalf("wait: %v", err)
	}
	if n := fr.count("/stream"); n != 1 {
		t.Fatalf("%d stream requests after a final fin, want 1", n)
	}
}

// An ops frame that does not follow the copy's version (a gap) is never
// applied: the session drops the stream and starts over from a new
// snapshot, so its copy is never torn. A stream that does not begin with
// a snapshot is dropped the same way.
func TestSessionRefusesAVersionGap(t *testing.T) {
	fr := newFront(t, stream(
		[]string{
			`{"type":"snapshot","epoch":"e","version":1,"state":{"n":1}}`,
			`{"type":"ops","version":3,"ops":[{"op":"set","path":["n"],"value":3}]}`,
		},
		[]string{`{"type":"ops","version":2,"ops":[{"op":"set","path":["n"],"value":2}]}`},
		[]string{
			`{"type":"snapshot","epoch":"e","version":5,"state":{"n":5}}`,
			`{"type":"keepalive"}`,
			`{"type":"ops","version":6,"ops":[{"op":"set","path":["n"],"value":6}]}`,
			`{"type":"fin","code":"lagging","reconnect":true}`,
		},
	))
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	if err := sess.Wait(waitCtx(t), func(s *client.Session) bool { _, v := s.State(); return v == 6 }); err != nil {
		t.Fatalf("never reached version 6: %v (%+v)", err, sess.Stats())
	}
	st, _ := sess.State()
	if !reflect.DeepEqual(st, map[string]any{"n": float64(6)}) {
		t.Fatalf("state %v", st)
	}
	stats := sess.Stats()
	if stats.Snapshots != 2 || len(stats.Ops) != 1 || stats.Ops[0].Version != 6 {
		t.Fatalf("stats %+v: the gap's ops were applied", stats)
	}
}

// A 5xx is the server's trouble, not the frame's: Send resends it, waiting
// longer each time when the server names no wait (100 ms, 200 ms, 400 ms,
// each at least half of that), until it is acked.
func TestSendBacksOffOnServerErrors(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable} {
		s, _ := newServer(t)
		fr := newFront(t, s)
		fr.failNext("/frames", 3, status)
		start := time.Now()
		seq, err := client.New(fr.srv.URL).Send(waitCtx(t), "say", map[string]any{"text": "hi"})
		if err != nil || seq != 1 {
			t.Fatalf("%d three times: %d %v", status, seq, err)
		}
		if n := fr.count("/frames"); n != 4 {
			t.Fatalf("%d three times: %d POST /frames, want 4", status, n)
		}
		if d := time.Since(start); d < 350*time.Millisecond {
			t.Fatalf("%d three times: acked after %v, want the backoff to grow (at least 50+100+200 ms)", status, d)
		}
	}
}

// A stream refused with no Retry-After is retried with a growing backoff
// (100 ms, 200 ms, 400 ms, each at least half of that), then attaches.
func TestSessionBacksOffOnServerErrors(t *testing.T) {
	s, _ := newServer(t)
	fr := newFront(t, s)
	fr.failNext("/stream", 3, http.StatusBadGateway)
	start := time.Now()
	sess := client.New(fr.srv.URL).Attach(t.Context())
	defer sess.Close()
	if err := sess.Wait(waitCtx(t), func(s *client.Session) bool { return s.Stats().Attached }); err != nil {
		t.Fatal(err)
	}
	if n := fr.count("/stream"); n != 4 {
		t.Fatalf("%d stream requests, want 4", n)
	}
	if d := time.Since(start); d < 350*time.Millisecond {
		t.Fatalf("attached after %v, want the backoff to grow (at least 50+100+200 ms)", d)
	}
}
