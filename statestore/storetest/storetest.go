// Package storetest is the conformance suite every statestore.Store implementation passes.
//
// An implementation's test calls Run with a function opening a fresh, empty store; durable
// implementations add WithReopen, and those that several processes share (Postgres) add
// WithAttach so the suite can race two handles the way two nodes would. BenchCommit is the
// common benchmark.
//
// The suite only uses the Store interface; it must never reach into an implementation.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pinnedd/pinnedd/statestore"
)

// Option adjusts Run.
type Option func(*config)

type config struct {
	reopen func(t *testing.T, s statestore.Store) statestore.Store
	attach func(t *testing.T, s statestore.Store) statestore.Store
}

// WithReopen says the store is durable: reopen closes s and returns a new Store over the same
// storage, as a restarted process would see it.
func WithReopen(reopen func(t *testing.T, s statestore.Store) statestore.Store) Option {
	return func(c *config) { c.reopen = reopen }
}

// WithAttach says several processes may share the storage: attach returns another Store open
// at the same time over the same storage as s, as a second node would have. The suite closes it.
func WithAttach(attach func(t *testing.T, s statestore.Store) statestore.Store) Option {
	return func(c *config) { c.attach = attach }
}

// Run runs the conformance suite. open must return a fresh, empty store on which Setup may or
// may not have been called yet; the suite calls Setup itself and closes the store at the end of
// each subtest.
func Run(t *testing.T, open func(t *testing.T) statestore.Store, opts ...Option) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	h := &harness{open: open, config: c}
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"RoundTrip", testRoundTrip},
		{"EmptyInstance", testEmptyInstance},
		{"InstancesAreSeparate", testInstancesAreSeparate},
		{"SeqsNeverReused", testSeqsNeverReused},
		{"MarkedDerived", testMarkedDerived},
		{"MarkAppliedAndRemove", testMarkAppliedAndRemove},
		{"TrayDisappearsWhenEmpty", testTrayDisappearsWhenEmpty},
		{"CommitIsAtomic", testCommitIsAtomic},
		{"Validation", testValidation},
		{"Fencing", testFencing},
		{"ConcurrentFence", testConcurrentFence},
		{"ConcurrentGenerations", testConcurrentGenerations},
		{"ListMarked", testListMarked},
		{"CollectFences", testCollectFences},
		{"CollectFencesKeeps", testCollectFencesKeeps},
		{"CollectFloorSparesUnloadedPlacements", testCollectFloorSparesUnloaded},
		{"CollectFencesValidation", testCollectFencesValidation},
		{"CollectFencesReopen", testCollectFencesReopen},
		{"SetupIdempotentAndConcurrent", testSetup},
		{"CopiesBuffers", testCopiesBuffers},
		{"Reopen", testReopen},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

type harness struct {
	open func(t *testing.T) statestore.Store
	config
}

// store opens a fresh store, set up, closed when the test ends.
func (h *harness) store(t *testing.T) statestore.Store {
	t.Helper()
	s := h.open(t)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Setup(t.Context()); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	return s
}

var (
	inst1 = statestore.InstanceKey{Namespace: "/threads", ID: "t1"}
	inst2 = statestore.InstanceKey{Namespace: "/threads", ID: "t2"}
	logT  = statestore.TrayKey{NS: "log", ID: "~"}
	cmdA  = statestore.TrayKey{NS: "client_commands", ID: "client-a"}
	cmdB  = statestore.TrayKey{NS: "client_commands", ID: "client-b"}
)

func commit(t testing.TB, s statestore.Store, inst statestore.InstanceKey, gen uint64, muts ...statestore.Mutation) statestore.CommitResult {
	t.Helper()
	res, err := s.Commit(context.Background(), inst, gen, muts)
	if err != nil {
		t.Fatalf("Commit(%s, gen %d): %v", inst, gen, err)
	}
	return res
}

func load(t testing.TB, s statestore.Store, inst statestore.InstanceKey, gen uint64) []statestore.Tray {
	t.Helper()
	trays, err := s.Load(context.Background(), inst, gen)
	if err != nil {
		t.Fatalf("Load(%s, gen %d): %v", inst, gen, err)
	}
	return trays
}

