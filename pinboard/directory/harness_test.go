package directory

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// node drives a Machine the way raftstore does: encoded commands at
// increasing indexes, results decoded from bytes.
type node struct {
	tb  testing.TB
	m   *Machine
	idx uint64
}

func newNode(tb testing.TB) *node { return &node{tb: tb, m: New()} }

func (n *node) apply(c Command) Result {
	n.tb.Helper()
	n.idx++
	r, err := DecodeResult(n.m.Apply(n.idx, Encode(c)))
	if err != nil {
		n.tb.Fatalf("decode result of %T: %v", c, err)
	}
	return r
}

func (n *node) snapshot() []byte {
	n.tb.Helper()
	return snapshotBytes(n.tb, n.m)
}

func snapshotBytes(tb testing.TB, m *Machine) []byte {
	tb.Helper()
	s, err := m.Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := s.WriteTo(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

const ttl = 15_000

var ns = "/counters"

func key(id string) Key { return Key{Namespace: ns, ID: id} }

func reg(client, session, url string, now int64, live ...Key) Register {
	return Register{ClientID: client, SessionID: session, NodeID: "n-" + client, AdvertiseURL: url,
		Namespaces: []string{ns, "/tickers"}, Headroom: 1024, TTLMs: ttl, Now: now, LiveIDs: live}
}

func claim(id, client string, now int64) Claim {
	return Claim{Key: key(id), ClientID: client, Now: now}
}

// source hands out choices: from fuzz bytes (zero once they run out) or
// from a seeded generator.
type source struct {
	data []byte
	rng  *rand.Rand
}

func (s *source) byte() byte {
	if s.rng != nil {
		return byte(s.rng.Uint32())
	}
	if len(s.data) == 0 {
		return 0
	}
	b := s.data[0]
	s.data = s.data[1:]
	return b
}

func (s *source) exhausted() bool { return s.rng == nil && len(s.data) == 0 }

func (s *source) pick(n int) int { return int(s.byte()) % n }

// gen produces commands over a small world (4 clients, 3 sessions each,
// 3 URLs, 2 namespaces, 6 ids, 2 envs) so that collisions are common. Time
// never goes backwards: the lease guarantees assume clocks that agree within
// the lease buffer.
type gen struct {
	s    *source
	now  int64
	gens []Release // recent grants, to release with a matching generation
}

var (
	genClients = []string{"c0", "c1", "c2", "c3"}
	genNS      = []string{"/a", "/b"}
)

func (g *gen) key() Key {
	return Key{Env: []string{"", "pr-1"}[g.s.pick(2)], Namespace: genNS[g.s.pick(2)], ID: fmt.Sprint(g.s.pick(6))}
}

func (g *gen) client() string  { return genClients[g.s.pick(len(genClients))] }
func (g *gen) session() string { return fmt.Sprint("s", g.s.pick(3)) }

func (g *gen) tick() int64 {
	g.now += int64(g.s.pick(8)) * 1000
	return g.now
}

func (g *gen) command(inBatch bool) Command {
	switch op := g.s.pick(16); op {
	case 0:
		return Init{Secret: []byte{g.s.byte(), 1}}
	case 1, 2:
		var live []Key
		for range g.s.pick(4) {
			live = append(live, g.key())
		}
		nss := genNS[:1+g.s.pick(2)]
		return Register{ClientID: g.client(), SessionID: g.session(), NodeID: "n",
			AdvertiseURL: fmt.Sprint("http://u", g.s.pick(3)), Namespaces: nss,
			Headroom: int64(g.s.pick(4)), TTLMs: ttl, Now: g.tick(), LiveIDs: live}
	case 3, 4:
		return Heartbeat{ClientID: g.client(), SessionID: g.session(), Now: g.tick(),
			TTLMs: ttl, Headroom: int64(g.s.pick(4)), ProbeOK: g.s.pick(5) != 0}
	case 5:
		return Deregister{ClientID: g.client(), SessionID: g.session()}
	case 6, 7, 8:
		return Claim{Key: g.key(), ClientID: g.client(), Now: g.tick(), QuarantineMs: int64(g.s.pick(2)) * ttl}
	case 9:
		if len(g.gens) > 0 && g.s.pick(4) != 0 {
			return g.gens[g.s.pick(len(g.gens))]
		}
		return Release{Key: g.key(), ClientID: g.client(), Generation: uint64(g.s.pick(50))}
	case 10:
		now := g.tick()
		return DrainWorker{ClientID: g.client(), Deadline: now + int64(g.s.pick(40))*1000, Cordon: g.s.pick(3) == 0, Now: now}
	case 11:
		return UndrainWorker{ClientID: g.client()}
	case 12:
		now := g.tick()
		if g.s.pick(4) == 0 {
			now += DrainRetention + int64(g.s.pick(3))*DefaultWorkerRetention
			g.now = now
		}
		return GC{Now: now, WorkerRetentionMs: int64(g.s.pick(2)) * 60_000}
	case 13:
		return Opaque{Code: CommandType(40 + g.s.pick(3)), Ignorable: g.s.pick(2) == 0, Payload: []byte{g.s.byte()}}
	default:
		if inBatch {
			return Claim{Key: g.key(), ClientID: g.client(), Now: g.now}
		}
		b := Batch{}
		for range 1 + g.s.pick(8) {
			b.Commands = append(b.Commands, g.command(true))
		}
		return b
	}
}

// checker is an independent model of what workers were told. It flags a
// grant of a key while the previous holder may still believe it owns it,
// and generations that fail to increase per key.
type checker struct {
	tb      testing.TB
	ackExp  map[string]int64 // client -> latest lease expiry acknowledged to it
	holder  map[Key]Placement
	lastGen map[Key]uint64
	maxGen  uint64 // generations strictly increase across all keys
	// clock is the latest Now seen. The lease guarantee assumes time does not
	// go backwards; a corrupted entry can break that, and the checks that
	// depend on it are skipped for commands dated before clock.
	clock int64
}

// nowOf returns the time a command carries, 0 if none.
func nowOf(c Command) int64 {
	switch c := c.(type) {
	case Register:
		return c.Now
	case Heartbeat:
		return c.Now
	case Claim:
		return c.Now
	case DrainWorker:
		return c.Now
	case GC:
		return c.Now
	case Batch:
		var t int64
		for _, sub := range c.Commands {
			t = max(t, nowOf(sub))
		}
		return t
	}
	return 0
}

func newChecker(tb testing.TB) *checker {
	return &checker{tb: tb, ackExp: map[string]int64{}, holder: map[Key]Placement{}, lastGen: map[Key]uint64{}}
}

func (c *checker) observe(index uint64, cmd Command, r Result) {
	c.tb.Helper()
	inOrder := nowOf(cmd) >= c.clock
	c.clock = max(c.clock, nowOf(cmd))
	switch cmd := cmd.(type) {
	case Batch:
		if r.Code != CodeOK || len(r.Results) != len(cmd.Commands) {
			c.tb.Fatalf("batch result %v with %d results for %d commands", r.Code, len(r.Results), len(cmd.Commands))
		}
		for i, sub := range cmd.Commands {
			c.observe(index, sub, r.Results[i])
		}
	case Register:
		if r.Code != CodeOK {
			return
		}
		c.ackExp[cmd.ClientID] = max(c.ackExp[cmd.ClientID], r.LeaseExpiry)
		listed := map[Key]bool{}
		for _, k := range cmd.LiveIDs {
			listed[k] = true
		}
		for _, k := range r.Duplicates {
			listed[k] = false
		}
		// The process runs what it listed (minus what it was told to quit);
		// its new lease says nothing about ids it did not list.
		for k, p := range c.holder {
			if p.Owner == cmd.ClientID {
				if listed[k] {
					p.OwnerSession = cmd.SessionID
					c.holder[k] = p
				} else {
					delete(c.holder, k)
				}
			}
		}
	case Heartbeat:
		if r.Code == CodeOK {
			// A renewal gives at most one TTL, unless the worker already held
			// a later expiry (leases never move backwards).
			if prev := c.ackExp[cmd.ClientID]; r.LeaseExpiry > max(prev, cmd.Now+cmd.TTLMs) {
				c.tb.Fatalf("heartbeat at %d granted %d ms, over the TTL", cmd.Now, r.LeaseExpiry-cmd.Now)
			}
			c.ackExp[cmd.ClientID] = max(c.ackExp[cmd.ClientID], r.LeaseExpiry)
		}
	case Deregister:
		if r.Code == CodeOK {
			for k, p := range c.holder {
				if p.Owner == cmd.ClientID {
					delete(c.holder, k)
				}
			}
		}
	case Release:
		if r.Code == CodeOK {
			delete(c.holder, cmd.Key)
		}
	case Claim:
		if r.Code != CodeGranted {
			return
		}
		p := r.Placement
		if p.Key != cmd.Key || p.Owner != cmd.ClientID || (cmd.Now > 0 && p.Generation < uint64(cmd.Now)*1000) || p.Generation <= c.maxGen {
			c.tb.Fatalf("grant %+v for claim %+v at index %d (newest generation so far %d)", p, cmd, index, c.maxGen)
		}
		c.maxGen = p.Generation
		if last := c.lastGen[p.Key]; p.Generation <= last {
			c.tb.Fatalf("key %v granted generation %d after %d", p.Key, p.Generation, last)
		}
		c.lastGen[p.Key] = p.Generation
		if prev, ok := c.holder[p.Key]; ok && inOrder && prev.Owner != p.Owner && cmd.Now <= c.ackExp[prev.Owner] {
			c.tb.Fatalf("key %v granted to %s at %d while %s holds it until %d",
				p.Key, p.Owner, cmd.Now, prev.Owner, c.ackExp[prev.Owner])
		}
		c.holder[p.Key] = p
	}
}
