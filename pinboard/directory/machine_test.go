package directory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"slices"
	"testing"
)

const t0 = int64(1_700_000_000_000)

// fleet returns a node with workers a and b registered at t0 and the cold
// start already stamped and passed.
func fleet(t *testing.T) *node {
	t.Helper()
	n := newNode(t)
	for _, c := range []Register{reg("a", "sa", "http://a", t0), reg("b", "sb", "http://b", t0)} {
		if r := n.apply(c); r.Code != CodeOK {
			t.Fatalf("register %s: %v %s", c.ClientID, r.Code, r.Reason)
		}
	}
	return n
}

func TestClaimHeldWhileLiveRegrantedAfterLapse(t *testing.T) {
	n := fleet(t)
	r := n.apply(claim("x", "a", t0+1))
	if r.Code != CodeGranted || r.Placement.Owner != "a" || r.Placement.Generation < uint64(t0+1)*1000 {
		t.Fatalf("first claim: %+v", r)
	}
	gen := r.Placement.Generation
	// Retrying the same claim returns the placement, not a new grant.
	if r := n.apply(claim("x", "a", t0+2)); r.Code != CodeExisting || r.Placement.Generation != gen {
		t.Fatalf("retry: %+v", r)
	}
	// b cannot take it while a's lease holds, even at its last millisecond.
	if r := n.apply(claim("x", "b", t0+ttl)); r.Code != CodeHeld || r.Placement.Owner != "a" {
		t.Fatalf("claim by b while a live: %+v", r)
	}
	// b keeps heartbeating, a does not: past a's expiry the id moves.
	n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	r = n.apply(claim("x", "b", t0+ttl+1))
	if r.Code != CodeGranted || r.Placement.Owner != "b" || r.Placement.Generation <= gen {
		t.Fatalf("claim after lapse: %+v", r)
	}
	if got := n.m.PlacementsOf("a"); len(got) != 0 {
		t.Fatalf("a still owns %v", got)
	}
	// a wakes up: its heartbeat is nacked, and re-registering reports x as a duplicate.
	if r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + ttl + 2, TTLMs: ttl, ProbeOK: true}); r.Code != CodeReregister {
		t.Fatalf("late heartbeat: %+v", r)
	}
	r = n.apply(reg("a", "sa2", "http://a", t0+ttl+3, key("x")))
	if r.Code != CodeOK || !slices.Equal(r.Duplicates, []Key{key("x")}) {
		t.Fatalf("re-register: %+v", r)
	}
}

func TestRegisterAdoptsListedPlacements(t *testing.T) {
	n := fleet(t)
	gx := n.apply(claim("x", "a", t0+1)).Placement.Generation
	n.apply(claim("y", "a", t0+1))
	r := n.apply(reg("a", "sa2", "http://a", t0+2, key("x"), key("z")))
	if !slices.Equal(r.Duplicates, []Key{key("z")}) {
		t.Fatalf("duplicates %v", r.Duplicates)
	}
	ps := n.m.PlacementsOf("a")
	if len(ps) != 1 || ps[0].Key != key("x") || ps[0].OwnerSession != "sa2" || ps[0].Generation != gx {
		t.Fatalf("placements after re-register: %+v", ps)
	}
}

func TestReleaseIsCompareAndSet(t *testing.T) {
	n := fleet(t)
	p := n.apply(claim("x", "a", t0+1)).Placement
	if r := n.apply(Release{Key: p.Key, ClientID: "a", Generation: p.Generation + 1}); r.Code != CodeNotFound || r.Placement != p {
		t.Fatalf("wrong generation: %+v", r)
	}
	if r := n.apply(Release{Key: p.Key, ClientID: "b", Generation: p.Generation}); r.Code != CodeNotFound {
		t.Fatalf("wrong owner: %+v", r)
	}
	if r := n.apply(Release{Key: p.Key, ClientID: "a", Generation: p.Generation}); r.Code != CodeOK {
		t.Fatalf("release: %+v", r)
	}
	if _, ok := n.m.Placement(p.Key); ok {
		t.Fatal("placement survived release")
	}
	if r := n.apply(Release{Key: p.Key, ClientID: "a", Generation: p.Generation}); r.Code != CodeNotFound {
		t.Fatalf("retried release: %+v", r)
	}
}

