package counter_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/faulty"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// gated is a counter plugin runtime on a faulty store, served over HTTP
// as pinnedd's data socket is.
type gated struct {
	mem   *memstore.Store
	store *faulty.Store
	url   string
}

func newGated(t *testing.T) *gated {
	t.Helper()
	g := &gated{mem: memstore.New()}
	g.store = faulty.New(g.mem)
	rt, err := sdk.NewRuntime(map[string]sdk.Host{counter.Namespace: counter.Host()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseStore(storegrpc.Client(t, g.store))
	t.Cleanup(rt.Close)
	if _, err := rt.Activate(t.Context(), &proto.ActivateRequest{Namespace: counter.Namespace, Id: "alice", Generation: 3}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt)
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

type answer struct {
	code  int
	value int64
	body  string
	err   error
}

// call sends method path to alice and returns the answer on a channel.
func (g *gated) call(t *testing.T, method, path string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), method, g.url+path, nil)
		req.Header.Set(plugins.HeaderNamespace, counter.Namespace)
		req.Header.Set(plugins.HeaderID, "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		a := answer{code: resp.StatusCode, body: string(b)}
		var v struct{ Value int64 }
		if json.Unmarshal(b, &v) == nil {
			a.value = v.Value
		}
		out <- a
	}()
	return out
}

// notYet fails if ch answers within a window: a gate that leaks answers
// within it (a read of a value whose commit is held) is caught; a right
// one cannot fail it.
func notYet(t *testing.T, ch <-chan answer, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s answered while the commit was held: %+v", what, a)
	case <-time.After(300 * time.Millisecond):
	}
}

func holdValueCommits(g *gated, gate *faulty.Gate, fail error) {
	g.store.SetHook(func(ctx context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		if !faulty.Touches(muts, "counter", faulty.SetsField("value")) {
			return nil
		}
		if err := gate.Wait(ctx); err != nil {
			return err
		}
		return fail
	})
}

// A read issued while the commit of an increment is held sees the new
// value in memory, and its answer waits at the output gate until the
// commit returns: a crash in the commit must not lose a value a client saw.
func TestReadWaitsForTheCommitItSaw(t *testing.T) {
	g := newGated(t)
	gate := faulty.NewGate()
	t.Cleanup(gate.Open)
	holdValueCommits(g, gate, nil)

	inc := incrementHeld(t, g, gate)
	read := g.call(t, "GET", "/value")
	notYet(t, read, "a read")
	notYet(t, inc, "the increment")
	gate.Open()
	for what, ch := range map[string]<-chan answer{"increment": inc, "read": read} {
		if a := <-ch; a.err != nil || a.code != http.StatusOK || a.value != 1 {
			t.Fatalf("%s after the commit: %+v, want 200 value 1", what, a)
		}
	}
	// Nothing in flight: a read passes straight through.
	g.store.SetHook(func(context.Context, statestore.InstanceKey, uint64, []statestore.Mutation) error {
		return errors.New("no commit expected")
	})
	if a := <-g.call(t, "GET", "/value"); a.code != http.StatusOK || a.value != 1 {
		t.Fatalf("read with nothing in flight: %+v", a)
	}
}

// incrementHeld sends an increment and returns once its commit is held at
// gate; the answer comes on the channel.
func incrementHeld(t *testing.T, g *gated, gate *faulty.Gate) <-chan answer {
	t.Helper()
	inc := g.call(t, "POST", "/increment")
	select {
	case <-gate.Entered():
	case a := <-inc:
		t.Fatalf("increment answered before its commit: %+v", a)
	case <-time.After(10 * time.Second):
		t.Fatal("the increment's commit never reached the store")
	}
	return inc
}

// A commit that fails discards the outputs held behind it: the increment
// and the read that saw its value both get 504 (outcome unknown), and the
// instance is reset from the store, so the next read shows the stored 1,
// never the lost 2.
func TestFailedCommitDiscardsHeldReadsAndResets(t *testing.T) {
	g := newGated(t)
	if a := <-g.call(t, "POST", "/increment"); a.code != http.StatusOK || a.value != 1 {
		t.Fatalf("first increment: %+v", a)
	}
	gate := faulty.NewGate()
	t.Cleanup(gate.Open)
	holdValueCommits(g, gate, errors.New("disk on fire"))

	inc := incrementHeld(t, g, gate)
	read := g.call(t, "GET", "/value")
	notYet(t, read, "a read")
	gate.Open()
	for what, ch := range map[string]<-chan answer{"increment": inc, "read": read} {
		a := <-ch
		if a.err != nil || a.code != http.StatusGatewayTimeout || a.value != 0 {
			t.Fatalf("%s after the failed commit: %+v, want 504 without a value", what, a)
		}
		var body map[string]string
		if json.Unmarshal([]byte(a.body), &body); body["outcome"] != "unknown" {
			t.Fatalf("%s: body %q, want outcome unknown", what, a.body)
		}
	}
	g.store.SetHook(nil)
	// The reset replaces the instance; a request meanwhile waits for it
	// (or, if it came first, is told the instance is not active: 503,
	// nothing ran).
	var last answer
	testutil.WaitFor(t, 10*time.Second, "a read after the reset", func() bool {
		last = <-g.call(t, "GET", "/value")
		return last.code != http.StatusServiceUnavailable
	})
	if last.code != http.StatusOK || last.value != 1 {
		t.Fatalf("read after the reset: %+v, want the stored value 1", last)
	}
	if a := <-g.call(t, "POST", "/increment"); a.code != http.StatusOK || a.value != 2 {
		t.Fatalf("increment after the reset: %+v, want 2", a)
	}
	trays, err := g.mem.Load(t.Context(), statestore.InstanceKey{Namespace: counter.Namespace, ID: "alice"}, 3)
	if err != nil || len(trays) != 1 || string(trays[0].Fields["value"]) != "2" {
		t.Fatalf("stored %+v (%v), want value 2", trays, err)
	}
}
