package directory

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"
)

// run applies a generated program to n and checks every step against the
// model. Some steps feed corrupted encodings straight to Apply.
func run(tb testing.TB, n *node, s *source, steps int) {
	tb.Helper()
	g := &gen{s: s, now: 1_700_000_000_000}
	chk := newChecker(tb)
	for i := 0; i < steps && !s.exhausted(); i++ {
		if i > 0 && i%300 == 0 {
			// Go on from a restored snapshot, as a follower that installs
			// one does: the model must not notice.
			m2 := New()
			if err := m2.Restore(bytes.NewReader(n.snapshot())); err != nil {
				tb.Fatalf("step %d: restore: %v", i, err)
			}
			checkIndexes(tb, m2)
			n.m = m2
		}
		cmd := g.command(false)
		raw := Encode(cmd)
		if s.pick(8) == 0 {
			// Corrupt one byte: Apply must answer, never panic, and whatever
			// it applied must still satisfy the model.
			raw[s.pick(len(raw))] ^= 1 << s.pick(8)
		}
		n.idx += 1 + uint64(s.pick(2)) // raft entries the FSM never sees leave gaps
		out := n.m.Apply(n.idx, raw)
		r, err := DecodeResult(out)
		if err != nil {
			tb.Fatalf("step %d: result undecodable: %v", i, err)
		}
		if dec, err := DecodeCommand(raw); err == nil {
			// A corrupted stamp ahead of the clock moves the clock: a
			// command is never delivered before the time it carries.
			g.now = max(g.now, nowOf(dec))
			chk.now = g.now
			chk.observe(n.idx, dec, r)
			chk.compareState(n.m)
		} else if r.Code != CodeError {
			tb.Fatalf("step %d: undecodable command answered %v", i, r.Code)
		}
		if r.Code == CodeGranted {
			g.gens = append(g.gens, Release{Key: r.Placement.Key, ClientID: r.Placement.Owner, Generation: r.Placement.Generation})
		}
		for _, sub := range r.Results {
			if sub.Code == CodeGranted {
				g.gens = append(g.gens, Release{Key: sub.Placement.Key, ClientID: sub.Placement.Owner, Generation: sub.Placement.Generation})
			}
		}
		if len(g.gens) > 16 {
			g.gens = g.gens[len(g.gens)-16:]
		}
	}
	checkIndexes(tb, n.m)
	// The snapshot must survive a restore byte for byte.
	snap := n.snapshot()
	m2 := New()
	if err := m2.Restore(bytes.NewReader(snap)); err != nil {
		tb.Fatalf("restore: %v", err)
	}
	if again := snapshotBytes(tb, m2); !bytes.Equal(snap, again) {
		tb.Fatalf("snapshot changed across restore")
	}
}

// checkIndexes verifies the derived maps agree with the primary ones, and
// that the lock-free readers' view is the state the appliers left.
func checkIndexes(tb testing.TB, m *Machine) {
	tb.Helper()
	m.mu.RLock()
	defer m.mu.RUnlock()
	pt := m.st.placements
	if len(pt.pending) != 0 {
		tb.Fatalf("%d placement writes left uncommitted", len(pt.pending))
	}
	n := 0
	for owner, keys := range pt.owned {
		for k := range keys {
			p, ok := pt.load(k)
			if !ok || p.Owner != owner {
				tb.Fatalf("owner index: %s -> %v, placement %+v", owner, k, p)
			}
			n++
		}
	}
	all := 0
	pt.each(func(Placement) { all++ })
	if n != all || all != pt.n {
		tb.Fatalf("owner index holds %d keys, table %d placements, count %d", n, all, pt.n)
	}
	for url, id := range m.st.byURL {
		if w, ok := m.st.workers.get(id); !ok || w.AdvertiseURL != url {
			tb.Fatalf("url index: %s -> %s", url, id)
		}
	}
	for id, w := range m.st.workers.all() {
		if w.AdvertiseURL != "" && m.st.byURL[w.AdvertiseURL] != id {
			tb.Fatalf("url index: %s of %s maps to %q", w.AdvertiseURL, id, m.st.byURL[w.AdvertiseURL])
		}
	}
	v := m.view.Load()
	if v.placements != pt || !bytes.Equal(v.secret.recorded, m.st.secret) {
		tb.Fatal("published view holds another placement table or secret")
	}
	if m.st.workers.changed || len(m.st.workers.fresh) != 0 {
		tb.Fatal("worker changes left unpublished")
	}
	if !maps.EqualFunc(v.workers, m.st.workers.all(), func(a, b *Worker) bool { return reflect.DeepEqual(*a, *b) }) {
		tb.Fatalf("published workers %v, live %v", v.workers, m.st.workers.all())
	}
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 1, 1, 1, 6, 0, 0, 0, 0, 1, 0})
	f.Add(bytes.Repeat([]byte{2, 1, 3, 7, 6, 1, 0, 2, 4, 0}, 20))
	f.Add(bytes.Repeat([]byte{15, 3, 6, 6, 2, 1, 9, 0, 12, 5}, 30))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		b := make([]byte, 400)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		run(t, newNode(t), &source{data: data}, 1<<20)
	})
}

