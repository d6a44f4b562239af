package directory

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// benchFleet registers workers and places n ids on them, with the cold start
// quarantine already over.
func benchFleet(b *testing.B, workers, placed int) (*Machine, uint64) {
	m := New()
	idx := uint64(0)
	for i := range workers {
		idx++
		m.Apply(idx, Encode(Register{ClientID: fmt.Sprint("w", i), SessionID: "s", AdvertiseURL: fmt.Sprint("http://w", i),
			Namespaces: []string{"/threads"}, Headroom: 1 << 40, TTLMs: 1 << 50, Now: 1}))
	}
	for i := range placed {
		idx++
		m.Apply(idx, Encode(Claim{Key: Key{Namespace: "/threads", ID: fmt.Sprint("pre", i)}, ClientID: fmt.Sprint("w", i%workers), Now: 2}))
	}
	return m, idx
}

func BenchmarkLookup(b *testing.B) {
	m, _ := benchFleet(b, 3, 100_000)
	keys := make([]Key, 1024)
	for i := range keys {
		keys[i] = Key{Namespace: "/threads", ID: fmt.Sprint("pre", i*97)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := m.Placement(keys[i&1023]); !ok {
			b.Fatal("missing")
		}
	}
}

func BenchmarkLookupParallel(b *testing.B) {
	m, _ := benchFleet(b, 3, 100_000)
	k := Key{Namespace: "/threads", ID: "pre42"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Placement(k)
		}
	})
}

// claimEntries pre-encodes n single-claim entries for fresh ids.
func claimEntries(n, workers int) [][]byte {
	es := make([][]byte, n)
	for i := range es {
		es[i] = Encode(Claim{Key: Key{Namespace: "/threads", ID: fmt.Sprint("id", i)}, ClientID: fmt.Sprint("w", i%workers), Now: 3})
	}
	return es
}

func BenchmarkApplyClaim(b *testing.B) {
	m, idx := benchFleet(b, 3, 0)
	es := claimEntries(b.N, 3)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		idx++
		m.Apply(idx, es[i])
	}
}

func BenchmarkApplyBatchClaims(b *testing.B) {
	const per = 256
	m, idx := benchFleet(b, 3, 0)
	es := make([][]byte, b.N)
	for i := range es {
		cmds := make([]Command, per)
		for j := range cmds {
			cmds[j] = Claim{Key: Key{Namespace: "/threads", ID: fmt.Sprint("id", i, "-", j)}, ClientID: fmt.Sprint("w", j%3), Now: 3}
		}
		es[i] = Encode(Batch{Commands: cmds})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		idx++
		m.Apply(idx, es[i])
	}
	b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "claims/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/claim")
}

func BenchmarkSnapshot100k(b *testing.B) {
	m, _ := benchFleet(b, 3, 100_000)
	b.ReportAllocs()
	for b.Loop() {
		s, _ := m.Snapshot()
		s.WriteTo(discard{})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// churnEntries returns two entries an applier can cycle through forever:
// one grants per fresh ids to worker w3, the next ends w3's session (which
// drops them) and registers it again.
func churnEntries(per int) [][]byte {
	cmds := make([]Command, per)
	for j := range cmds {
		cmds[j] = Claim{Key: Key{Namespace: "/threads", ID: fmt.Sprint("hot", j)}, ClientID: "w3", Now: 3}
	}
	grant := Encode(Batch{Commands: cmds})
	regW3 := func(s string) Register {
		return Register{ClientID: "w3", SessionID: s, AdvertiseURL: "http://w3", Namespaces: []string{"/threads"}, Headroom: 1 << 40, TTLMs: 1 << 50, Now: 3}
	}
	return [][]byte{
		Encode(regW3("s0")),
		grant,
		Encode(Batch{Commands: []Command{Deregister{ClientID: "w3", SessionID: "s0"}, regW3("s1")}}),
		grant,
		Encode(Batch{Commands: []Command{Deregister{ClientID: "w3", SessionID: "s1"}, regW3("s0")}}),
	}
}

// BenchmarkOwnerDuringApply measures Owner while another goroutine applies
// entries of 256 claims (and session churn that drops them) back to back,
// as a follower catching up does. ns/op is the mean; the p50/p99/p999/max
// metrics are latencies of single reads (every 16th is sampled, max over
// all).
func BenchmarkOwnerDuringApply(b *testing.B) {
	m, idx := benchFleet(b, 3, 100_000)
	es := churnEntries(256)
	idx++
	m.Apply(idx, es[0])
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			idx++
			m.Apply(idx, es[1+i%4])
		}
	}()
	keys := make([]Key, 1024)
	for i := range keys {
		keys[i] = Key{Namespace: "/threads", ID: fmt.Sprint("pre", i*97)}
	}
	samples := make([]time.Duration, 0, b.N/16+1)
	var worst time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, w, ok := m.Owner(keys[i&1023]); !ok || w.ClientID == "" {
			b.Fatal("missing owner")
		}
		d := time.Since(start)
		worst = max(worst, d)
		if i%16 == 0 {
			samples = append(samples, d)
		}
	}
	b.StopTimer()
	close(stop)
	<-done
	slices.Sort(samples)
	at := func(q float64) float64 { return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) }
	b.ReportMetric(at(0.5), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(at(0.999), "p999-ns")
	b.ReportMetric(float64(worst.Nanoseconds()), "max-ns")
}
