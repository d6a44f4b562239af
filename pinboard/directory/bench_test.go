package directory

import (
	"fmt"
	"testing"
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