func generation(t testing.TB, s statestore.Store, inst statestore.InstanceKey) uint64 {
	t.Helper()
	g, err := s.Generation(context.Background(), inst)
	if err != nil {
		t.Fatalf("Generation(%s): %v", inst, err)
	}
	return g
}

func payloads(ps ...string) [][]byte {
	out := make([][]byte, len(ps))
	for i, p := range ps {
		out[i] = []byte(p)
	}
	return out
}

// describe renders trays compactly so that a failure shows the whole state.
func describe(trays []statestore.Tray) string {
	var b strings.Builder
	for _, tr := range trays {
		fmt.Fprintf(&b, "[%s marked=%v fields{", tr.Key, tr.Marked)
		names := make([]string, 0, len(tr.Fields))
		for n := range tr.Fields {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(&b, "%s=%q ", n, tr.Fields[n])
		}
		b.WriteString("} items{")
		for _, it := range tr.Items {
			fmt.Fprintf(&b, "%d:%q", it.Seq, it.Payload)
			if it.Applied {
				b.WriteString("(applied)")
			}
			b.WriteString(" ")
		}
		b.WriteString("}]")
	}
	return b.String()
}

func expectState(t testing.TB, s statestore.Store, inst statestore.InstanceKey, gen uint64, want string) {
	t.Helper()
	if got := describe(load(t, s, inst, gen)); got != want {
		t.Fatalf("state of %s:\n got %s\nwant %s", inst, got, want)
	}
}

func testRoundTrip(t *testing.T, h *harness) {
	s := h.store(t)
	res := commit(t, s, inst1, 1,
		statestore.SetField{Tray: logT, Name: "messages", Value: []byte(`{"a":1}`)},
		statestore.SetField{Tray: logT, Name: "empty", Value: []byte{}},
		statestore.AppendItems{Tray: cmdB, Payloads: payloads("b1")},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("a1", "a2")},
		statestore.SetField{Tray: cmdA, Name: "cursor", Value: []byte("7")},
	)
	if len(res.Seqs) != 2 || len(res.Seqs[0]) != 1 || len(res.Seqs[1]) != 2 {
		t.Fatalf("CommitResult.Seqs = %v, want one slice per AppendItems with one seq per payload", res.Seqs)
	}
	b1, a1, a2 := res.Seqs[0][0], res.Seqs[1][0], res.Seqs[1][1]
	if !(b1 >= 1 && b1 < a1 && a1 < a2) {
		t.Fatalf("seqs %v not strictly increasing in commit order", res.Seqs)
	}
	trays := load(t, s, inst1, 1)
	want := fmt.Sprintf(`[client_commands:client-a marked=true fields{cursor="7" } items{%d:"a1" %d:"a2" }]`+
		`[client_commands:client-b marked=true fields{} items{%d:"b1" }]`+
		`[log:~ marked=false fields{empty="" messages="{\"a\":1}" } items{}]`, a1, a2, b1)
	if got := describe(trays); got != want {
		t.Fatalf("Load:\n got %s\nwant %s", got, want)
	}
	for _, tr := range trays {
		if tr.Fields == nil {
			t.Fatalf("tray %s: Fields is nil, want an empty map", tr.Key)
		}
	}
	if v, ok := trays[2].Fields["empty"]; !ok || v == nil || len(v) != 0 {
		t.Fatalf("empty field = %q (present %v), want a present, empty, non-nil value", v, ok)
	}

	// Overwrite and delete fields; nil deletes.
	commit(t, s, inst1, 1,
		statestore.SetField{Tray: logT, Name: "messages", Value: []byte(`{"a":2}`)},
		statestore.SetField{Tray: logT, Name: "empty", Value: nil},
		statestore.SetField{Tray: logT, Name: "never-set", Value: nil},
	)
	trays = load(t, s, inst1, 1)
	if got := describe(trays[2:]); got != `[log:~ marked=false fields{messages="{\"a\":2}" } items{}]` {
		t.Fatalf("after overwrite: %s", got)
	}
}

