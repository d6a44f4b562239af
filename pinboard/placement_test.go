package pinboard

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"testing"
)

func equalWorkers(n int, headroom int64) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i] = Candidate{ClientID: fmt.Sprintf("worker-%d", i), Headroom: headroom}
	}
	return cands
}

func seeded(seed uint64) func() uint64 { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)).Uint64 }

// countingRand wraps a source and counts draws, so a test can tell a kept
// preference (no draw) from a fallback (draws).
type countingRand struct {
	src   func() uint64
	draws int
}

func (c *countingRand) next() uint64 { c.draws++; return c.src() }

func ptr(s string) *string { return &s }

// preferredOf is the worker a client IP prefers when headroom is equal.
func preferredOf(t *testing.T, ip string, cands []Candidate) string {
	t.Helper()
	equal := slices.Clone(cands)
	for i := range equal {
		equal[i].Headroom = 100
	}
	id, ok := PlacementPolicy{Rand: seeded(1)}.Choose(PlacementRequest{Key: "k", ClientIP: ip}, equal)
	if !ok {
		t.Fatal("no choice among candidates")
	}
	return id
}

func TestPlacementNoCandidates(t *testing.T) {
	for _, req := range []PlacementRequest{
		{Key: "k"},
		{Key: "k", ClientIP: "203.0.113.7"},
		{Key: "k", CallerID: "worker-0"},
		{Key: "k", AffinityKey: ptr("")},
		{Key: "k", AffinityKey: ptr("thread-1")},
	} {
		for _, cands := range [][]Candidate{nil, {}} {
			if id, ok := (PlacementPolicy{}).Choose(req, cands); ok || id != "" {
				t.Errorf("Choose(%+v, %v) = %q, %v; want \"\", false", req, cands, id, ok)
			}
		}
	}
}

func TestPlacementSingleCandidate(t *testing.T) {
	cands := []Candidate{{ClientID: "only", Headroom: 0}}
	for _, req := range []PlacementRequest{
		{Key: "k"},
		{Key: "k", ClientIP: "203.0.113.7"},
		{Key: "k", CallerID: "other"},
		{Key: "k", AffinityKey: ptr("")},
		{Key: "k", AffinityKey: ptr("thread-1")},
	} {
		if id, ok := (PlacementPolicy{Rand: seeded(3)}).Choose(req, cands); !ok || id != "only" {
			t.Errorf("Choose(%+v) = %q, %v; want only, true", req, id, ok)
		}
	}
}

func TestPlacementOwnWorker(t *testing.T) {
	tests := []struct {
		name     string
		caller   string
		headroom []int64 // of worker-0..3
		factor   float64
		affinity *string
		want     string // "" means: not the caller
	}{
		{name: "equal headroom", caller: "worker-2", headroom: []int64{10, 10, 10, 10}, want: "worker-2"},
		{name: "least headroom within factor", caller: "worker-1", headroom: []int64{100, 50, 80, 90}, want: "worker-1"},
		{name: "all empty", caller: "worker-3", headroom: []int64{0, 0, 0, 0}, want: "worker-3"},
		{name: "beats affinity key", caller: "worker-0", headroom: []int64{10, 10, 10, 10}, affinity: ptr("thread-9"), want: "worker-0"},
		{name: "beats p2c", caller: "worker-0", headroom: []int64{5, 10, 10, 10}, affinity: ptr(""), want: "worker-0"},
		{name: "too busy for factor 2", caller: "worker-1", headroom: []int64{1000, 0, 1000, 1000}},
		{name: "too busy for factor 1", caller: "worker-1", headroom: []int64{100, 99, 100, 100}, factor: 1},
		{name: "caller not a candidate", caller: "gone", headroom: []int64{10, 10, 10, 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]Candidate, len(tt.headroom))
			for i, h := range tt.headroom {
				cands[i] = Candidate{ClientID: fmt.Sprintf("worker-%d", i), Headroom: h}
			}
			hits := 0
			for seed := range uint64(200) {
				p := PlacementPolicy{BalanceFactor: tt.factor, Rand: seeded(seed)}
				req := PlacementRequest{Key: fmt.Sprintf("ns\x00id-%d", seed), CallerID: tt.caller, AffinityKey: tt.affinity}
				id, ok := p.Choose(req, cands)
				if !ok {
					t.Fatal("no choice")
				}
				if tt.want != "" && id != tt.want {
					t.Fatalf("seed %d: chose %s, want the caller's own %s", seed, id, tt.want)
				}
				if id == tt.caller {
					hits++
				}
			}
			// Without the preference the caller only gets its headroom share.
			if tt.want == "" && hits > 100 {
				t.Fatalf("caller chosen %d/200 times although the guard should have let go", hits)
			}
		})
	}
}

