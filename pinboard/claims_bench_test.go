package pinboard

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/raftstore"
)

// benchNode is one in-process member of a real 3-node cluster: raft on
// disk, TCP transport, HTTP forwarding to the leader.
type benchNode struct {
	store *raftstore.Store
	dir   *Directory
	// noHandOffRoute makes the node answer its hand-off route 404, as a
	// node running a release without it would.
	noHandOffRoute atomic.Bool
	// silent makes the hand-off route swallow batches and never answer, as
	// a leader cut off by a partition does; each one swallowed is sent on
	// swallowed (if there is room).
	silent    atomic.Bool
	swallowed chan struct{}
}

func startBenchCluster(b testing.TB, n int) []*benchNode {
	b.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodes := make([]*benchNode, n)
	for i := range n {
		var h atomic.Pointer[http.Handler]
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hp := h.Load(); hp != nil {
				(*hp).ServeHTTP(w, r)
				return
			}
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}))
		b.Cleanup(srv.Close)
		m := directory.New()
		store, err := raftstore.Open(ctx, raftstore.Config{
			NodeID: fmt.Sprintf("n%d", i), RaftAddr: "127.0.0.1:0", APIAddr: srv.URL, DataDir: b.TempDir(),
			// Raft's default (LAN) timeouts: with three nodes sharing two
			// saturated cores, shorter ones cost elections mid-run.
			Bootstrap: i == 0, Logger: quiet, Token: "t",
		}, m)
		if err != nil {
			b.Fatal(err)
		}
		dir := NewDirectory(m, store)
		dir.SetHandOff(store.HTTPClient(), "t")
		mux := http.NewServeMux()
		mux.Handle(raftstore.HandlerPrefix, store.Handler(nil))
		nodes[i] = &benchNode{store: store, dir: dir, swallowed: make(chan struct{}, 16)}
		nd := nodes[i]
		mux.HandleFunc("POST "+HandOffPath, func(w http.ResponseWriter, r *http.Request) {
			if nd.noHandOffRoute.Load() {
				http.NotFound(w, r)
				return
			}
			if nd.silent.Load() {
				select {
				case nd.swallowed <- struct{}{}:
				default:
				}
				// Read the batch first: the server notices a closed
				// connection only once the body has been read.
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done() // the sender gave up
				return
			}
			dir.ServeHandOff(w, r)
		})
		var handler http.Handler = mux
		h.Store(&handler)
		b.Cleanup(func() {
			nodes[i].dir.Close()
			_ = store.Close(context.Background())
		})
		if i == 0 {
			if err := store.WaitForLeader(ctx); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err := nodes[0].store.Join(ctx, store.NodeID(), store.RaftAddr(), srv.URL); err != nil {
			b.Fatal(err)
		}
	}
	for _, nd := range nodes {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := nd.store.WaitForLeader(wctx); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
	res, err := nodes[0].dir.Do(ctx, directory.Register{
		ClientID: "w1", SessionID: "s1", NodeID: "n0", AdvertiseURL: "http://w1", Namespaces: []string{"/b"},
		Headroom: 1 << 30, TTLMs: time.Hour.Milliseconds(), Now: time.Now().UnixMilli(),
	})
	if err != nil || res.Code != directory.CodeOK {
		b.Fatalf("register: %v %v", res.Code, err)
	}
	return nodes
}

var benchKey atomic.Int64

// BenchmarkClaims3Nodes: new placements per second on a 3-node cluster on
// this machine, every claim replicated and fsync'd. Claims enter through all
// three nodes in turn (two of three are forwarded to the leader).
// "unbatched" applies one claim per log entry; "batched" goes through the
// directory's group commit. Reports claims/s and p50/p99 latency.
func BenchmarkClaims3Nodes(b *testing.B) {
	nodes := startBenchCluster(b, 3)
	for _, mode := range []string{"unbatched", "batched"} {
		for _, writers := range []int{1, 64, 512, 2048} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode, writers), func(b *testing.B) {
				runClaims(b, nodes, writers, mode == "batched")
			})
		}
	}
}

func runClaims(b *testing.B, nodes []*benchNode, writers int, batched bool) {
	var next atomic.Int64
	lat := make([][]time.Duration, writers)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := nodes[w%len(nodes)]
			for next.Add(1) <= int64(b.N) {
				cmd := directory.Claim{
					Key:      directory.Key{Namespace: "/b", ID: fmt.Sprintf("k%d", benchKey.Add(1))},
					ClientID: "w1", Now: time.Now().UnixMilli(),
				}
				t0 := time.Now()
				var res directory.Result
				var err error
				if batched {
					res, err = nd.dir.Do(context.Background(), cmd)
				} else {
					res, err = nd.dir.DoNow(context.Background(), cmd)
				}
				if err != nil || res.Code != directory.CodeGranted {
					failed.Store(fmt.Sprintf("claim: %v %v %s", err, res.Code, res.Reason))
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1e3 }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "claims/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