func testEmptyInstance(t *testing.T, h *harness) {
	s := h.store(t)
	if g := generation(t, s, inst1); g != 0 {
		t.Fatalf("Generation of unknown instance = %d, want 0", g)
	}
	if trays := load(t, s, inst1, 3); len(trays) != 0 {
		t.Fatalf("Load of unknown instance = %s, want nothing", describe(trays))
	}
	if g := generation(t, s, inst1); g != 3 {
		t.Fatalf("Generation after Load(3) = %d, want 3 (Load fences)", g)
	}
	// An empty commit only fences.
	commit(t, s, inst2, 4)
	if g := generation(t, s, inst2); g != 4 {
		t.Fatalf("Generation after empty Commit(4) = %d, want 4", g)
	}
}

func testInstancesAreSeparate(t *testing.T, h *harness) {
	s := h.store(t)
	other := statestore.InstanceKey{Namespace: "/counters", ID: "t1"}
	commit(t, s, inst1, 5, statestore.SetField{Tray: logT, Name: "n", Value: []byte("1")})
	commit(t, s, other, 1, statestore.SetField{Tray: logT, Name: "n", Value: []byte("2")})
	expectState(t, s, inst1, 5, `[log:~ marked=false fields{n="1" } items{}]`)
	expectState(t, s, other, 1, `[log:~ marked=false fields{n="2" } items{}]`)
	if g := generation(t, s, other); g != 1 {
		t.Fatalf("generation of %s = %d, want 1: fences are per instance", other, g)
	}
}

func testSeqsNeverReused(t *testing.T, h *harness) {
	s := h.store(t)
	var last int64
	check := func(res statestore.CommitResult) {
		t.Helper()
		for _, seqs := range res.Seqs {
			for _, q := range seqs {
				if q <= last {
					t.Fatalf("seq %d after %d: not strictly increasing", q, last)
				}
				last = q
			}
		}
	}
	check(commit(t, s, inst1, 1, statestore.AppendItems{Tray: cmdA, Payloads: payloads("1", "2", "3")}))
	check(commit(t, s, inst1, 1, statestore.RemoveItems{Tray: cmdA, UpTo: last}))
	check(commit(t, s, inst1, 1, statestore.AppendItems{Tray: cmdA, Payloads: payloads("4")}))
	check(commit(t, s, inst1, 1, statestore.DeleteTray{Tray: cmdA}))
	expectState(t, s, inst1, 1, ``)
	// Recreated after deletion, in the same commit as another append.
	res := commit(t, s, inst1, 2,
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("5")},
		statestore.AppendItems{Tray: cmdB, Payloads: payloads("6", "7")},
	)
	check(res)
	expectState(t, s, inst1, 2, fmt.Sprintf(`[client_commands:client-a marked=true fields{} items{%d:"5" }]`+
		`[client_commands:client-b marked=true fields{} items{%d:"6" %d:"7" }]`,
		res.Seqs[0][0], res.Seqs[1][0], res.Seqs[1][1]))
	// An empty AppendItems still gets its (empty) slot in the result.
	res = commit(t, s, inst1, 2, statestore.AppendItems{Tray: cmdA}, statestore.AppendItems{Tray: cmdA, Payloads: payloads("8")})
	if len(res.Seqs) != 2 || len(res.Seqs[0]) != 0 || len(res.Seqs[1]) != 1 {
		t.Fatalf("Seqs = %v, want [[] [n]]", res.Seqs)
	}
	check(res)
}

func testMarkedDerived(t *testing.T, h *harness) {
	s := h.store(t)
	res := commit(t, s, inst1, 1,
		statestore.SetField{Tray: cmdA, Name: "f", Value: []byte("x")},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("p")},
	)
	q := res.Seqs[0][0]
	expectState(t, s, inst1, 1, fmt.Sprintf(`[client_commands:client-a marked=true fields{f="x" } items{%d:"p" }]`, q))
	commit(t, s, inst1, 1, statestore.MarkApplied{Tray: cmdA, UpTo: q})
	expectState(t, s, inst1, 1, fmt.Sprintf(`[client_commands:client-a marked=true fields{f="x" } items{%d:"p"(applied) }]`, q))
	commit(t, s, inst1, 1, statestore.RemoveItems{Tray: cmdA, UpTo: q})
	expectState(t, s, inst1, 1, `[client_commands:client-a marked=false fields{f="x" } items{}]`)
	// Append and settle in one commit: the derived flag reflects the end of the commit.
	commit(t, s, inst1, 1,
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("q")},
		statestore.RemoveItems{Tray: cmdA, UpTo: 1 << 62},
	)
	expectState(t, s, inst1, 1, `[client_commands:client-a marked=false fields{f="x" } items{}]`)
}