func TestDrainUndrainAndReregister(t *testing.T) {
	n := fleet(t)
	if r := n.apply(DrainWorker{ClientID: "nobody", Cordon: true, Now: t0}); r.Code != CodeUnknownWorker {
		t.Fatalf("drain unknown: %+v", r)
	}
	if r := n.apply(DrainWorker{ClientID: "a", Cordon: true, Now: t0 + 1}); r.Code != CodeOK || !r.Draining {
		t.Fatalf("cordon: %+v", r)
	}
	if r := n.apply(claim("x", "a", t0+2)); r.Code != CodeIneligible || r.Reason != ReasonDraining {
		t.Fatalf("claim on cordoned worker: %+v", r)
	}
	if c := n.m.Candidates(ns, t0+2); len(c) != 1 || c[0].ClientID != "b" {
		t.Fatalf("candidates: %+v", c)
	}
	// The cordon survives a new session of the same client id.
	if r := n.apply(reg("a", "sa2", "http://a", t0+3)); !r.Draining || !r.Drain.Cordon {
		t.Fatalf("re-register lost the cordon: %+v", r)
	}
	if r := n.apply(claim("x", "a", t0+4)); r.Code != CodeIneligible {
		t.Fatalf("claim after re-register: %+v", r)
	}
	n.apply(UndrainWorker{ClientID: "a"})
	if _, ok := n.m.DrainOf("a"); ok {
		t.Fatal("drain record survived undrain")
	}
	if r := n.apply(claim("x", "a", t0+5)); r.Code != CodeGranted {
		t.Fatalf("claim after undrain: %+v", r)
	}
	if r := n.apply(UndrainWorker{ClientID: "nobody"}); r.Code != CodeUnknownWorker {
		t.Fatalf("undrain unknown: %+v", r)
	}
}

// A drain of a node id holds for every worker that node registers: a
// restarted node (a new process, a new client id) comes back drained and
// takes no placements until the node is undrained. A drain of the old
// process's client id would not follow it.
func TestNodeDrainSurvivesRestart(t *testing.T) {
	n := fleet(t) // a on node n-a, b on n-b
	for _, c := range []struct {
		cmd  Command
		want Code
	}{
		{DrainNode{NodeID: "", Cordon: true, Now: t0}, CodeInvalid},
		{DrainNode{NodeID: "n-nobody", Cordon: true, Now: t0}, CodeUnknownWorker},
		{UndrainNode{NodeID: ""}, CodeInvalid},
		{UndrainNode{NodeID: "n-nobody"}, CodeUnknownWorker},
	} {
		if r := n.apply(c.cmd); r.Code != c.want {
			t.Fatalf("%+v: %v, want %v", c.cmd, r.Code, c.want)
		}
	}
	if ds := n.m.Drains(); len(ds) != 0 {
		t.Fatalf("refused commands left drains: %+v", ds)
	}
	if r := n.apply(DrainNode{NodeID: "n-a", Cordon: true, Now: t0 + 1}); r.Code != CodeOK || !r.Draining || r.Drain.NodeID != "n-a" {
		t.Fatalf("cordon n-a: %+v", r)
	}
	if r := n.apply(claim("x", "a", t0+2)); r.Code != CodeIneligible || r.Reason != ReasonDraining {
		t.Fatalf("claim on the cordoned node: %+v", r)
	}
	// The node restarts: its old process deregisters, a new one registers.
	n.apply(Deregister{ClientID: "a", SessionID: "sa"})
	restarted := reg("a2", "sa2", "http://a", t0+3)
	restarted.NodeID = "n-a"
	if r := n.apply(restarted); r.Code != CodeOK || !r.Draining || !r.Drain.Cordon || r.Drain.NodeID != "n-a" {
		t.Fatalf("the restarted node is not told of its cordon: %+v", r)
	}
	if r := n.apply(claim("x", "a2", t0+4)); r.Code != CodeIneligible || r.Reason != ReasonDraining {
		t.Fatalf("claim on the restarted cordoned node: %+v", r)
	}
	w, _ := n.m.Worker("a2")
	if d, ok := n.m.DrainFor(w, t0+4); !ok || d.NodeID != "n-a" {
		t.Fatalf("DrainFor(a2) = %+v, %v", d, ok)
	}
	if c := n.m.Candidates(ns, t0+4); len(c) != 1 || c[0].ClientID != "b" {
		t.Fatalf("candidates: %+v", c)
	}
	// A client-id drain on the new process too: undraining the node
	// clears both, so the node takes placements again.
	n.apply(DrainWorker{ClientID: "a2", Cordon: true, Now: t0 + 5})
	if r := n.apply(UndrainNode{NodeID: "n-a"}); r.Code != CodeOK {
		t.Fatalf("undrain n-a: %+v", r)
	}
	if ds := n.m.Drains(); len(ds) != 0 {
		t.Fatalf("drains after undraining the node: %+v", ds)
	}
	if r := n.apply(claim("x", "a2", t0+6)); r.Code != CodeGranted {
		t.Fatalf("claim after undrain: %+v", r)
	}
	// Undrain of a known node with no drain: nothing to do, ok.
	if r := n.apply(UndrainNode{NodeID: "n-b"}); r.Code != CodeOK {
		t.Fatalf("undrain of an undrained node: %+v", r)
	}
}

