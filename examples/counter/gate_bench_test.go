package counter_test

// BenchmarkGate: the counter's warm reads and increments through the
// plugin runtime's HTTP data path, on Postgres over real gRPC, 8
// concurrent clients on one instance, in three modes (the same handlers
// otherwise):
//
//	gate:         as the counter is, behind the output gate
//	unconfirmed:  the gate opened by sdk.AllowUnconfirmed on every request
//	              (reads and increments answer before the write is stored)
//	durable-wait: the counter before the gate: the answer waits for
//	              Instance.Durable, then leaves through AllowUnconfirmed
//
//	go test -run XXX -bench Gate -benchtime 3s ./examples/counter/
//
// The figures of a run are in the commit that last changed this file.

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/examples/counter"
	"github.com/pinnedd/pinnedd/internal/storegrpc"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/plugins/sdk"
	"github.com/pinnedd/pinnedd/statestore/pgstore"
	"github.com/pinnedd/pinnedd/statestore/pgstore/pgtest"
)

func BenchmarkGate(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := pgstore.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() }) // before pgtest's drop
	if err := store.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	client := storegrpc.Client(b, store)
	for _, op := range []struct{ name, method, path string }{
		{"read", "GET", "/value"},
		{"increment", "POST", "/increment"},
	} {
		for _, mode := range []string{"gate", "unconfirmed", "durable-wait"} {
			b.Run(op.name+"/"+mode, func(b *testing.B) {
				url := benchCounter(b, client, mode)
				hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				do := func() {
					req, _ := http.NewRequest(op.method, url+op.path, nil)
					req.Header.Set(plugins.HeaderNamespace, counter.Namespace)
					req.Header.Set(plugins.HeaderID, "bench")
					resp, err := hc.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("%s %s: %d", op.method, op.path, resp.StatusCode)
					}
				}
				for range 50 { // warm: activated, connections open
					do()
				}
				var mu sync.Mutex
				var lat []time.Duration
				b.SetParallelism(4) // 8 clients on 2 cores
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					var mine []time.Duration
					for pb.Next() {
						t0 := time.Now()
						do()
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				})
				elapsed := time.Since(start)
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			})
		}
	}
}

// benchCounter serves a counter runtime over loopback HTTP (the data
// socket's protocol) with /counters/bench active, its requests handled as
// mode says.
func benchCounter(b *testing.B, client proto.StoreClient, mode string) string {
	b.Helper()
	h := counter.Host()
	build := h.New
	switch mode {
	case "unconfirmed":
		h.New = func(inst *sdk.Instance) (http.Handler, error) {
			next, err := build(inst)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sdk.AllowUnconfirmed(r)
				next.ServeHTTP(w, r)
			}), err
		}
	case "durable-wait":
		h.New = func(inst *sdk.Instance) (http.Handler, error) {
			next, err := build(inst)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rec := httptest.NewRecorder()
				next.ServeHTTP(rec, r)
				if err := inst.Durable(r.Context()); err != nil {
					http.Error(w, err.Error(), http.StatusGatewayTimeout)
					return
				}
				sdk.AllowUnconfirmed(r)
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
			}), err
		}
	}
	rt, err := sdk.NewRuntime(map[string]sdk.Host{counter.Namespace: h}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	rt.UseStore(client)
	b.Cleanup(rt.Close)
	if _, err := rt.Activate(context.Background(), &proto.ActivateRequest{Namespace: counter.Namespace, Id: "bench", Generation: 1}); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(rt)
	b.Cleanup(srv.Close)
	return srv.URL
}