func TestPlacementClientIPStickiness(t *testing.T) {
	cands := equalWorkers(4, 1024)
	p := PlacementPolicy{Rand: seeded(7)}

	// Same IP, many ids, any candidate order: one worker.
	for _, ip := range []string{"203.0.113.7", "2001:db8::42", "10.1.2.3"} {
		first := ""
		for k := range 300 {
			order := slices.Clone(cands)
			rand.New(rand.NewPCG(uint64(k), 1)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			id, ok := p.Choose(PlacementRequest{Key: fmt.Sprintf("prod\x00chat\x00%d", k), ClientIP: ip}, order)
			if !ok {
				t.Fatal("no choice")
			}
			if first == "" {
				first = id
			} else if id != first {
				t.Fatalf("ip %s: id %d went to %s, earlier ids to %s", ip, k, id, first)
			}
		}
	}

	// Different IPs spread over the workers.
	counts := map[string]int{}
	for i := range 1000 {
		ip := fmt.Sprintf("198.51.%d.%d", i/256, i%256)
		id, _ := p.Choose(PlacementRequest{Key: "k", ClientIP: ip}, cands)
		counts[id]++
	}
	t.Logf("1000 IPs over 4 workers: %v", counts)
	for _, c := range cands {
		// expected 250, standard deviation ~14
		if n := counts[c.ClientID]; n < 190 || n > 310 {
			t.Errorf("%s got %d of 1000 client IPs, want 190..310", c.ClientID, n)
		}
	}
}

func TestPlacementRendezvousSpread(t *testing.T) {
	// Client ids as workers mint them (32 hex digits) and as tests name them;
	// client IPs sequential, as in one subnet.
	src := rand.New(rand.NewPCG(9, 9))
	hexIDs := make([]Candidate, 8)
	for i := range hexIDs {
		hexIDs[i] = Candidate{ClientID: fmt.Sprintf("%016x%016x", src.Uint64(), src.Uint64()), Headroom: 1}
	}
	for _, tt := range []struct {
		name  string
		cands []Candidate
	}{
		{"minted ids", hexIDs},
		{"sequential names", equalWorkers(8, 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			counts := map[string]int{}
			for i := range 8000 {
				ip := netip.AddrFrom4([4]byte{10, 20, byte(i >> 8), byte(i)}).String()
				counts[tt.cands[rendezvous(ip, tt.cands)].ClientID]++
			}
			for _, c := range tt.cands {
				// expected 1000, standard deviation ~30
				if n := counts[c.ClientID]; n < 880 || n > 1120 {
					t.Errorf("%s preferred by %d of 8000 IPs, want 880..1120 (%v)", c.ClientID, n, counts)
				}
			}
		})
	}
}

func TestPlacementBalanceFactor(t *testing.T) {
	tests := []struct {
		name      string
		factor    float64
		preferred int64 // headroom of the preferred worker
		others    int64 // headroom of every other worker
		kept      bool
	}{
		{name: "default factor, equal", preferred: 100, others: 100, kept: true},
		{name: "default factor, exactly half", preferred: 50, others: 100, kept: true},
		{name: "default factor, just under half", preferred: 49, others: 100, kept: false},
		{name: "default factor, more than others", preferred: 500, others: 100, kept: true},
		{name: "factor 4, a quarter", factor: 4, preferred: 25, others: 100, kept: true},
		{name: "factor 4, under a quarter", factor: 4, preferred: 24, others: 100, kept: false},
		{name: "factor 1, tied", factor: 1, preferred: 100, others: 100, kept: true},
		{name: "factor 1, one less", factor: 1, preferred: 99, others: 100, kept: false},
		{name: "factor below 1 acts as 1", factor: 0.5, preferred: 100, others: 100, kept: true},
		{name: "factor below 1 acts as 1, one less", factor: 0.5, preferred: 99, others: 100, kept: false},
		{name: "NaN is the default", factor: math.NaN(), preferred: 50, others: 100, kept: true},
		{name: "infinite factor never lets go", factor: math.Inf(1), preferred: 0, others: 1 << 40, kept: true},
		{name: "zero headroom everywhere", preferred: 0, others: 0, kept: true},
		{name: "negative reads as zero", preferred: -5, others: 1, kept: false},
		{name: "memory units hold through a burst", preferred: 4096 - 2000, others: 4096, kept: true},
	}
	cands := equalWorkers(4, 0)
	for _, tt := range tests {
		for _, mode := range []string{"client ip", "affinity key"} {
			t.Run(tt.name+"/"+mode, func(t *testing.T) {
				req := PlacementRequest{Key: "k"}
				affinity := "10.9.8.7"
				if mode == "affinity key" {
					affinity = "thread-77"
					req.AffinityKey = &affinity
				} else {
					req.ClientIP = affinity
				}
				// Find the preference at equal headroom, then load it.
				pref := cands[rendezvous(affinity, cands)].ClientID
				cs := slices.Clone(cands)
				for i := range cs {
					cs[i].Headroom = tt.others
					if cs[i].ClientID == pref {
						cs[i].Headroom = tt.preferred
					}
				}
				prefHits := 0
				for seed := range uint64(400) {
					r := &countingRand{src: seeded(seed)}
					p := PlacementPolicy{BalanceFactor: tt.factor, Rand: r.next}
					id, _ := p.Choose(req, cs)
					if tt.kept && (id != pref || r.draws != 0) {
						t.Fatalf("seed %d: chose %s with %d draws, want the preferred %s without a draw", seed, id, r.draws, pref)
					}
					if !tt.kept && r.draws == 0 {
						t.Fatalf("seed %d: chose %s without falling back to the headroom draw", seed, id)
					}
					if id == pref {
						prefHits++
					}
				}
				if !tt.kept && prefHits > 400/3 {
					t.Errorf("guard tripped but the preferred worker still got %d/400", prefHits)
				}
			})
		}
	}
}

func TestPlacementPowerOfTwo(t *testing.T) {
	headroom := []int64{3, 70, 0, 70, 12, 500, 41, 8}
	cands := make([]Candidate, len(headroom))
	for i, h := range headroom {
		cands[i] = Candidate{ClientID: fmt.Sprintf("worker-%d", i), Headroom: h}
	}
	idx := map[string]int{}
	for i, c := range cands {
		idx[c.ClientID] = i
	}
	wins := map[string]int{}
	tieSides := map[int]int{}
	for seed := range uint64(5000) {
		// Replay the two picks from an identical source.
		i, j := twoDistinct(seeded(seed), len(cands))
		if i == j {
			t.Fatalf("seed %d: drew the same candidate twice", seed)
		}
		id, ok := PlacementPolicy{Rand: seeded(seed)}.Choose(PlacementRequest{Key: "k", ClientIP: "203.0.113.9", AffinityKey: ptr("")}, cands)
		if !ok {
			t.Fatal("no choice")
		}
		got := idx[id]
		if got != i && got != j {
			t.Fatalf("seed %d: chose %s, not one of its picks %d, %d", seed, id, i, j)
		}
		lo := i
		if headroom[j] < headroom[i] {
			lo = j
		}
		if headroom[i] != headroom[j] && got == lo {
			t.Fatalf("seed %d: chose %s (headroom %d) over %d", seed, id, headroom[got], max(headroom[i], headroom[j]))
		}
		if headroom[i] == headroom[j] {
			tieSides[got]++
		}
		wins[id]++
	}
	t.Logf("p2c wins over 5000 draws: %v", wins)
	if wins["worker-2"] != 0 {
		t.Errorf("the emptiest worker won %d times", wins["worker-2"])
	}
	if tieSides[1] == 0 || tieSides[3] == 0 {
		t.Errorf("ties between worker-1 and worker-3 always went one way: %v", tieSides)
	}
	// The roomiest worker wins every draw it is in: 2/8 of them.
	if n := wins["worker-5"]; n < 1100 || n > 1400 {
		t.Errorf("worker-5 won %d of 5000, want about 1250", n)
	}
}

func TestPlacementRendezvousStability(t *testing.T) {
	tests := []struct {
		name   string
		before []Candidate
		after  []Candidate
	}{
		{
			name:   "remove one",
			before: equalWorkers(5, 100),
			after:  slices.Delete(equalWorkers(5, 100), 2, 3),
		},
		{
			name:   "add one",
			before: equalWorkers(4, 100),
			after:  equalWorkers(5, 100),
		},
	}
	for _, tt := range tests {
		for _, mode := range []string{"client ip", "affinity key"} {
			t.Run(tt.name+"/"+mode, func(t *testing.T) {
				in := map[string]bool{}
				for _, c := range tt.after {
					in[c.ClientID] = true
				}
				moved := 0
				for k := range 2000 {
					req := PlacementRequest{Key: "k"}
					if mode == "client ip" {
						req.ClientIP = fmt.Sprintf("2001:db8::%x", k)
					} else {
						req.AffinityKey = ptr(fmt.Sprintf("thread-%d", k))
					}
					p := PlacementPolicy{Rand: seeded(uint64(k))}
					a, _ := p.Choose(req, tt.before)
					b, _ := p.Choose(req, tt.after)
					switch {
					case a == b:
					case !in[a]:
						moved++ // its worker left
					case len(tt.after) > len(tt.before) && b == tt.after[len(tt.after)-1].ClientID:
						moved++ // the newcomer took it
					default:
						t.Fatalf("key %d moved from %s to %s though %s is still a candidate", k, a, b, a)
					}
				}
				if moved < 250 || moved > 550 {
					t.Errorf("%d of 2000 keys moved, want about 400", moved)
				}
			})
		}
	}
}

func TestPlacementHeadroomBiased(t *testing.T) {
	tests := []struct {
		name     string
		headroom []int64
	}{
		{name: "weights 1:2:4", headroom: []int64{0, 1, 3}},
		{name: "equal", headroom: []int64{5, 5, 5, 5}},
		{name: "negative reads as zero", headroom: []int64{-7, 0, 2}},
		{name: "overflowing sum", headroom: []int64{math.MaxInt64, math.MaxInt64, math.MaxInt64 / 2, 0}},
	}
	const draws = 20000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]Candidate, len(tt.headroom))
			var total float64
			for i, h := range tt.headroom {
				cands[i] = Candidate{ClientID: fmt.Sprintf("worker-%d", i), Headroom: h}
				total += float64(max(h, 0)) + 1
			}
			counts := map[string]int{}
			p := PlacementPolicy{Rand: seeded(11)}
			for range draws {
				id, ok := p.Choose(PlacementRequest{Key: "k"}, cands) // no client IP
				if !ok {
					t.Fatal("no choice")
				}
				counts[id]++
			}
			for i, c := range cands {
				want := draws * (float64(max(tt.headroom[i], 0)) + 1) / total
				got := float64(counts[c.ClientID])
				if math.Abs(got-want) > 4*math.Sqrt(want)+5 {
					t.Errorf("%s (headroom %d) chosen %v times, want about %.0f", c.ClientID, tt.headroom[i], got, want)
				}
			}
		})
	}
}