// With a drain on both the client id and the node id, the worker is held
// to the stricter: a timed drain's deadline caps the lease over a cordon.
func TestNodeAndClientDrainTheStricterBinds(t *testing.T) {
	n := fleet(t)
	deadline := t0 + 20_000
	n.apply(DrainWorker{ClientID: "a", Cordon: true, Now: t0})
	n.apply(DrainNode{NodeID: "n-a", Deadline: deadline, Now: t0})
	r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 9000, TTLMs: ttl, ProbeOK: true})
	if r.LeaseExpiry != deadline || r.Drain.NodeID != "n-a" || r.Drain.Cordon {
		t.Fatalf("heartbeat under a cordon and a timed node drain: %+v", r)
	}
	n.apply(DrainWorker{ClientID: "a", Deadline: deadline - 5000, Now: t0 + 9500})
	r = n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	if r.Drain.ClientID != "a" || r.Drain.Deadline != deadline-5000 {
		t.Fatalf("the earlier deadline does not bind: %+v", r)
	}
}

// A node upgraded on its data dir restores the version 4, 5 or 6 snapshot
// its old version wrote (no node drains; no clock or unconfirmed workers;
// no hostname-aware records): the same state, written back as 7, its
// clock the latest time the records carry.
func TestRestoreOlderSnapshots(t *testing.T) {
	n := fleet(t)
	n.apply(DrainWorker{ClientID: "a", Cordon: true, Now: t0 + 5})
	v7 := n.snapshot()
	// Version 6 is version 7 without the four (here empty) hostname-aware
	// lists at the end of the body; version 5 is version 6 without the
	// clock and the (here empty) list of unconfirmed workers; version 4 is
	// version 5 without the node drains' count (0 here).
	const hosts = 4
	tail := len(binary.AppendVarint(nil, t0+5)) + 1
	end := len(v7) - 4 - hosts
	if !bytes.Equal(v7[end:len(v7)-4], make([]byte, hosts)) || v7[end-1] != 0 || v7[end-1-tail] != 0 {
		t.Fatalf("snapshot does not end in empty node-drain, unconfirmed and hostname lists: %x", v7[len(v7)-20:])
	}
	for _, old := range []struct {
		v    byte
		trim int
	}{{6, hosts}, {5, hosts + tail}, {4, hosts + tail + 1}} {
		body := append([]byte(nil), v7[:len(v7)-4-old.trim]...)
		body[len(snapshotMagic)] = old.v
		snap := binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crcTable))
		m := New()
		if err := m.Restore(bytes.NewReader(snap)); err != nil {
			t.Fatalf("restore a version %d snapshot: %v", old.v, err)
		}
		if !bytes.Equal(snapshotBytes(t, m), v7) {
			t.Fatalf("the state restored from version %d differs", old.v)
		}
		if old.v == 4 {
			body[len(snapshotMagic)] = 3
			v3 := binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crcTable))
			if err := New().Restore(bytes.NewReader(v3)); !errors.Is(err, ErrVersion) {
				t.Fatalf("restore a version 3 snapshot: %v", err)
			}
		}
	}
}

func TestHeartbeatNeverExtendsPastDrainDeadline(t *testing.T) {
	n := fleet(t)
	deadline := t0 + 20_000
	n.apply(DrainWorker{ClientID: "a", Deadline: deadline, Now: t0 + 1000})
	r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 9000, TTLMs: ttl, ProbeOK: true})
	if r.Code != CodeOK || r.LeaseExpiry != deadline || r.ExpiresInMs != deadline-(t0+9000) || r.Drain.Deadline != deadline {
		t.Fatalf("heartbeat during drain: %+v", r)
	}
	r = n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: deadline, TTLMs: ttl, ProbeOK: true})
	if r.LeaseExpiry != deadline || r.ExpiresInMs != 0 {
		t.Fatalf("heartbeat at deadline: %+v", r)
	}
	if r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: deadline + 1, TTLMs: ttl, ProbeOK: true}); r.Code != CodeReregister {
		t.Fatalf("heartbeat past deadline: %+v", r)
	}
	// A drain whose deadline precedes the lease already granted does not
	// shrink it: the worker was told it holds until then.
	n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	n.apply(DrainWorker{ClientID: "b", Deadline: t0 + 11_000, Now: t0 + 10_500})
	if r := n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_800, TTLMs: ttl, ProbeOK: true}); r.LeaseExpiry != t0+25_000 {
		t.Fatalf("lease moved backwards: %+v", r)
	}
}