func testMarkAppliedAndRemove(t *testing.T, h *harness) {
	s := h.store(t)
	res := commit(t, s, inst1, 1, statestore.AppendItems{Tray: cmdA, Payloads: payloads("a", "b", "c", "d")})
	q := res.Seqs[0]
	res = commit(t, s, inst1, 1, statestore.AppendItems{Tray: cmdB, Payloads: payloads("x")})
	x := res.Seqs[0][0]
	// UpTo between seqs, and MarkApplied/RemoveItems on a tray that does not exist: no-ops there.
	commit(t, s, inst1, 1,
		statestore.MarkApplied{Tray: cmdA, UpTo: q[1]},
		statestore.MarkApplied{Tray: logT, UpTo: 100},
		statestore.RemoveItems{Tray: logT, UpTo: 100},
	)
	expectState(t, s, inst1, 1, fmt.Sprintf(`[client_commands:client-a marked=true fields{} items{%d:"a"(applied) %d:"b"(applied) %d:"c" %d:"d" }]`+
		`[client_commands:client-b marked=true fields{} items{%d:"x" }]`, q[0], q[1], q[2], q[3], x))
	// Removing up to b leaves c and d, untouched by the other tray.
	commit(t, s, inst1, 1, statestore.RemoveItems{Tray: cmdA, UpTo: q[1]}, statestore.MarkApplied{Tray: cmdA, UpTo: 0})
	expectState(t, s, inst1, 1, fmt.Sprintf(`[client_commands:client-a marked=true fields{} items{%d:"c" %d:"d" }]`+
		`[client_commands:client-b marked=true fields{} items{%d:"x" }]`, q[2], q[3], x))
	commit(t, s, inst1, 1, statestore.MarkApplied{Tray: cmdA, UpTo: q[3]})
	expectState(t, s, inst1, 1, fmt.Sprintf(`[client_commands:client-a marked=true fields{} items{%d:"c"(applied) %d:"d"(applied) }]`+
		`[client_commands:client-b marked=true fields{} items{%d:"x" }]`, q[2], q[3], x))
}

func testTrayDisappearsWhenEmpty(t *testing.T, h *harness) {
	s := h.store(t)
	res := commit(t, s, inst1, 1,
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("run")},
		statestore.SetField{Tray: logT, Name: "m", Value: []byte("1")},
	)
	// A settled run's tray deletes itself: removing its last item removes it.
	commit(t, s, inst1, 1, statestore.RemoveItems{Tray: cmdA, UpTo: res.Seqs[0][0]})
	expectState(t, s, inst1, 1, `[log:~ marked=false fields{m="1" } items{}]`)
	// Deleting the last field removes the tray too.
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "m"})
	expectState(t, s, inst1, 1, ``)
	// DeleteTray then SetField in one commit leaves just the new field.
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "old", Value: []byte("o")},
		statestore.AppendItems{Tray: logT, Payloads: payloads("w")})
	commit(t, s, inst1, 1, statestore.DeleteTray{Tray: logT}, statestore.SetField{Tray: logT, Name: "new", Value: []byte("n")})
	expectState(t, s, inst1, 1, `[log:~ marked=false fields{new="n" } items{}]`)
}