func TestPlacementDeterministic(t *testing.T) {
	cands := []Candidate{{"a", 3}, {"b", 9}, {"c", 0}, {"d", 40}}
	reqs := []PlacementRequest{
		{Key: "k"},
		{Key: "k", AffinityKey: ptr("")},
		{Key: "k", ClientIP: "203.0.113.1"},
	}
	run := func() []string {
		p := PlacementPolicy{Rand: seeded(42)}
		var out []string
		for i := range 300 {
			id, _ := p.Choose(reqs[i%len(reqs)], cands)
			out = append(out, id)
		}
		return out
	}
	if a, b := run(), run(); !slices.Equal(a, b) {
		t.Fatal("the same random source gave different choices")
	}
}

func TestPlacementChooseDoesNotAllocate(t *testing.T) {
	cands := equalWorkers(100, 64)
	key := "thread-1"
	p := PlacementPolicy{Rand: seeded(5)}
	for _, req := range []PlacementRequest{
		{Key: "k"},
		{Key: "k", ClientIP: "203.0.113.1"},
		{Key: "k", AffinityKey: &key},
		{Key: "k", AffinityKey: ptr("")},
		{Key: "k", CallerID: "worker-50"},
	} {
		if n := testing.AllocsPerRun(100, func() { p.Choose(req, cands) }); n != 0 {
			t.Errorf("Choose(%+v) allocates %v times", req, n)
		}
	}
}