func TestTimedDrainExpiresThroughGC(t *testing.T) {
	n := fleet(t)
	deadline := t0 + 30_000
	n.apply(DrainWorker{ClientID: "a", Deadline: deadline, Now: t0})
	n.apply(DrainWorker{ClientID: "b", Cordon: true, Now: t0})
	if r := n.apply(GC{Now: deadline + DrainRetention, WorkerRetentionMs: 100 * DrainRetention}); r.DrainsExpired != 0 {
		t.Fatalf("drain expired too early: %+v", r)
	}
	r := n.apply(GC{Now: deadline + DrainRetention + 1, WorkerRetentionMs: 100 * DrainRetention})
	if r.DrainsExpired != 1 || r.WorkersForgotten != 0 {
		t.Fatalf("gc: %+v", r)
	}
	if _, ok := n.m.DrainOf("a"); ok {
		t.Fatal("timed drain survived GC")
	}
	if d, ok := n.m.DrainOf("b"); !ok || !d.Cordon {
		t.Fatal("cordon did not survive GC")
	}
}

func TestGCForgetsLongLapsedWorkers(t *testing.T) {
	n := fleet(t)
	n.apply(claim("x", "a", t0+1))
	n.apply(reg("b", "sb2", "http://b", t0+DefaultWorkerRetention))
	if r := n.apply(GC{Now: t0 + ttl + DefaultWorkerRetention}); r.WorkersForgotten != 0 {
		t.Fatalf("forgot a worker within retention: %+v", r)
	}
	r := n.apply(GC{Now: t0 + ttl + DefaultWorkerRetention + 1})
	if r.WorkersForgotten != 1 || r.PlacementsDropped != 1 {
		t.Fatalf("gc: %+v", r)
	}
	if _, ok := n.m.Worker("a"); ok {
		t.Fatal("a still known")
	}
	if _, ok := n.m.Worker("b"); !ok {
		t.Fatal("b forgotten")
	}
	if r := n.apply(DrainWorker{ClientID: "a", Cordon: true, Now: t0}); r.Code != CodeUnknownWorker {
		t.Fatalf("drain of forgotten worker: %+v", r)
	}
}

func TestColdStartQuarantine(t *testing.T) {
	n := fleet(t)
	c := Claim{Key: key("x"), ClientID: "a", Now: t0 + 100, QuarantineMs: ttl}
	r := n.apply(c)
	if r.Code != CodeQuarantine || r.RemainingMs != ttl || n.m.ColdStart() != t0+100 {
		t.Fatalf("first attempt: %+v (cold start %d)", r, n.m.ColdStart())
	}
	c.Now = t0 + 5100
	if r := n.apply(c); r.Code != CodeQuarantine || r.RemainingMs != 10_000 {
		t.Fatalf("second attempt: %+v", r)
	}
	if got := n.m.QuarantineMs(t0+5100, ttl); got != 10_000 {
		t.Fatalf("QuarantineMs = %d", got)
	}
	n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	c.Now = t0 + 100 + ttl
	if r := n.apply(c); r.Code != CodeGranted {
		t.Fatalf("after quarantine: %+v", r)
	}
}

func TestHeartbeatStaleSessionAndDegraded(t *testing.T) {
	n := fleet(t)
	n.apply(reg("a", "sa2", "http://a", t0+1))
	if r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 2, TTLMs: ttl, ProbeOK: true}); r.Code != CodeReregister {
		t.Fatalf("stale session: %+v", r)
	}
	if r := n.apply(Heartbeat{ClientID: "zz", SessionID: "s", Now: t0 + 2, TTLMs: ttl, ProbeOK: true}); r.Code != CodeReregister {
		t.Fatalf("unknown client: %+v", r)
	}
	r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa2", Now: t0 + 3000, TTLMs: ttl, ProbeOK: false})
	if r.Code != CodeOK || !r.Degraded || r.LeaseExpiry != t0+3000+ttl {
		t.Fatalf("degraded heartbeat: %+v", r)
	}
	if r := n.apply(claim("x", "a", t0+3001)); r.Code != CodeIneligible || r.Reason != ReasonDegraded {
		t.Fatalf("claim on degraded worker: %+v", r)
	}
	n.apply(Heartbeat{ClientID: "a", SessionID: "sa2", Now: t0 + 6000, TTLMs: ttl, ProbeOK: true})
	if r := n.apply(claim("x", "a", t0+6001)); r.Code != CodeGranted {
		t.Fatalf("claim after probe passed: %+v", r)
	}
}