func testCommitIsAtomic(t *testing.T, h *harness) {
	s := h.store(t)
	res := commit(t, s, inst1, 2,
		statestore.SetField{Tray: logT, Name: "m", Value: []byte("before")},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("a")},
	)
	before := describe(load(t, s, inst1, 2))
	bad := []statestore.Mutation{
		statestore.SetField{Tray: logT, Name: "m", Value: []byte("after")},
		statestore.DeleteTray{Tray: cmdA},
		statestore.AppendItems{Tray: cmdB, Payloads: payloads("b")},
		statestore.SetField{Tray: logT, Name: "", Value: []byte("x")}, // invalid
		statestore.SetField{Tray: logT, Name: "z", Value: []byte("z")},
	}
	// A newer generation with an invalid commit must not raise the fence either.
	if _, err := s.Commit(t.Context(), inst1, 9, bad); !errors.Is(err, statestore.ErrInvalid) {
		t.Fatalf("Commit with an invalid mutation: err = %v, want ErrInvalid", err)
	}
	if got := describe(load(t, s, inst1, 2)); got != before {
		t.Fatalf("invalid commit changed state:\n got %s\nwant %s", got, before)
	}
	if g := generation(t, s, inst1); g != 2 {
		t.Fatalf("invalid commit moved the generation to %d, want 2", g)
	}
	// The rejected append did not consume seqs visibly out of order: the next one is larger.
	next := commit(t, s, inst1, 2, statestore.AppendItems{Tray: cmdB, Payloads: payloads("b")})
	if next.Seqs[0][0] <= res.Seqs[0][0] {
		t.Fatalf("seq after rejected commit %d <= earlier %d", next.Seqs[0][0], res.Seqs[0][0])
	}
}

