package sdk_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/faulty"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// gateHost is /things with a field v: POST /set?v= sets it, GET /get reads
// it (GET /get-unconfirmed through the escape hatch), GET /stream flushes a
// line, sets v, and flushes two more.
func gateHost() sdk.Host {
	return sdk.Host{New: func(inst *sdk.Instance) (http.Handler, error) {
		tray := inst.Tray("t", "~")
		get := func(w http.ResponseWriter) {
			var v string
			_, _ = tray.Get("v", &v)
			fmt.Fprintf(w, "v=%s\n", v)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /set", func(w http.ResponseWriter, r *http.Request) {
			if err := tray.Set("v", r.URL.Query().Get("v")); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			get(w)
		})
		mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) { get(w) })
		mux.HandleFunc("GET /get-unconfirmed", func(w http.ResponseWriter, r *http.Request) {
			sdk.AllowUnconfirmed(r)
			get(w)
		})
		// Outputs other than body bytes: a bare status, a 1xx then a
		// status, a hijack answering itself, a 101 before a hijack.
		mux.HandleFunc("POST /set-204", func(w http.ResponseWriter, r *http.Request) {
			if tray.Set("v", "204") == nil {
				w.WriteHeader(http.StatusNoContent)
			}
		})
		mux.HandleFunc("POST /set-103", func(w http.ResponseWriter, r *http.Request) {
			if tray.Set("v", "103") == nil {
				w.WriteHeader(http.StatusEarlyHints)
				w.WriteHeader(http.StatusCreated)
			}
		})
		mux.HandleFunc("POST /set-hijack", func(w http.ResponseWriter, r *http.Request) {
			if tray.Set("v", "hijack") != nil {
				return
			}
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nhi\n")
		})
		mux.HandleFunc("POST /set-101", func(w http.ResponseWriter, r *http.Request) {
			if tray.Set("v", "101") != nil {
				return
			}
			w.Header().Set("Upgrade", "echo")
			w.Header().Set("Connection", "Upgrade")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.WriteString(c, "hello")
		})
		mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			fmt.Fprintln(w, "a")
			if rc.Flush() != nil {
				return
			}
			if tray.Set("v", "streamed") != nil {
				return
			}
			fmt.Fprintln(w, "b")
			if rc.Flush() != nil {
				return
			}
			fmt.Fprintln(w, "c")
		})
		return mux, nil
	}}
}

// serveThing serves rt's instance /things/id over HTTP as the data socket
// does, and returns a function sending a request to it.
func serveThing(t *testing.T, rt *sdk.Runtime, id string) func(method, path string) (*http.Response, error) {
	srv := httptest.NewServer(rt)
	t.Cleanup(srv.Close)
	return func(method, path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
		req.Header.Set(plugins.HeaderNamespace, "/things")
		req.Header.Set(plugins.HeaderID, id)
		return http.DefaultClient.Do(req)
	}
}

func holdCommits(store *faulty.Store) *faulty.Gate {
	g := faulty.NewGate()
	store.SetHook(func(ctx context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		return g.Wait(ctx)
	})
	return g
}

type reply struct {
	code int
	body string
	err  error
}

func async(do func(method, path string) (*http.Response, error), method, path string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		resp, err := do(method, path)
		if err != nil {
			out <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- reply{code: resp.StatusCode, body: string(b)}
	}()
	return out
}

// A stream's chunks flushed with nothing in flight leave at once; one
// flushed after a write waits until the write is stored. (Without the gate
// "b" arrived while the commit was held.)
func TestGateHoldsFlushedChunksBehindAWrite(t *testing.T) {
	store := faulty.New(memstore.New())
	rt, _ := activateThing(t, store, gateHost(), "a", 1)
	do := serveThing(t, rt, "a")
	gate := holdCommits(store)
	t.Cleanup(gate.Open)

	resp, err := do("GET", "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 3)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; l != "a" {
		t.Fatalf("first chunk %q, want a", l)
	}
	<-gate.Entered()
	select {
	case l := <-lines:
		t.Fatalf("chunk %q left while the write before it was held", l)
	case <-time.After(300 * time.Millisecond):
	}
	gate.Open()
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if strings.Join(rest, ",") != "b,c" {
		t.Fatalf("after the commit: %q, want b, c", rest)
	}
}