func TestDuplicateAdvertiseURL(t *testing.T) {
	n := fleet(t)
	if r := n.apply(reg("c", "sc", "http://a", t0+1)); r.Code != CodeDuplicateAdvertise {
		t.Fatalf("shared URL with live worker: %+v", r)
	}
	n.apply(claim("x", "a", t0+2))
	// Once a's lease lapsed, a new process on that URL takes over and a is forgotten.
	if r := n.apply(reg("c", "sc", "http://a", t0+ttl+1)); r.Code != CodeOK {
		t.Fatalf("takeover: %+v", r)
	}
	if _, ok := n.m.Worker("a"); ok {
		t.Fatal("old worker still known")
	}
	if _, ok := n.m.Placement(key("x")); ok {
		t.Fatal("old worker's placement survived")
	}
}

func TestDeregisterDropsPlacementsKeepsDrain(t *testing.T) {
	n := fleet(t)
	n.apply(claim("x", "a", t0+1))
	n.apply(DrainWorker{ClientID: "a", Deadline: t0 + 60_000, Now: t0 + 2})
	if r := n.apply(Deregister{ClientID: "a", SessionID: "sa"}); r.Code != CodeOK {
		t.Fatalf("deregister: %+v", r)
	}
	if r := n.apply(Deregister{ClientID: "a", SessionID: "sa"}); r.Code != CodeNotFound {
		t.Fatalf("retried deregister: %+v", r)
	}
	if len(n.m.PlacementsOf("a")) != 0 {
		t.Fatal("placements survived deregister")
	}
	if w, ok := n.m.Worker("a"); !ok || w.Live(t0+3) {
		t.Fatalf("worker after deregister: %+v %v", w, ok)
	}
	if _, ok := n.m.DrainOf("a"); !ok {
		t.Fatal("drain dropped by deregister")
	}
	// b may take x at once: a left voluntarily.
	if r := n.apply(claim("x", "b", t0+4)); r.Code != CodeGranted {
		t.Fatalf("claim after deregister: %+v", r)
	}
}

func TestUnknownCommands(t *testing.T) {
	n := fleet(t)
	before := n.snapshot()
	skip := n.apply(Opaque{Code: 99, Ignorable: true, Payload: []byte{1, 2, 3}})
	if skip.Code != CodeUnknownCommand {
		t.Fatalf("ignorable: %+v", skip)
	}
	fail := n.apply(Opaque{Code: 99, Payload: []byte{1, 2, 3}})
	if fail.Code != CodeError {
		t.Fatalf("non-ignorable: %+v", fail)
	}
	// A newer format version: the same rule on the type byte.
	if r, _ := DecodeResult(n.m.Apply(100, []byte{FormatVersion + 1, byte(TypeClaim) | IgnorableFlag, 7})); r.Code != CodeUnknownCommand {
		t.Fatalf("newer version, ignorable: %+v", r)
	}
	if r, _ := DecodeResult(n.m.Apply(101, []byte{FormatVersion + 1, byte(TypeClaim), 7})); r.Code != CodeError {
		t.Fatalf("newer version: %+v", r)
	}
	if r, _ := DecodeResult(n.m.Apply(102, []byte{FormatVersion, byte(TypeClaim), 7})); r.Code != CodeError {
		t.Fatalf("truncated claim: %+v", r)
	}
	// Nothing changed but the applied index.
	after := n.snapshot()
	if bytes.Equal(before, after) {
		t.Fatal("applied index did not move")
	}
	m := New()
	if err := m.Restore(bytes.NewReader(after)); err != nil || m.AppliedIndex() != 102 {
		t.Fatalf("restore: %v, index %d", err, m.AppliedIndex())
	}
	// Stale index: refused without effect.
	if r, _ := DecodeResult(n.m.Apply(50, Encode(claim("x", "a", t0+1)))); r.Code != CodeError {
		t.Fatalf("stale index: %+v", r)
	}
	if _, ok := n.m.Placement(key("x")); ok {
		t.Fatal("stale index applied")
	}
}

