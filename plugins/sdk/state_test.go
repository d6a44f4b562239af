package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/internal/testutil"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore"
	"github.com/pinnedd/pinnedd/statestore/memstore"
)

type recorder struct {
	mu   sync.Mutex
	runs []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, s)
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.runs...)
}

func TestTraysSurviveReactivationAndFence(t *testing.T) {
	store := memstore.New()
	client := storegrpc.Client(t, store)
	rec := &recorder{}
	var crash sync.Once
	firstDone := make(chan struct{}) // the first run got past Applied and "crashed"
	hosts := map[string]sdk.Host{
		"/things": {
			New: func(inst *sdk.Instance) (http.Handler, error) {
				return http.NotFoundHandler(), nil
			},
			Trays: map[string]sdk.TrayHandler{
				"runs": func(ctx context.Context, run *sdk.Run) error {
					rec.add(string(run.Items[0].Payload) + map[bool]string{true: " resume", false: ""}[run.Resume])
					if err := run.Applied(ctx); err != nil {
						return err
					}
					// The first delivery "crashes" after applying: the
					// batch stays and comes back with Resume set.
					crashed := false
					crash.Do(func() { crashed = true; close(firstDone) })
					if crashed {
						return errors.New("simulated crash after applied")
					}
					return nil
				},
			},
		},
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := sdk.NewRuntime(hosts, logger)
	if err != nil {
		t.Fatal(err)
	}
	rt.UseStore(client)
	ctx := context.Background()
	activate := func(gen uint64) {
		t.Helper()
		if _, err := rt.Activate(ctx, &proto.ActivateRequest{Namespace: "/things", Id: "a", Generation: gen}); err != nil {
			t.Fatal(err)
		}
	}
	deactivate := func() {
		t.Helper()
		if _, err := rt.Deactivate(ctx, &proto.DeactivateRequest{Namespace: "/things", Id: "a", Reason: proto.Reason_REASON_SHUTDOWN, GraceMs: 1000}); err != nil {
			t.Fatal(err)
		}
	}

	activate(5)
	inst := rt.Instance("/things", "a")
	if err := inst.Tray("log", "~").Set("title", "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := inst.Tray("runs", "r1").Append(ctx, "job-1"); err != nil {
		t.Fatal(err)
	}
	// Deactivating before the first run got past Applied would cancel it
	// there, and the "crash" would happen on the redelivery instead.
	select {
	case <-firstDone:
	case <-time.After(5 * time.Second):
		t.Fatal("first run: not within 5s")
	}
	deactivate()

	// Reactivated under a newer generation: the field is back and the
	// applied batch is redelivered with Resume, then settled.
	activate(6)
	inst = rt.Instance("/things", "a")
	var title string
	if ok, err := inst.Tray("log", "~").Get("title", &title); !ok || err != nil || title != "hello" {
		t.Fatalf("title after reactivation: %q %v %v", title, ok, err)
	}
	testutil.WaitFor(t, 5*time.Second, "redelivery", func() bool { return len(rec.all()) == 2 })
	if got := rec.all(); got[0] != `"job-1"` || got[1] != `"job-1" resume` {
		t.Fatalf("runs = %q", got)
	}
	testutil.WaitFor(t, 5*time.Second, "settled run deletes its tray", func() bool {
		trays, err := store.Load(ctx, statestore.InstanceKey{Namespace: "/things", ID: "a"}, 6)
		return err == nil && len(trays) == 1 && trays[0].Key.NS == "log"
	})

	// A newer activation elsewhere fences this one: its next write fails
	// and it stops.
	if err := store.Fence(ctx, statestore.InstanceKey{Namespace: "/things", ID: "a"}, 7); err != nil {
		t.Fatal(err)
	}
	if err := inst.Tray("log", "~").Set("title", "stale"); err != nil {
		t.Fatal(err)
	}
	if err := inst.Durable(ctx); !errors.Is(err, sdk.ErrFenced) {
		t.Fatalf("write after fence: %v, want ErrFenced", err)
	}
	testutil.WaitFor(t, 5*time.Second, "fenced instance stops", func() bool { return inst.Context().Err() != nil && rt.Instance("/things", "a") == nil })
	trays, _ := store.Load(ctx, statestore.InstanceKey{Namespace: "/things", ID: "a"}, 7)
	if string(trays[0].Fields["title"]) != `"hello"` {
		t.Fatalf("stale write reached the store: %s", trays[0].Fields["title"])
	}
}

// Writes the store would refuse fail up front; a burst larger than one
// Commit may carry is split, and every write lands.
func TestWriteLimitsAndLargeBursts(t *testing.T) {
	store := memstore.New()
	_, inst := activateThing(t, store, sdk.Host{}, "b", 3)
	ctx := context.Background()
	tray := inst.Tray("log", "~")
	if err := tray.Set("big", strings.Repeat("x", 2<<20)); !errors.Is(err, sdk.ErrInvalidWrite) {
		t.Fatalf("2 MiB field: %v, want ErrInvalidWrite", err)
	}
	if err := inst.Tray("", "~").Set("a", 1); !errors.Is(err, sdk.ErrInvalidWrite) {
		t.Fatalf("empty tray name: %v", err)
	}
	for i := 0; i < 3000; i++ {
		if err := tray.Set(fmt.Sprintf("f%04d", i), strings.Repeat("y", 2000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := inst.Durable(ctx); err != nil {
		t.Fatalf("durable after a burst of 3000 writes (6 MB): %v", err)
	}
	trays, err := store.Load(ctx, statestore.InstanceKey{Namespace: "/things", ID: "b"}, 3)
	if err != nil || len(trays) != 1 || len(trays[0].Fields) != 3000 {
		t.Fatalf("stored %d trays, %v", len(trays), err)
	}
	if got := inst.Trays("log"); len(got) != 1 || got[0] != (sdk.TrayKey{NS: "log", ID: "~"}) {
		t.Fatalf("Trays(log) = %v", got)
	}
}

// outage is a real store whose commits fail while down is set, as a store
// behind a dead connection does; with lostReply they are applied first, as
// a commit whose answer was lost is.
type outage struct {
	statestore.Store
	down      atomic.Bool
	lostReply atomic.Bool
}

func (o *outage) Commit(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) (statestore.CommitResult, error) {
	if !o.down.Load() {
		return o.Store.Commit(ctx, inst, gen, muts)
	}
	if o.lostReply.Load() {
		if _, err := o.Store.Commit(ctx, inst, gen, muts); err != nil {
			return statestore.CommitResult{}, err
		}
	}
	return statestore.CommitResult{}, errors.New("connection refused")
}

// A failed commit is reported to Durable at once (ErrStateUnavailable)
// instead of waiting out the outage, and resets the instance: its writes
// are dropped, the activation refuses more, and a fresh one loaded from
// the store replaces it (here without the write, which the store never
// took).
func TestFailedCommitResetsTheInstance(t *testing.T) {
	store := &outage{Store: memstore.New()}
	rt, inst := activateThing(t, store, sdk.Host{}, "a", 1)
	ctx := context.Background()
	if err := inst.Tray("t", "~").Set("v", 1); err != nil {
		t.Fatal(err)
	}
	if err := inst.Durable(ctx); err != nil {
		t.Fatal(err)
	}
	store.down.Store(true)
	if err := inst.Tray("t", "~").Set("v", 2); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := inst.Durable(wctx); !errors.Is(err, sdk.ErrStateUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Durable during an outage: %v, want ErrStateUnavailable naming the cause", err)
	}
	if err := inst.Tray("t", "~").Set("v", 3); !errors.Is(err, sdk.ErrStateUnavailable) {
		t.Fatalf("Set on an instance being reset: %v, want ErrStateUnavailable", err)
	}
	store.down.Store(false)
	var fresh *sdk.Instance
	testutil.WaitFor(t, 30*time.Second, "the instance is reset", func() bool {
		fresh = rt.Instance("/things", "a")
		return fresh != nil && fresh != inst
	})
	var v int
	if _, err := fresh.Tray("t", "~").Get("v", &v); err != nil || v != 1 {
		t.Fatalf("the reset instance holds v=%d (%v), want the stored 1", v, err)
	}
	if err := fresh.Tray("t", "~").Set("v", 4); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Durable(wctx); err != nil {
		t.Fatalf("Durable after the reset: %v", err)
	}
	trays, err := store.Load(ctx, statestore.InstanceKey{Namespace: "/things", ID: "a"}, 1)
	if err != nil || len(trays) != 1 || string(trays[0].Fields["v"]) != "4" {
		t.Fatalf("stored after the reset: %+v, %v", trays, err)
	}
}

// An Append whose commit was applied but reported failed (its answer
// lost) runs all the same: the reset loads the item and redelivers it.
func TestAppendStoredByAFailedCommitRuns(t *testing.T) {
	store := &outage{Store: memstore.New()}
	rec := &recorder{}
	_, inst := activateThing(t, store, sdk.Host{Trays: map[string]sdk.TrayHandler{"jobs": func(ctx context.Context, run *sdk.Run) error {
		for _, it := range run.Items {
			rec.add(string(it.Payload))
		}
		return nil
	}}}, "a", 1)
	ctx := context.Background()
	store.lostReply.Store(true)
	store.down.Store(true)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := inst.Tray("jobs", "j").Append(wctx, "job-1"); !errors.Is(err, sdk.ErrStateUnavailable) {
		t.Fatalf("Append during an outage: %v, want ErrStateUnavailable", err)
	}
	store.down.Store(false)
	testutil.WaitFor(t, 30*time.Second, "the item stored by the failed commit runs", func() bool {
		return slices.Equal(rec.all(), []string{`"job-1"`})
	})
}

// Tasks started while the instance stops (a flusher kicking a tray's
// handler, a host's own Go) race its wait for tasks no more: Go after the
// stop began starts nothing. Under -race this failed as "WaitGroup Add
// concurrent with Wait".
func TestGoWhileStoppingStartsNothing(t *testing.T) {
	rt, inst := activateThing(t, nil, sdk.Host{}, "a", 1)
	ctx := context.Background()
	stop := make(chan struct{})
	var started atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				inst.Go("t", func(context.Context) { started.Add(1) })
			}
		}
	}()
	if _, err := rt.Deactivate(ctx, &proto.DeactivateRequest{Namespace: "/things", Id: "a", Reason: proto.Reason_REASON_SHUTDOWN, GraceMs: 1000}); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	before := started.Load()
	ran := make(chan struct{})
	inst.Go("late", func(context.Context) { close(ran) })
	select {
	case <-ran:
		t.Fatal("a task started after the instance stopped")
	case <-time.After(100 * time.Millisecond):
	}
	if started.Load() != before {
		t.Fatal("tasks kept starting after the stop")
	}
}

// activateThing runs host as /things in a runtime on store (nil: none) and
// activates id under gen, as pinnedd does for a plugin; it returns both.
func activateThing(t *testing.T, store statestore.Store, host sdk.Host, id string, gen uint64) (*sdk.Runtime, *sdk.Instance) {
	t.Helper()
	if host.New == nil {
		host.New = func(*sdk.Instance) (http.Handler, error) { return http.NotFoundHandler(), nil }
	}
	rt, err := sdk.NewRuntime(map[string]sdk.Host{"/things": host}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if store != nil {
		rt.UseStore(storegrpc.Client(t, store))
	}
	if _, err := rt.Activate(context.Background(), &proto.ActivateRequest{Namespace: "/things", Id: id, Generation: gen}); err != nil {
		t.Fatal(err)
	}
	return rt, rt.Instance("/things", id)
}