func testValidation(t *testing.T, h *harness) {
	s := h.store(t)
	ctx := t.Context()
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "m", Value: []byte("keep")})
	before := describe(load(t, s, inst1, 1))

	big := make([]byte, statestore.MaxValueLen+1)
	long := strings.Repeat("x", statestore.MaxTrayNameLen+1)
	badInsts := []statestore.InstanceKey{
		{Namespace: "", ID: "x"},
		{Namespace: "/ns", ID: ""},
		{Namespace: "/ns", ID: "a\x00b"},
		{Namespace: "/ns\xff", ID: "a"},
		{Namespace: strings.Repeat("n", statestore.MaxKeyLen+1), ID: "a"},
	}
	for _, bi := range badInsts {
		if err := s.Fence(ctx, bi, 1); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Fence(%q): err = %v, want ErrInvalid", bi, err)
		}
		if _, err := s.Load(ctx, bi, 1); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Load(%q): err = %v, want ErrInvalid", bi, err)
		}
		if _, err := s.Commit(ctx, bi, 1, nil); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Commit(%q): err = %v, want ErrInvalid", bi, err)
		}
		if _, err := s.Generation(ctx, bi); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Generation(%q): err = %v, want ErrInvalid", bi, err)
		}
	}
	for _, gen := range []uint64{0, statestore.MaxGeneration + 1} {
		if err := s.Fence(ctx, inst1, gen); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Fence(gen %d): err = %v, want ErrInvalid", gen, err)
		}
		if _, err := s.Load(ctx, inst1, gen); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Load(gen %d): err = %v, want ErrInvalid", gen, err)
		}
		if _, err := s.Commit(ctx, inst1, gen, nil); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Commit(gen %d): err = %v, want ErrInvalid", gen, err)
		}
	}
	badMuts := map[string]statestore.Mutation{
		"empty tray ns":     statestore.SetField{Tray: statestore.TrayKey{ID: "x"}, Name: "f", Value: []byte("v")},
		"empty tray id":     statestore.AppendItems{Tray: statestore.TrayKey{NS: "x"}, Payloads: payloads("p")},
		"long tray name":    statestore.DeleteTray{Tray: statestore.TrayKey{NS: long, ID: "x"}},
		"empty field name":  statestore.SetField{Tray: logT, Value: []byte("v")},
		"long field name":   statestore.SetField{Tray: logT, Name: strings.Repeat("f", statestore.MaxFieldNameLen+1), Value: []byte("v")},
		"oversize value":    statestore.SetField{Tray: logT, Name: "f", Value: big},
		"oversize payload":  statestore.AppendItems{Tray: logT, Payloads: [][]byte{big}},
		"negative applied":  statestore.MarkApplied{Tray: logT, UpTo: -1},
		"negative remove":   statestore.RemoveItems{Tray: logT, UpTo: -1},
		"nil mutation":      nil,
		"pointer mutation":  &statestore.SetField{Tray: logT, Name: "f", Value: []byte("v")},
		"NUL in field name": statestore.SetField{Tray: logT, Name: "a\x00", Value: []byte("v")},
	}
	for name, m := range badMuts {
		if _, err := s.Commit(ctx, inst1, 1, []statestore.Mutation{m}); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("Commit(%s): err = %v, want ErrInvalid", name, err)
		}
	}
	// Limits on the commit as a whole.
	many := make([]statestore.Mutation, statestore.MaxMutations+1)
	for i := range many {
		many[i] = statestore.SetField{Tray: logT, Name: "f", Value: []byte("v")}
	}
	if _, err := s.Commit(ctx, inst1, 1, many); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("Commit(too many mutations): err = %v, want ErrInvalid", err)
	}
	heavy := make([]statestore.Mutation, 0, 17)
	for i := range 17 {
		heavy = append(heavy, statestore.SetField{Tray: logT, Name: fmt.Sprint("f", i), Value: big[:statestore.MaxValueLen]})
	}
	if _, err := s.Commit(ctx, inst1, 1, heavy); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("Commit(over MaxCommitBytes): err = %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, inst1, 1, []statestore.Mutation{
		statestore.AppendItems{Tray: cmdA, Payloads: make([][]byte, statestore.MaxCommitItems+1)},
	}); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("Commit(over MaxCommitItems): err = %v, want ErrInvalid", err)
	}
	for _, limit := range []int{0, -1, statestore.MaxListLimit + 1} {
		if _, err := s.ListMarked(ctx, statestore.InstanceKey{}, limit); !errors.Is(err, statestore.ErrInvalid) {
			t.Errorf("ListMarked(limit %d): err = %v, want ErrInvalid", limit, err)
		}
	}
	if _, err := s.ListMarked(ctx, statestore.InstanceKey{ID: "x"}, 1); !errors.Is(err, statestore.ErrInvalid) {
		t.Errorf("ListMarked(after with id but no namespace): err = %v, want ErrInvalid", err)
	}
	if got := describe(load(t, s, inst1, 1)); got != before {
		t.Fatalf("invalid calls changed state:\n got %s\nwant %s", got, before)
	}
	if g := generation(t, s, inst1); g != 1 {
		t.Fatalf("invalid calls moved the generation to %d", g)
	}
	// The largest generation is accepted.
	if err := s.Fence(ctx, inst2, statestore.MaxGeneration); err != nil {
		t.Fatalf("Fence(MaxGeneration): %v", err)
	}
	if g := generation(t, s, inst2); g != statestore.MaxGeneration {
		t.Fatalf("Generation = %d, want MaxGeneration", g)
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func testListMarked(t *testing.T, h *harness) {
	s := h.store(t)
	ctx := t.Context()
	if got, err := s.ListMarked(ctx, statestore.InstanceKey{}, 10); err != nil || len(got) != 0 {
		t.Fatalf("ListMarked on empty store = %v, %v", got, err)
	}
	// Byte order, not locale order: "B" < "a" and "a" < "ab" < "a~".
	type spec struct {
		ns, id string
		marked bool
	}
	specs := []spec{
		{"/threads", "t1", true}, {"/threads", "t2", false}, {"/threads", "t3", true},
		{"/counters", "B", true}, {"/counters", "a", true}, {"/counters", "ab", true},
		{"/counters", "a~", false}, {"/zeta", "z", true}, {"/a", "only-fields", false},
	}
	var want []statestore.InstanceKey
	for _, sp := range specs {
		k := statestore.InstanceKey{Namespace: sp.ns, ID: sp.id}
		muts := []statestore.Mutation{statestore.SetField{Tray: logT, Name: "f", Value: []byte("v")}}
		if sp.marked {
			// Two marked trays must still list the instance once.
			muts = append(muts,
				statestore.AppendItems{Tray: cmdA, Payloads: payloads("w")},
				statestore.AppendItems{Tray: cmdB, Payloads: payloads("w")})
			want = append(want, k)
		}
		commit(t, s, k, 1, muts...)
	}
	// Settled work is no longer listed.
	settled := statestore.InstanceKey{Namespace: "/threads", ID: "t0"}
	res := commit(t, s, settled, 1, statestore.AppendItems{Tray: cmdA, Payloads: payloads("w")})
	commit(t, s, settled, 1, statestore.RemoveItems{Tray: cmdA, UpTo: res.Seqs[0][0]})
	slices.SortFunc(want, func(a, b statestore.InstanceKey) int {
		if a.Less(b) {
			return -1
		}
		if b.Less(a) {
			return 1
		}
		return 0
	})

	all, err := s.ListMarked(ctx, statestore.InstanceKey{}, statestore.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("ListMarked = %v, want %v", all, want)
	}
	for _, limit := range []int{1, 2, 3, len(want)} {
		var got []statestore.InstanceKey
		after := statestore.InstanceKey{}
		for pages := 0; ; pages++ {
			if pages > len(want)+1 {
				t.Fatalf("limit %d: pagination does not end", limit)
			}
			page, err := s.ListMarked(ctx, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(page))
			}
			got = append(got, page...)
			if len(page) < limit {
				break
			}
			after = page[len(page)-1]
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: paginated %v, want %v", limit, got, want)
		}
	}
	// A cursor that is not itself an instance, and one with only a namespace.
	page, err := s.ListMarked(ctx, statestore.InstanceKey{Namespace: "/counters", ID: "aa"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []statestore.InstanceKey{{Namespace: "/counters", ID: "ab"}, {Namespace: "/threads", ID: "t1"}}; !slices.Equal(page, want) {
		t.Fatalf("ListMarked after /counters/aa = %v, want %v", page, want)
	}
	page, err = s.ListMarked(ctx, statestore.InstanceKey{Namespace: "/threads"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []statestore.InstanceKey{{Namespace: "/threads", ID: "t1"}, {Namespace: "/threads", ID: "t3"}, {Namespace: "/zeta", ID: "z"}}; !slices.Equal(page, want) {
		t.Fatalf("ListMarked after /threads = %v, want %v", page, want)
	}
}

func testSetup(t *testing.T, h *harness) {
	s := h.open(t)
	t.Cleanup(func() { _ = s.Close() })
	stores := []statestore.Store{s}
	if h.attach != nil {
		for range 3 {
			o := h.attach(t, s)
			t.Cleanup(func() { _ = o.Close() })
			stores = append(stores, o)
		}
	}
	// Every handle sets up at once, several times, as nodes starting together would.
	errs := make(chan error, 4*len(stores))
	var wg sync.WaitGroup
	for _, st := range stores {
		for range 4 {
			wg.Go(func() { errs <- st.Setup(context.Background()) })
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Setup: %v", err)
		}
	}
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "m", Value: []byte("v")})
	if err := s.Setup(t.Context()); err != nil {
		t.Fatalf("Setup after writes: %v", err)
	}
	for _, st := range stores {
		expectState(t, st, inst1, 1, `[log:~ marked=false fields{m="v" } items{}]`)
	}
}

func testCopiesBuffers(t *testing.T, h *harness) {
	s := h.store(t)
	v := []byte("value")
	p := []byte("payload")
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "f", Value: v}, statestore.AppendItems{Tray: cmdA, Payloads: [][]byte{p}})
	copy(v, "XXXXX")
	copy(p, "XXXXXXX")
	trays := load(t, s, inst1, 1)
	if !bytes.Equal(trays[1].Fields["f"], []byte("value")) || !bytes.Equal(trays[0].Items[0].Payload, []byte("payload")) {
		t.Fatalf("store kept the caller's buffers: %s", describe(trays))
	}
	copy(trays[1].Fields["f"], "YYYYY")
	copy(trays[0].Items[0].Payload, "YYYYYYY")
	trays = load(t, s, inst1, 1)
	if !bytes.Equal(trays[1].Fields["f"], []byte("value")) || !bytes.Equal(trays[0].Items[0].Payload, []byte("payload")) {
		t.Fatalf("store handed out its own buffers: %s", describe(trays))
	}
}