// AllowUnconfirmed lets a read answer while the write it saw is held, as
// its name warns; the same read without it waits.
func TestAllowUnconfirmedPassesTheGate(t *testing.T) {
	store := faulty.New(memstore.New())
	rt, _ := activateThing(t, store, gateHost(), "a", 1)
	do := serveThing(t, rt, "a")
	gate := holdCommits(store)
	t.Cleanup(gate.Open)

	set := async(do, "POST", "/set?v=1")
	<-gate.Entered()
	gated := async(do, "GET", "/get")
	select {
	case r := <-async(do, "GET", "/get-unconfirmed"):
		if r.code != http.StatusOK || r.body != "v=1\n" {
			t.Fatalf("unconfirmed read: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the unconfirmed read waited for the commit")
	}
	select {
	case r := <-gated:
		t.Fatalf("gated read answered while the commit was held: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	gate.Open()
	for _, ch := range []<-chan reply{set, gated} {
		if r := <-ch; r.code != http.StatusOK || r.body != "v=1\n" {
			t.Fatalf("after the commit: %+v", r)
		}
	}
}

// A write fenced by a newer activation discards what was held behind it:
// 503 with Retry-After (the retry reaches the new owner), not the value.
func TestFencedWriteAnswers503(t *testing.T) {
	mem := memstore.New()
	rt, _ := activateThing(t, mem, gateHost(), "a", 1)
	do := serveThing(t, rt, "a")
	if _, err := mem.Load(t.Context(), statestore.InstanceKey{Namespace: "/things", ID: "a"}, 2); err != nil {
		t.Fatal(err)
	}
	r := <-async(do, "POST", "/set?v=1")
	resp, err := do("POST", "/set?v=2") // the instance may be gone: 503 either way
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if r.code != http.StatusServiceUnavailable || strings.Contains(r.body, "v=1") || resp.StatusCode != http.StatusServiceUnavailable ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fenced write: %+v, then %d (Retry-After %q)", r, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// Every kind of output waits for the write queued before it: a status
// with no body, a status after a 1xx, a hijacked connection (the 101 an
// upgrade wrote before hijacking goes out first).
func TestGateHoldsStatusesAndHijacksBehindAWrite(t *testing.T) {
	for _, c := range []struct {
		path string
		code int
		body string
	}{
		{"/set-204", http.StatusNoContent, ""},
		{"/set-103", http.StatusCreated, ""},
		{"/set-hijack", http.StatusOK, "hi\n"},
	} {
		t.Run(c.path, func(t *testing.T) {
			store := faulty.New(memstore.New())
			rt, _ := activateThing(t, store, gateHost(), "a", 1)
			do := serveThing(t, rt, "a")
			gate := holdCommits(store)
			t.Cleanup(gate.Open)
			answer := async(do, "POST", c.path)
			<-gate.Entered()
			select {
			case r := <-answer:
				t.Fatalf("answered %d %q while its write was held", r.code, r.body)
			case <-time.After(300 * time.Millisecond):
			}
			gate.Open()
			if r := <-answer; r.err != nil || r.code != c.code || r.body != c.body {
				t.Fatalf("after the commit: %d %q %v, want %d %q", r.code, r.body, r.err, c.code, c.body)
			}
		})
	}
	t.Run("/set-101", func(t *testing.T) {
		store := faulty.New(memstore.New())
		rt, _ := activateThing(t, store, gateHost(), "a", 1)
		srv := httptest.NewServer(rt)
		t.Cleanup(srv.Close)
		gate := holdCommits(store)
		t.Cleanup(gate.Open)
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /set-101 HTTP/1.1\r\nHost: x\r\n%s: /things\r\n%s: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 0\r\n\r\n", plugins.HeaderNamespace, plugins.HeaderID)
		got := make(chan string, 1)
		go func() { b, _ := io.ReadAll(conn); got <- string(b) }()
		<-gate.Entered()
		select {
		case b := <-got:
			t.Fatalf("answered %q while its write was held", b)
		case <-time.After(300 * time.Millisecond):
		}
		gate.Open()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b := <-got; !strings.HasPrefix(b, "HTTP/1.1 101") || !strings.HasSuffix(b, "hello") {
			t.Fatalf("upgrade answered %q, want a 101 then hello", b)
		}
	})
}