func TestBatchGrantsKeyOnce(t *testing.T) {
	n := fleet(t)
	b := Batch{Commands: []Command{
		claim("x", "a", t0+1),
		claim("x", "a", t0+1), // the retry inside the entry: existing
		claim("x", "b", t0+1), // held
		claim("y", "b", t0+1),
		Release{Key: key("y"), ClientID: "b", Generation: uint64(t0+1)*1000 + 1}, // y's: the one after x's
		claim("y", "a", t0+1), // granted and released in this entry: conflict
	}}
	r := n.apply(b)
	want := []Code{CodeGranted, CodeExisting, CodeHeld, CodeGranted, CodeOK, CodeConflict}
	if len(r.Results) != len(want) {
		t.Fatalf("results: %+v", r)
	}
	for i, c := range want {
		if r.Results[i].Code != c {
			t.Fatalf("command %d: %v, want %v (%s)", i, r.Results[i].Code, c, r.Results[i].Reason)
		}
	}
	if r := n.apply(claim("y", "a", t0+2)); r.Code != CodeGranted {
		t.Fatalf("claim in the next entry: %+v", r)
	}
	// Stamped past a's lease, a later claim in the same entry still finds
	// w granted in it: the id does not flip from a to b within one entry.
	n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	lapse := Batch{Commands: []Command{
		claim("w", "a", t0+3),
		claim("w", "b", t0+ttl+5),
	}}
	if r := n.apply(lapse); r.Results[0].Code != CodeGranted || r.Results[1].Code != CodeConflict {
		t.Fatalf("claim of an id granted earlier in the entry to a lapsed holder: %+v", r.Results)
	}
	// Batches do not nest: the encoded entry is refused whole, and a nested
	// batch that reached the appliers anyway would fail alone.
	nested := Batch{Commands: []Command{claim("z", "a", t0+3), Batch{}}}
	if r := n.apply(nested); r.Code != CodeError {
		t.Fatalf("nested batch entry: %+v", r)
	}
	n.idx++
	n.m.mu.Lock()
	r = n.m.applyLocked(n.idx, nested, nil)
	n.m.mu.Unlock()
	if r.Results[0].Code != CodeGranted || r.Results[1].Code != CodeError {
		t.Fatalf("nested batch command: %+v", r)
	}
}

func TestInitSetsSecretOnce(t *testing.T) {
	n := newNode(t)
	if r := n.apply(Init{Secret: []byte("s1")}); r.Code != CodeOK {
		t.Fatalf("init: %+v", r)
	}
	if r := n.apply(Init{Secret: []byte("s2")}); r.Code != CodeExisting {
		t.Fatalf("second init: %+v", r)
	}
	if got := string(n.m.Secret()); got != "s1" {
		t.Fatalf("secret %q", got)
	}
}

// The secret as recorded may be sealed: Secret is what the opener makes of
// it, opened once; a snapshot keeps the recorded form, and a restore opens
// it again.
func TestSecretOpenedFromWhatWasRecorded(t *testing.T) {
	opened := 0
	open := func(recorded []byte) ([]byte, bool) {
		opened++
		plain, ok := bytes.CutPrefix(recorded, []byte("sealed:"))
		if !ok {
			return nil, false
		}
		return plain, false
	}
	n := newNode(t)
	n.m.SetSecretOpener(open)
	if r := n.apply(Init{Secret: []byte("sealed:s1")}); r.Code != CodeOK {
		t.Fatalf("init: %+v", r)
	}
	n.apply(reg("a", "sa", "http://a", t0))
	if got := string(n.m.Secret()); got != "s1" || opened != 1 {
		t.Fatalf("secret %q, opened %d times", got, opened)
	}
	var snap bytes.Buffer
	wt, err := n.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wt.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(snap.Bytes(), []byte("sealed:s1")) {
		t.Fatal("the snapshot does not hold the secret as recorded")
	}
	back := New()
	back.SetSecretOpener(open)
	if err := back.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	if got := string(back.Secret()); got != "s1" {
		t.Fatalf("restored secret %q", got)
	}
}