func testReopen(t *testing.T, h *harness) {
	if h.reopen == nil {
		// Not durable by design (memstore): nothing to check, and the suite never skips.
		return
	}
	s := h.store(t)
	res := commit(t, s, inst1, 7,
		statestore.SetField{Tray: logT, Name: "messages", Value: []byte(`{"x":1}`)},
		statestore.AppendItems{Tray: cmdA, Payloads: payloads("a", "b")},
	)
	commit(t, s, inst1, 7, statestore.MarkApplied{Tray: cmdA, UpTo: res.Seqs[0][0]}, statestore.DeleteTray{Tray: cmdB})
	res2 := commit(t, s, inst2, 3, statestore.AppendItems{Tray: cmdB, Payloads: payloads("c")})
	commit(t, s, inst2, 3, statestore.DeleteTray{Tray: cmdB})
	want := describe(load(t, s, inst1, 7))

	s2 := h.reopen(t, s)
	t.Cleanup(func() { _ = s2.Close() })
	if err := s2.Setup(t.Context()); err != nil {
		t.Fatalf("Setup after reopen: %v", err)
	}
	if g := generation(t, s2, inst1); g != 7 {
		t.Fatalf("generation after reopen = %d, want 7", g)
	}
	if g := generation(t, s2, inst2); g != 3 {
		t.Fatalf("generation of an instance without trays after reopen = %d, want 3", g)
	}
	if err := s2.Fence(t.Context(), inst1, 6); !errors.Is(err, statestore.ErrFenced) {
		t.Fatalf("Fence(6) after reopen: err = %v, want ErrFenced", err)
	}
	if got := describe(load(t, s2, inst1, 7)); got != want {
		t.Fatalf("after reopen:\n got %s\nwant %s", got, want)
	}
	marked, err := s2.ListMarked(t.Context(), statestore.InstanceKey{}, 10)
	if err != nil || !slices.Equal(marked, []statestore.InstanceKey{inst1}) {
		t.Fatalf("ListMarked after reopen = %v, %v", marked, err)
	}
	// The seq counter survived, also for the instance whose tray was deleted.
	next := commit(t, s2, inst2, 3, statestore.AppendItems{Tray: cmdB, Payloads: payloads("d")})
	if next.Seqs[0][0] <= res2.Seqs[0][0] {
		t.Fatalf("seq after reopen %d reuses or precedes %d", next.Seqs[0][0], res2.Seqs[0][0])
	}
}