func TestParseTrustedProxies(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "", want: nil},
		{in: " , ", want: nil},
		{in: "10.0.0.1", want: []string{"10.0.0.1/32"}},
		{in: "10.0.0.0/8, 192.168.1.7 ,fd00::/8,::1", want: []string{"10.0.0.0/8", "192.168.1.7/32", "fd00::/8", "::1/128"}},
		{in: "10.1.2.3/8", want: []string{"10.0.0.0/8"}},
		{in: "::ffff:10.0.0.1", want: []string{"10.0.0.1/32"}},
		{in: "10.0.0.1,", want: []string{"10.0.0.1/32"}},
		{in: "garbage", wantErr: true},
		{in: "10.0.0.0/8,nope", wantErr: true},
		{in: "10.0.0.0/33", wantErr: true},
		{in: "10.0.0", wantErr: true},
		{in: "10.0.0.1:80", wantErr: true},
		{in: "fe80::1%eth0", wantErr: true},
		{in: "10.0.0.0/", wantErr: true},
		{in: "*", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseTrustedProxies(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseTrustedProxies(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseTrustedProxies(%q): %v", tt.in, err)
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		if !slices.Equal(s, tt.want) {
			t.Errorf("ParseTrustedProxies(%q) = %v, want %v", tt.in, s, tt.want)
		}
	}
}

func TestClientIP(t *testing.T) {
	trusted, err := ParseTrustedProxies("10.0.0.0/8, 192.168.1.1, fd00::/8")
	if err != nil {
		t.Fatal(err)
	}
	type hdr [][2]string
	tests := []struct {
		name    string
		remote  string
		headers hdr
		trusted []netip.Prefix // nil: the list above
		none    bool           // trust nobody
		want    string
	}{
		{name: "direct client", remote: "203.0.113.7:51000", want: "203.0.113.7"},
		{name: "spoofed XFF from untrusted peer", remote: "203.0.113.7:51000", headers: hdr{{"X-Forwarded-For", "10.0.0.1"}}, want: "203.0.113.7"},
		{name: "spoofed X-Real-IP from untrusted peer", remote: "203.0.113.7:51000", headers: hdr{{"X-Real-IP", "1.2.3.4"}}, want: "203.0.113.7"},
		{name: "spoofed Forwarded from untrusted peer", remote: "203.0.113.7:51000", headers: hdr{{"Forwarded", "for=1.2.3.4"}}, want: "203.0.113.7"},
		{name: "no trusted proxies configured", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "198.51.100.1"}}, none: true, want: "10.0.0.2"},
		{name: "trusted peer, one hop", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "198.51.100.1"}}, want: "198.51.100.1"},
		{name: "trusted peer, no headers", remote: "10.0.0.2:80", want: "10.0.0.2"},
		{name: "client spoofs the left of the chain", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 10.0.0.5"}}, want: "198.51.100.1"},
		{name: "several trusted proxies", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "198.51.100.2, 10.9.9.9, 192.168.1.1, 10.0.0.3"}}, want: "198.51.100.2"},
		{name: "XFF over several header lines", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "6.6.6.6, 198.51.100.2"}, {"X-Forwarded-For", "10.0.0.3"}}, want: "198.51.100.2"},
		{name: "every hop trusted", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "10.0.0.7, 10.0.0.3"}}, want: "10.0.0.7"},
		{name: "empty list elements", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", " , 198.51.100.3 ,, "}}, want: "198.51.100.3"},
		{name: "hop with port", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "198.51.100.4:5555"}}, want: "198.51.100.4"},
		{name: "garbage beyond the client is never read", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "not an ip, 198.51.100.5"}}, want: "198.51.100.5"},
		{name: "garbage nearest hop", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "198.51.100.5, garbage"}}, want: ""},
		{name: "unknown hop", remote: "10.0.0.2:80", headers: hdr{{"X-Forwarded-For", "unknown"}}, want: ""},
		{name: "XFF wins over Forwarded", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for=198.51.100.8"}, {"X-Forwarded-For", "198.51.100.9"}}, want: "198.51.100.9"},
		{name: "IPv6 peer untrusted", remote: "[2001:db8::9]:1234", headers: hdr{{"X-Forwarded-For", "198.51.100.1"}}, want: "2001:db8::9"},
		{name: "IPv6 chain", remote: "[fd00::1]:443", headers: hdr{{"X-Forwarded-For", "2001:db8::5, fd00::77"}}, want: "2001:db8::5"},
		{name: "IPv6 hop in brackets with port", remote: "[fd00::1]:443", headers: hdr{{"X-Forwarded-For", "[2001:db8::6]:8080"}}, want: "2001:db8::6"},
		{name: "IPv6 hop in brackets", remote: "[fd00::1]:443", headers: hdr{{"X-Forwarded-For", "[2001:db8::7]"}}, want: "2001:db8::7"},
		{name: "IPv4-mapped peer matches IPv4 prefix", remote: "[::ffff:10.0.0.1]:80", headers: hdr{{"X-Forwarded-For", "::ffff:198.51.100.1"}}, want: "198.51.100.1"},
		{name: "zoned peer", remote: "[fe80::1%eth0]:80", want: "fe80::1"},
		{name: "remote without port", remote: "203.0.113.1", want: "203.0.113.1"},
		{name: "unix socket peer", remote: "@", want: ""},
		{name: "empty remote", remote: "", want: ""},
		{name: "X-Real-IP from trusted peer", remote: "192.168.1.1:80", headers: hdr{{"X-Real-IP", "198.51.100.10"}}, want: "198.51.100.10"},
		{name: "malformed X-Real-IP", remote: "192.168.1.1:80", headers: hdr{{"X-Real-IP", "198.51.100"}}, want: ""},
		{name: "Forwarded RFC example", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", `for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"`}}, want: "2001:db8:cafe::17"},
		{name: "Forwarded through trusted proxies", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for=198.51.100.9;proto=https"}, {"Forwarded", `For="10.0.0.4", for=192.168.1.1`}}, want: "198.51.100.9"},
		{name: "Forwarded quoted comma elsewhere", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", `for=198.51.100.11;ext="a,b;c", for=10.0.0.4`}}, want: "198.51.100.11"},
		{name: "Forwarded obfuscated", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for=198.51.100.9, for=_hidden"}}, want: ""},
		{name: "Forwarded unknown", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for=unknown"}}, want: ""},
		{name: "Forwarded element without for", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for=198.51.100.9, proto=https"}}, want: ""},
		{name: "Forwarded unterminated quote", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", `for="198.51.100.9`}}, want: ""},
		{name: "Forwarded escaped quote", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", `for="198.51.100.9\""`}}, want: ""},
		{name: "Forwarded no value", remote: "10.0.0.2:80", headers: hdr{{"Forwarded", "for"}}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, kv := range tt.headers {
				h.Add(kv[0], kv[1])
			}
			tr := trusted
			if tt.none {
				tr = nil
			}
			if got := ClientIP(tt.remote, h, tr); got != tt.want {
				t.Errorf("ClientIP(%q, %v) = %q, want %q", tt.remote, h, got, tt.want)
			}
		})
	}
}

func TestClientIPLongForwardedChain(t *testing.T) {
	trusted, _ := ParseTrustedProxies("10.0.0.0/8")
	h := http.Header{}
	h.Add("Forwarded", "for=198.51.100.1")
	for i := range maxForwardedHops {
		h.Add("Forwarded", fmt.Sprintf("for=10.0.1.%d", i))
	}
	// The client is one hop beyond what is remembered: unknown, not a proxy.
	if got := ClientIP("10.0.0.2:80", h, trusted); got != "" {
		t.Errorf("ClientIP over %d trusted hops = %q, want \"\"", maxForwardedHops, got)
	}
	h.Del("Forwarded")
	h.Add("Forwarded", "for=10.0.1.1, for=203.0.113.3")
	for i := range maxForwardedHops - 1 {
		h.Add("Forwarded", fmt.Sprintf("for=10.0.2.%d", i))
	}
	if got := ClientIP("10.0.0.2:80", h, trusted); got != "203.0.113.3" {
		t.Errorf("ClientIP = %q, want 203.0.113.3", got)
	}
}

func TestClientIPNilHeader(t *testing.T) {
	trusted, _ := ParseTrustedProxies("10.0.0.0/8")
	if got := ClientIP("10.0.0.2:80", nil, trusted); got != "10.0.0.2" {
		t.Errorf("ClientIP with nil header = %q", got)
	}
}

func BenchmarkPlacementChoose(b *testing.B) {
	cands := make([]Candidate, 100)
	for i := range cands {
		cands[i] = Candidate{ClientID: fmt.Sprintf("%032x", uint64(i)*0x9e3779b97f4a7c15), Headroom: int64(100 + i%7)}
	}
	key := "thread-1234"
	for _, bc := range []struct {
		name string
		req  PlacementRequest
	}{
		{"ClientIP", PlacementRequest{Key: "prod\x00chat\x00id", ClientIP: "203.0.113.77"}},
		{"AffinityKey", PlacementRequest{Key: "prod\x00chat\x00id", AffinityKey: &key}},
		{"PowerOfTwo", PlacementRequest{Key: "prod\x00chat\x00id", AffinityKey: ptr("")}},
		{"Headroom", PlacementRequest{Key: "prod\x00chat\x00id"}},
		{"OwnWorker", PlacementRequest{Key: "prod\x00chat\x00id", CallerID: cands[50].ClientID}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := PlacementPolicy{Rand: seeded(1)}
			b.ReportAllocs()
			for b.Loop() {
				p.Choose(bc.req, cands)
			}
		})
	}
}

func BenchmarkClientIP(b *testing.B) {
	trusted, _ := ParseTrustedProxies("10.0.0.0/8, 192.168.0.0/16, fd00::/8")
	h := http.Header{}
	h.Set("X-Forwarded-For", "1.1.1.1, 198.51.100.2, 10.9.9.9, 192.168.1.1")
	b.ReportAllocs()
	for b.Loop() {
		ClientIP("10.0.0.2:51000", h, trusted)
	}
}