// A secret sealed under a token being rotated out opens stale; Reseal
// records it sealed anew (the same secret), and a replay of the log opens
// only what the reseal left, never the entries it replaced. A Reseal with
// no secret recorded changes nothing.
func TestResealReplacesTheRecordedSecret(t *testing.T) {
	var tried []string
	open := func(recorded []byte) ([]byte, bool) {
		tried = append(tried, string(recorded))
		if plain, ok := bytes.CutPrefix(recorded, []byte("new:")); ok {
			return plain, false
		}
		if plain, ok := bytes.CutPrefix(recorded, []byte("old:")); ok {
			return plain, true
		}
		return nil, false
	}
	n := newNode(t)
	n.m.SetSecretOpener(open)
	if r := n.apply(Reseal{Secret: []byte("new:s1")}); r.Code != CodeInvalid || n.m.Secret() != nil {
		t.Fatalf("reseal before init: %+v", r)
	}
	n.apply(Init{Secret: []byte("old:s1")})
	if got := string(n.m.Secret()); got != "s1" || !n.m.SecretStale() {
		t.Fatalf("secret %q, stale %v", got, n.m.SecretStale())
	}
	n.apply(Reseal{Secret: []byte("new:s1")})
	if got := string(n.m.Secret()); got != "s1" || n.m.SecretStale() {
		t.Fatalf("after reseal: secret %q, stale %v", got, n.m.SecretStale())
	}

	// Replayed: the two entries apply before anything reads the secret.
	tried = nil
	replay := newNode(t)
	replay.m.SetSecretOpener(open)
	for _, c := range []Command{Init{Secret: []byte("old:s1")}, Reseal{Secret: []byte("new:s1")}} {
		if r := replay.apply(c); r.Code != CodeOK {
			t.Fatalf("replay %T: %+v", c, r)
		}
	}
	if got := string(replay.m.Secret()); got != "s1" || !slices.Equal(tried, []string{"new:s1"}) {
		t.Fatalf("replayed: secret %q, opened %q", got, tried)
	}
}

// Reads share the directory's slices (Worker.Namespaces, Secret) instead
// of copying them per call, which is safe only if the directory never
// modifies a slice it handed out: a re-registration replaces it.
func TestReadsShareSlicesTheDirectoryNeverModifies(t *testing.T) {
	n := fleet(t)
	w, _ := n.m.Worker("a")
	held := slices.Clone(w.Namespaces)
	again := reg("a", "sa2", "http://a", t0+1)
	again.Namespaces = []string{"/other", "/more"}
	if r := n.apply(again); r.Code != CodeOK {
		t.Fatalf("re-register: %v %s", r.Code, r.Reason)
	}
	if !slices.Equal(w.Namespaces, held) {
		t.Fatalf("a re-registration modified a slice handed out earlier: %q, was %q", w.Namespaces, held)
	}
	if w2, _ := n.m.Worker("a"); !slices.Equal(w2.Namespaces, again.Namespaces) {
		t.Fatalf("namespaces after re-registration: %q", w2.Namespaces)
	}
}

func TestRestoreRejectsCorruptSnapshot(t *testing.T) {
	n := fleet(t)
	snap := n.snapshot()
	snap[len(snap)/2] ^= 0xff
	m := fleet(t).m
	if err := m.Restore(bytes.NewReader(snap)); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("corrupt snapshot: %v", err)
	}
	if _, ok := m.Worker("a"); !ok {
		t.Fatal("failed restore changed the state")
	}
}

func TestCommandRoundTrip(t *testing.T) {
	cmds := []Command{
		Init{Secret: []byte{1, 2}},
		Reseal{Secret: []byte{3, 4}},
		reg("a", "s", "http://a", t0, key("x"), Key{Env: "e", Namespace: "/n", ID: "i"}),
		Heartbeat{ClientID: "a", SessionID: "s", Now: -5, TTLMs: ttl, Headroom: -1, ProbeOK: true},
		Deregister{ClientID: "a", SessionID: "s"},
		Claim{Key: key("x"), ClientID: "a", Now: t0, QuarantineMs: ttl},
		Release{Key: key("x"), ClientID: "a", Generation: 1 << 40},
		DrainWorker{ClientID: "a", Deadline: t0, Now: t0},
		UndrainWorker{ClientID: "a"},
		DrainNode{NodeID: "n1", Deadline: t0, Cordon: false, Now: t0},
		DrainNode{NodeID: "n1", Cordon: true, Now: -1},
		UndrainNode{NodeID: "n1"},
		GC{Now: t0, WorkerRetentionMs: 5},
		Batch{Commands: []Command{claim(string(make([]byte, 300)), "a", 1), Opaque{Code: 70, Ignorable: true, Payload: []byte{9}}}},
		regRoutes("a", "s", t0, route(pr41, "e", 7), Route{Hostname: pr42, Namespace: "/n", Env: "f", Takeover: TakeoverDeny}),
		Batch{Commands: []Command{claimVia(pr41, "e", "x", "a", t0)}},
	}
	for _, c := range cmds {
		b := Encode(c)
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		if !bytes.Equal(Encode(got), b) || !reflect.DeepEqual(got, c) {
			t.Fatalf("%T: round trip changed it: %+v", c, got)
		}
	}
	// Results carry a placement's hostname and fence, and superseded routes.
	r := Result{Code: CodeTakeover, Placement: Placement{Key: key("x"), Owner: "a", Generation: 9, Hostname: pr41, FenceUntil: t0},
		Superseded: []Route{{Hostname: pr42, Namespace: "/n", Env: "e", Epoch: 2, Superseded: true}}}
	if got, err := DecodeResult(EncodeResult(r)); err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("result round trip: %+v, %v", got, err)
	}
}

