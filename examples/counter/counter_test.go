package counter_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/faulty"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

// An increment is answered only once the commit that stores it returned:
// the store's commit of the new value is held, and no answer may come
// until it is let go. (Without the output gate, which holds the answer
// now that the counter no longer waits for Durable itself, the answer
// races the commit and a kill -9 inside it loses an acknowledged
// increment; here the race is decided every time.)
func TestIncrementAnsweredOnlyAfterItsCommit(t *testing.T) {
	mem := memstore.New()
	store := faulty.New(mem)
	gate := faulty.NewGate()
	store.SetHook(func(ctx context.Context, _ statestore.InstanceKey, _ uint64, muts []statestore.Mutation) error {
		if faulty.Touches(muts, "counter", faulty.SetsField("value")) {
			return gate.Wait(ctx)
		}
		return nil
	})
	rt, err := sdk.NewRuntime(map[string]sdk.Host{counter.Namespace: counter.Host()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseStore(storegrpc.Client(t, store))
	t.Cleanup(rt.Close)
	if _, err := rt.Activate(t.Context(), &proto.ActivateRequest{Namespace: counter.Namespace, Id: "alice", Generation: 3}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt) // the plugin's data socket, over TCP
	t.Cleanup(srv.Close)
	t.Cleanup(gate.Open) // first: a failed test must not leave the commit held

	type answer struct {
		code int
		body string
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/increment", nil)
		req.Header.Set(plugins.HeaderNamespace, counter.Namespace)
		req.Header.Set(plugins.HeaderID, "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- answer{code: resp.StatusCode, body: string(b)}
	}()
	select {
	case <-gate.Entered():
	case a := <-answered:
		t.Fatalf("answered before the value's commit was tried: %+v", a)
	case <-time.After(10 * time.Second):
		t.Fatal("the increment's commit never reached the store")
	}
	// The commit is held: any answer in this window acknowledged a value
	// not stored. (The window bounds the wait for a wrong answer; a right
	// counter cannot fail it.)
	select {
	case a := <-answered:
		t.Fatalf("answered while the commit was held: %+v", a)
	case <-time.After(300 * time.Millisecond):
	}
	gate.Open()
	if a := <-answered; a.err != nil || a.code != http.StatusOK || a.body != "{\"value\":1}\n" {
		t.Fatalf("after the commit: %+v", a)
	}
	trays, err := mem.Load(t.Context(), statestore.InstanceKey{Namespace: counter.Namespace, ID: "alice"}, 3)
	if err != nil || len(trays) != 1 || string(trays[0].Fields["value"]) != "1" {
		t.Fatalf("stored %+v (%v), want value 1", trays, err)
	}
}