func testClose(t *testing.T, h *harness) {
	s := h.store(t)
	commit(t, s, inst1, 1, statestore.SetField{Tray: logT, Name: "m", Value: []byte("v")})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := t.Context()
	calls := map[string]error{}
	calls["Setup"] = s.Setup(ctx)
	calls["Fence"] = s.Fence(ctx, inst1, 2)
	_, calls["Load"] = s.Load(ctx, inst1, 2)
	_, calls["Commit"] = s.Commit(ctx, inst1, 2, []statestore.Mutation{statestore.SetField{Tray: logT, Name: "m", Value: []byte("w")}})
	_, calls["ListMarked"] = s.ListMarked(ctx, statestore.InstanceKey{}, 1)
	_, calls["Generation"] = s.Generation(ctx, inst1)
	_, calls["CollectFences"] = s.CollectFences(ctx, 10, nil)
	for name, err := range calls {
		if !errors.Is(err, statestore.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", name, err)
		}
	}
}

// BenchCommit measures Commit of one SetField, the common write of a host persisting its
// state, and reports ops/s. Commits rotate over a few instances so no single row is hot.
func BenchCommit(b *testing.B, s statestore.Store) {
	ctx := context.Background()
	if err := s.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	value := bytes.Repeat([]byte("x"), 256)
	insts := make([]statestore.InstanceKey, 8)
	for i := range insts {
		insts[i] = statestore.InstanceKey{Namespace: "/bench", ID: fmt.Sprint("i", i)}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Commit(ctx, insts[i%len(insts)], 1, []statestore.Mutation{
			statestore.SetField{Tray: logT, Name: "messages", Value: value},
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
