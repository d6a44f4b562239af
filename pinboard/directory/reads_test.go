package directory

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// readDeadline bounds how long a lock-free read may take in these tests: far
// above any real read, far below a hung test.
const readDeadline = 5 * time.Second

// The front door's reads answer while an entry is half applied (held inside
// it by the takeover hook, which runs under the write lock), and they see
// the state before the entry: nothing the entry did is visible until it is
// done.
func TestReadsDoNotWaitForAnApply(t *testing.T) {
	n := fleet(t)
	secret := []byte("cluster-secret")
	n.apply(Init{Secret: secret})
	x := n.apply(claim("x", "a", t0+1)).Placement
	n.apply(Heartbeat{ClientID: "b", SessionID: "sb", Now: t0 + 10_000, TTLMs: ttl, ProbeOK: true})

	paused, resume := make(chan struct{}), make(chan struct{})
	var resumeOnce sync.Once
	release := func() { resumeOnce.Do(func() { close(resume) }) }
	t.Cleanup(release) // a failed read must not leave the apply hung
	n.m.OnTakeover(func(Takeover) {
		close(paused)
		<-resume
	})
	// Past a's lease: c registers, b gets y, then b takes x over from a
	// (the hook holds the entry there).
	later := t0 + ttl + 2
	entry := Batch{Commands: []Command{
		reg("c", "sc", "http://c", later),
		claim("y", "b", later),
		claim("x", "b", later),
	}}
	n.idx++
	applied := make(chan []byte, 1)
	go func(idx uint64) { applied <- n.m.Apply(idx, Encode(entry)) }(n.idx)
	select {
	case <-paused:
	case <-time.After(readDeadline):
		t.Fatal("the entry never reached the takeover")
	}

	type seen struct {
		x      Placement
		xOwner Worker
		xOK    bool
		yOK    bool
		cOK    bool
		a      Worker
		placed Placement
		served bool
		secret []byte
		count  int
	}
	reads := make(chan seen, 1)
	go func() {
		var s seen
		s.x, s.xOwner, s.xOK = n.m.Owner(key("x"))
		_, _, s.yOK = n.m.Owner(key("y"))
		_, s.cOK = n.m.Worker("c")
		s.a, _ = n.m.Worker("a")
		s.placed, _ = n.m.Placement(key("x"))
		s.served = n.m.NamespaceServed(ns)
		s.secret = n.m.Secret()
		s.count = len(n.m.Workers())
		reads <- s
	}()
	var s seen
	select {
	case s = <-reads:
	case <-time.After(readDeadline):
		t.Fatal("reads waited for the apply in progress")
	}
	if !s.xOK || s.x != x || s.placed != x || s.xOwner.ClientID != "a" || s.xOwner.SessionID != "sa" {
		t.Errorf("x mid-entry: %+v owned by %+v (%v), Placement %+v; want a's %+v", s.x, s.xOwner, s.xOK, s.placed, x)
	}
	if s.yOK || s.cOK || s.a.Revoked || s.count != 2 {
		t.Errorf("the entry in progress leaked: y placed %v, c known %v, a revoked %v, %d workers", s.yOK, s.cOK, s.a.Revoked, s.count)
	}
	if !s.served || !bytes.Equal(s.secret, secret) {
		t.Errorf("mid-entry: namespace served %v, secret %q", s.served, s.secret)
	}

	release()
	var out []byte
	select {
	case out = <-applied:
	case <-time.After(readDeadline):
		t.Fatal("the entry never finished")
	}
	r, err := DecodeResult(out)
	if err != nil || len(r.Results) != 3 || r.Results[0].Code != CodeOK || r.Results[1].Code != CodeGranted || r.Results[2].Code != CodeGranted {
		t.Fatalf("entry: %+v, %v", r, err)
	}
	for _, id := range []string{"x", "y"} {
		if p, w, ok := n.m.Owner(key(id)); !ok || p.Owner != "b" || w.SessionID != "sb" {
			t.Errorf("%s after the entry: %+v owned by %+v (%v)", id, p, w, ok)
		}
	}
	if _, ok := n.m.Worker("c"); !ok {
		t.Error("c unknown after the entry")
	}
	if a, _ := n.m.Worker("a"); !a.Revoked {
		t.Error("a's session not revoked after the takeover")
	}
}

// While entries that register a worker and place ids on it in one go are
// applied back to back, Owner never finds a placement without the worker
// record it names: the record is published before the placements.
func TestOwnerNeverSeesAPlacementBeforeItsWorker(t *testing.T) {
	const (
		entries = 200
		perWkr  = 32
	)
	n := newNode(t)
	keyOf := func(i, j int) Key { return Key{Namespace: ns, ID: fmt.Sprint(i, "-", j)} }
	es := make([][]byte, entries)
	for i := range es {
		id := fmt.Sprint("w", i)
		cmds := []Command{reg(id, "s", "http://"+id, t0)}
		for j := range perWkr {
			cmds = append(cmds, claim(fmt.Sprint(i, "-", j), id, t0+1))
		}
		es[i] = Encode(Batch{Commands: cmds})
	}

	var done atomic.Bool
	var bad atomic.Value // the first inconsistency a reader saw
	var wg sync.WaitGroup
	wg.Go(func() {
		for !done.Load() {
			for i := range entries {
				for j := range perWkr {
					p, w, ok := n.m.Owner(keyOf(i, j))
					if ok && (w.ClientID != p.Owner || p.Owner != fmt.Sprint("w", i)) {
						bad.CompareAndSwap(nil, fmt.Sprintf("%+v owned by %+v", p, w))
					}
				}
			}
		}
	})
	for i, e := range es {
		n.idx++
		r, err := DecodeResult(n.m.Apply(n.idx, e))
		if err != nil || r.Results[0].Code != CodeOK || r.Results[perWkr].Code != CodeGranted {
			t.Fatalf("entry %d: %+v %v", i, r, err)
		}
	}
	done.Store(true)
	wg.Wait()
	if b := bad.Load(); b != nil {
		t.Fatalf("Owner: %s", b)
	}
	if _, w, ok := n.m.Owner(keyOf(entries-1, perWkr-1)); !ok || w.ClientID != fmt.Sprint("w", entries-1) {
		t.Fatalf("last placement: %+v (%v)", w, ok)
	}
}

// A restore replaces what the lock-free reads see, the workers and the
// secret as well as the placements.
func TestRestoreReplacesTheReadView(t *testing.T) {
	src := newNode(t)
	src.apply(Init{Secret: []byte("restored")})
	src.apply(reg("r", "sr", "http://r", t0))
	src.apply(claim("x", "r", t0+1))
	snap := src.snapshot()

	dst := fleet(t)
	dst.apply(claim("x", "a", t0+1))
	if err := dst.m.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if p, w, ok := dst.m.Owner(key("x")); !ok || p.Owner != "r" || w.SessionID != "sr" {
		t.Fatalf("x after restore: %+v owned by %+v (%v)", p, w, ok)
	}
	if _, ok := dst.m.Worker("a"); ok {
		t.Fatal("a worker the snapshot does not hold is still read")
	}
	if ws := dst.m.Workers(); len(ws) != 1 || ws[0].ClientID != "r" {
		t.Fatalf("workers after restore: %+v", ws)
	}
	if got := string(dst.m.Secret()); got != "restored" {
		t.Fatalf("secret after restore %q", got)
	}
	if dst.m.NamespaceServed("/nowhere") || !dst.m.NamespaceServed(ns) {
		t.Fatal("NamespaceServed after restore")
	}
}