// A new leader's RenewLeases forgives the leaderless gap: a lease live when
// the former leader last committed runs a fresh TTL (so ids stay with
// their owners and heartbeats after the gap are accepted), one that had
// lapsed under a working leader stays lapsed, and the former leader's node
// gets no renewal and no new placements until it is heard from.
func TestRenewLeasesForgivesTheLeaderlessGap(t *testing.T) {
	n := fleet(t) // a on n-a, b on n-b, leases to t0+ttl
	if r := n.apply(reg("c", "sc", "http://c", t0)); r.Code != CodeOK {
		t.Fatalf("register c: %+v", r)
	}
	for _, id := range []string{"a", "b"} {
		n.apply(Heartbeat{ClientID: id, SessionID: "s" + id, Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})
	}
	if r := n.apply(claim("x", "a", t0+20_000)); r.Code != CodeGranted {
		t.Fatalf("claim x: %+v", r)
	}
	// c lapsed at t0+ttl while the leader was there (clock t0+20s). The
	// leader dies; a new one takes over at t0+26s, past a's and b's leases.
	if r := n.apply(RenewLeases{Now: t0 + 26_000, TTLMs: ttl, FormerLeader: "n-b"}); r.Code != CodeOK {
		t.Fatalf("renew: %+v", r)
	}
	a, _ := n.m.Worker("a")
	b, _ := n.m.Worker("b")
	c, _ := n.m.Worker("c")
	switch {
	case a.LeaseExpiry != t0+26_000+ttl || a.Unconfirmed:
		t.Fatalf("a not renewed: %+v", a)
	case b.LeaseExpiry != t0+25_000 || !b.Unconfirmed:
		t.Fatalf("the former leader's worker renewed or confirmed: %+v", b)
	case c.LeaseExpiry != t0+ttl || c.Unconfirmed:
		t.Fatalf("a worker lapsed before the election revived: %+v", c)
	}
	if r := n.apply(claim("x", "c", t0+30_000)); r.Code != CodeHeld || r.Placement.Owner != "a" {
		t.Fatalf("x taken from a, whose lease lapsed only for want of a leader: %+v", r)
	}
	if r := n.apply(Heartbeat{ClientID: "a", SessionID: "sa", Now: t0 + 30_000, TTLMs: ttl, ProbeOK: true}); r.Code != CodeOK {
		t.Fatalf("a's heartbeat after the gap: %+v", r)
	}
	if r := n.apply(claim("y", "b", t0+24_000)); r.Code != CodeIneligible || r.Reason != ReasonUnconfirmed {
		t.Fatalf("the former leader's worker took a new id: %+v", r)
	}
	if got := n.m.Candidates(ns, t0+24_000); len(got) != 1 || got[0].ClientID != "a" {
		t.Fatalf("candidates %+v, want a only", got)
	}
	// Heard from again, b takes placements.
	if r := n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 24_500, TTLMs: ttl, ProbeOK: true}); r.Code != CodeOK {
		t.Fatalf("b's heartbeat: %+v", r)
	}
	if r := n.apply(claim("y", "b", t0+25_000)); r.Code != CodeGranted {
		t.Fatalf("b after its heartbeat: %+v", r)
	}
	if r := n.apply(RenewLeases{Now: t0 + 25_000}); r.Code != CodeInvalid {
		t.Fatalf("renew without a TTL: %+v", r)
	}
	// A node that does not know the command skips it.
	if b := Encode(RenewLeases{Now: t0, TTLMs: ttl}); b[1] != byte(TypeRenewLeases)|IgnorableFlag {
		t.Fatalf("RenewLeases is encoded with type byte %#x, want it ignorable", b[1])
	}
}