// FuzzDecode feeds arbitrary bytes to every decoder.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(Batch{Commands: []Command{claim("a", "c1", 5), Release{Key: key("a")}}}))
	f.Add(EncodeResult(Result{Code: CodeOK, Results: []Result{{Code: CodeGranted, Placement: Placement{Key: key("a"), Generation: 3}}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := DecodeCommand(b); err == nil {
			if _, err := DecodeCommand(Encode(c)); err != nil {
				t.Fatalf("re-encoded command undecodable: %v", err)
			}
		}
		// The decoder accepts a few spellings of a zero field; what it
		// re-encodes must read back to the same bytes.
		if r, err := DecodeResult(b); err == nil {
			enc := EncodeResult(r)
			r2, err := DecodeResult(enc)
			if err != nil || !bytes.Equal(EncodeResult(r2), enc) {
				t.Fatalf("result re-encoding unstable: %v", err)
			}
		}
		_ = New().Restore(bytes.NewReader(b))
	})
}

// TestRandomLogs runs longer generated programs than the fuzz seeds.
func TestRandomLogs(t *testing.T) {
	for seed := range uint64(64) {
		run(t, newNode(t), &source{rng: rand.New(rand.NewPCG(seed, 7))}, 1000)
	}
}

// TestDeterminism applies one random log to two fresh machines.
func TestDeterminism(t *testing.T) {
	for seed := range uint64(10) {
		s := &source{rng: rand.New(rand.NewPCG(seed, 99))}
		g := &gen{s: s, now: 1_700_000_000_000}
		var log [][]byte
		for range 1000 {
			log = append(log, Encode(g.command(false)))
		}
		a, b := New(), New()
		for i, e := range log {
			ra, rb := a.Apply(uint64(i+1), e), b.Apply(uint64(i+1), e)
			if !bytes.Equal(ra, rb) {
				t.Fatalf("seed %d entry %d: results differ", seed, i)
			}
		}
		sa, sb := snapshotBytes(t, a), snapshotBytes(t, b)
		if !bytes.Equal(sa, sb) {
			t.Fatalf("seed %d: snapshots differ", seed)
		}
		c := New()
		if err := c.Restore(bytes.NewReader(sa)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sa, snapshotBytes(t, c)) {
			t.Fatalf("seed %d: snapshot changed across restore", seed)
		}
		assertSameReads(t, a, c)
		// The restored machine goes on exactly like the original.
		more := Encode(g.command(false))
		idx := uint64(len(log) + 1)
		if !bytes.Equal(a.Apply(idx, more), c.Apply(idx, more)) {
			t.Fatalf("seed %d: restored machine answers differently", seed)
		}
	}
}

func assertSameReads(t *testing.T, a, b *Machine) {
	t.Helper()
	if a.AppliedIndex() != b.AppliedIndex() || a.ColdStart() != b.ColdStart() || !bytes.Equal(a.Secret(), b.Secret()) {
		t.Fatalf("scalars differ")
	}
	wa, wb := a.Workers(), b.Workers()
	if len(wa) != len(wb) {
		t.Fatalf("workers: %d vs %d", len(wa), len(wb))
	}
	for i := range wa {
		if wa[i].ClientID != wb[i].ClientID || wa[i].LeaseExpiry != wb[i].LeaseExpiry || wa[i].SessionID != wb[i].SessionID {
			t.Fatalf("worker %d: %+v vs %+v", i, wa[i], wb[i])
		}
		pa, pb := a.PlacementsOf(wa[i].ClientID), b.PlacementsOf(wa[i].ClientID)
		if len(pa) != len(pb) {
			t.Fatalf("placements of %s: %d vs %d", wa[i].ClientID, len(pa), len(pb))
		}
		for j := range pa {
			if pa[j] != pb[j] {
				t.Fatalf("placement %+v vs %+v", pa[j], pb[j])
			}
			if p, ok := b.Placement(pa[j].Key); !ok || p != pa[j] {
				t.Fatalf("Placement(%v) = %+v, %v", pa[j].Key, p, ok)
			}
		}
	}
	da, db := a.Drains(), b.Drains()
	if len(da) != len(db) {
		t.Fatalf("drains differ")
	}
}
