package pinboard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinnedd/pinnedd/pinboard/directory"
)

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

// BenchmarkClaimsTLS is BenchmarkClaims3Nodes at 64 and 512 writers on two
// clusters side by side, one with Raft over mutual TLS (as every node
// outside --insecure-cluster runs) and one without, alternating: what TLS
// costs a claim.
func BenchmarkClaimsTLS(b *testing.B) {
	clusters := map[string][]*benchNode{
		"tls":      startBenchClusterTLS(b, 3, true),
		"insecure": startBenchClusterTLS(b, 3, false),
	}
	for _, mode := range []string{"unbatched", "batched"} {
		for _, writers := range []int{64, 512} {
			for _, transport := range []string{"insecure", "tls"} {
				b.Run(fmt.Sprintf("%s/writers=%d/%s", mode, writers, transport), func(b *testing.B) {
					runClaims(b, clusters[transport], writers, mode == "batched")
				})
			}
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
