package directory

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
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
// 3 URLs, 2 namespaces, 6 ids, 2 envs) so that collisions are common. Its
// clock (now) never goes backwards, but a command may be stamped up to
// maxSkew before it: a heartbeat queued through a partition, a proposer
// whose clock lags. The lease guarantees assume exactly that much: clocks
// that agree within less than a TTL.
type gen struct {
	s    *source
	now  int64
	gens []Release // recent grants, to release with a matching generation
	// sessions is the session each client last registered, so that most
	// heartbeats renew a live session rather than miss.
	sessions map[string]string
	// A partition cuts one client off until healAt: its heartbeats queue in
	// late, and arrive after it heals if they are within maxSkew of their
	// stamp (else they are lost). Meanwhile its lease may lapse and its
	// ids move: the late heartbeats must not revive it.
	// seen is when the generator last renewed each client (register or
	// heartbeat): claims mostly name one renewed lately, as a proposer
	// picks its candidate among the live workers.
	seen map[string]int64

	partitioned string
	healAt      int64
	late        []Heartbeat
}

var (
	genClients = []string{"c0", "c1", "c2", "c3"}
	genNS      = []string{"/a", "/b"}
	genNodes   = []string{"n0", "n1"}
	genHosts   = []string{"h1.test", "h2.test"}
	genEnvs    = []string{"e1", "e2"}
)

// routes is a hostname-aware registration's routes: one or two, with an
// epoch that now and then displaces; rarely invalid.
func (g *gen) routes() []Route {
	var rs []Route
	h, n := g.s.pick(2), g.s.pick(2)
	for i := range 1 + g.s.pick(2) {
		// Each env mostly keeps one policy (e1 winds down, e2 denies), so
		// that takeovers happen; a flip now and then disagrees.
		e := g.s.pick(2)
		t := TakeoverPolicy(e)
		if g.s.pick(8) == 0 {
			t = 1 - t
		}
		rs = append(rs, Route{Hostname: genHosts[(h+i)%2], Namespace: genNS[n],
			Env: genEnvs[e], Takeover: t, Epoch: uint64(g.s.pick(4))})
	}
	switch g.s.pick(24) {
	case 0:
		rs[0].Env = ""
	case 1:
		rs[0].Superseded = true
	case 2:
		rs[0].Takeover = 2
	}
	return rs
}

// routeClaim is a claim through a hostname; its env is the one the
// binding most likely names (a proposer that read a stale one, else).
func (g *gen) routeClaim(now int64) ClaimRoute {
	k := g.claimKey()
	k.Env = genEnvs[g.s.pick(2)]
	var routed []Key
	for _, r := range g.gens {
		if r.Key.Env != "" && r.Key.Env != "pr-1" {
			routed = append(routed, r.Key)
		}
	}
	if len(routed) > 0 && g.s.pick(2) == 0 {
		// An id placed through some hostname, asked for through either:
		// the other one meets the env's takeover.
		k = routed[g.s.pick(len(routed))]
	}
	c := ClaimRoute{Claim: Claim{Key: k, ClientID: g.candidate(), Now: now, QuarantineMs: int64(g.s.pick(2)) * ttl},
		Hostname: genHosts[g.s.pick(2)], TTLMs: ttl}
	if g.s.pick(24) == 0 {
		c.TTLMs = 0 // bad input
	}
	return c
}

// claimKey is the key a claim asks for: during a partition, often one
// the cut-off client was granted (requests for its ids land elsewhere).
func (g *gen) claimKey() Key {
	if g.partitioned != "" && g.s.pick(2) == 0 {
		var mine []Key
		for _, r := range g.gens {
			if r.ClientID == g.partitioned {
				mine = append(mine, r.Key)
			}
		}
		if len(mine) > 0 {
			return mine[g.s.pick(len(mine))]
		}
	}
	return g.key()
}

func (g *gen) key() Key {
	return Key{Env: []string{"", "", "", "pr-1"}[g.s.pick(4)], Namespace: genNS[g.s.pick(2)], ID: fmt.Sprint(g.s.pick(5))}
}

func (g *gen) client() string { return genClients[g.s.pick(len(genClients))] }

// node is the node id a client registers with: two clients per node (a
// node restarted under a new client id), sometimes another one or none.
func (g *gen) node(client string) string {
	switch g.s.pick(8) {
	case 0:
		return ""
	case 1:
		return g.nodeID()
	}
	return genNodes[slices.Index(genClients, client)%2]
}

func (g *gen) nodeID() string {
	return append(genNodes, "n9")[g.s.pick(3)] // n9: a node id no worker has
}
func (g *gen) session() string { return fmt.Sprint("s", g.s.pick(3)) }

// url is mostly client's own advertise URL, sometimes one another client
// may hold (a process restarted under a new client id).
func (g *gen) url(client string) string {
	if g.s.pick(4) != 0 {
		return "http://" + client
	}
	return fmt.Sprint("http://u", g.s.pick(2))
}

// candidate is the client a claim names: mostly one renewed lately.
func (g *gen) candidate() string {
	var live []string
	for _, c := range genClients {
		if t, ok := g.seen[c]; ok && t >= g.now-ttl/2 && c != g.partitioned {
			live = append(live, c)
		}
	}
	if len(live) == 0 || g.s.pick(4) == 0 {
		return g.client()
	}
	return live[g.s.pick(len(live))]
}

func (g *gen) renewed(client string, at int64) {
	if g.seen == nil {
		g.seen = map[string]int64{}
	}
	g.seen[client] = max(g.seen[client], at)
}

// sessionOf is client's last registered session, or (one in four, or
// before any) a random one.
func (g *gen) sessionOf(client string) string {
	if s, ok := g.sessions[client]; ok && g.s.pick(4) != 0 {
		return s
	}
	return g.session()
}

func (g *gen) tick() int64 {
	g.now += int64(g.s.pick(6)) * 500
	return g.now
}

// maxSkew bounds how long before its delivery a command may be stamped:
// well under the TTL, as the lease guarantee requires.
const maxSkew = 12_000

// stamp advances the clock and returns the Now of a command delivered at
// it: one in four is stamped early, by up to maxSkew (a lagging clock).
func (g *gen) stamp() int64 {
	now := g.tick()
	if g.s.pick(4) == 0 {
		now -= int64(g.s.pick(maxSkew/1000+1)) * 1000
	}
	return now
}

func (g *gen) command(inBatch bool) Command {
	if !inBatch && g.partitioned != "" && g.now >= g.healAt {
		for len(g.late) > 0 {
			hb := g.late[0]
			g.late = g.late[1:]
			if hb.Now >= g.now-maxSkew {
				return hb
			}
		}
		g.partitioned = ""
	}
	if !inBatch && g.partitioned == "" && g.s.pick(10) == 0 {
		// Cut off a client whose lease is about to lapse, and heal soon
		// after it did: the heartbeat in flight when the link went down
		// was stamped while the lease held and arrives once others may
		// have taken its ids.
		c := g.client()
		if seen, ok := g.seen[c]; ok && seen+ttl >= g.now {
			g.partitioned = c
			g.healAt = min(g.now+maxSkew, seen+ttl+1_000+int64(g.s.pick(4))*1000)
			g.late = append(g.late[:0], Heartbeat{ClientID: c, SessionID: g.sessionOf(c),
				Now: g.now, TTLMs: ttl, Headroom: 1, ProbeOK: true})
		}
	}
	switch op := g.s.pick(20); op {
	case 0:
		switch g.s.pick(8) {
		case 0:
			return Init{} // invalid: no secret
		case 1:
			return Reseal{Secret: []byte{g.s.byte(), 2}} // invalid before an Init
		}
		return Init{Secret: []byte{g.s.byte(), 1}}
	case 1, 2:
		var live []Key
		for range g.s.pick(4) {
			live = append(live, g.key())
		}
		nss := genNS[:1+g.s.pick(2)]
		client, session := g.client(), g.session()
		if g.sessions == nil {
			g.sessions = map[string]string{}
		}
		g.sessions[client] = session
		g.renewed(client, g.now)
		r := Register{ClientID: client, SessionID: session, NodeID: g.node(client),
			AdvertiseURL: g.url(client), Namespaces: nss,
			Headroom: int64(g.s.pick(4)), TTLMs: ttl, Now: g.stamp(), LiveIDs: live}
		switch g.s.pick(24) {
		// Bad input: answered CodeInvalid, nothing changes.
		case 0:
			r.ClientID = ""
		case 1:
			r.SessionID = ""
		case 2:
			r.TTLMs = -int64(g.s.pick(2))
		}
		if g.s.pick(3) != 0 {
			// Hostname-aware: routes instead of namespaces (rarely both).
			if g.s.pick(16) != 0 {
				r.Namespaces = nil
			}
			return RegisterRoutes{Register: r, Routes: g.routes()}
		}
		return r
	case 3, 4, 5, 6:
		client := g.client()
		hb := Heartbeat{ClientID: client, SessionID: g.sessionOf(client), Now: g.stamp(),
			TTLMs: ttl, Headroom: int64(g.s.pick(4)), ProbeOK: g.s.pick(5) != 0}
		if g.s.pick(24) == 0 {
			hb.TTLMs = 0 // bad input
		}
		if client == g.partitioned && !inBatch {
			if len(g.late) < 8 {
				g.late = append(g.late, hb)
			}
			return g.command(inBatch)
		}
		g.renewed(client, hb.Now)
		return hb
	case 7:
		client := g.client()
		return Deregister{ClientID: client, SessionID: g.sessionOf(client)}
	case 8, 9, 10, 11:
		if g.s.pick(2) == 0 {
			return g.routeClaim(g.stamp())
		}
		return Claim{Key: g.claimKey(), ClientID: g.candidate(), Now: g.stamp(), QuarantineMs: int64(g.s.pick(2)) * ttl}
	case 12:
		r := Release{Key: g.key(), ClientID: g.client(), Generation: uint64(g.s.pick(50))}
		if len(g.gens) > 0 && g.s.pick(4) != 0 {
			r = g.gens[g.s.pick(len(g.gens))]
		}
		if g.s.pick(2) == 0 {
			// The worker's own give-back names its session too.
			return GiveBack{Key: r.Key, ClientID: r.ClientID, SessionID: g.sessionOf(r.ClientID), Generation: r.Generation}
		}
		return r
	case 13:
		now := g.stamp()
		deadline, cordon := now+int64(g.s.pick(40))*1000, g.s.pick(3) == 0
		if g.s.pick(2) == 0 {
			return DrainNode{NodeID: g.nodeID(), Deadline: deadline, Cordon: cordon, Now: now}
		}
		return DrainWorker{ClientID: g.client(), Deadline: deadline, Cordon: cordon, Now: now}
	case 14:
		return UndrainWorker{ClientID: g.client()}
	case 15:
		if g.s.pick(16) == 0 {
			return UndrainNode{} // invalid: no node id
		}
		return UndrainNode{NodeID: g.nodeID()}
	case 16:
		if g.s.pick(3) == 0 {
			// A new leader's first command; its former leader's node, or
			// none known.
			r := RenewLeases{Now: g.stamp(), TTLMs: ttl, FormerLeader: append(genNodes, "")[g.s.pick(3)]}
			if g.s.pick(16) == 0 {
				r.TTLMs = 0 // bad input
			}
			return r
		}
		now := g.tick()
		if g.s.pick(8) == 0 {
			now += DrainRetention + int64(g.s.pick(3))*DefaultWorkerRetention
			g.now = now
		}
		return GC{Now: now, WorkerRetentionMs: int64(g.s.pick(2)) * 60_000}
	case 17:
		return Opaque{Code: CommandType(40 + g.s.pick(3)), Ignorable: g.s.pick(2) == 0, Payload: []byte{g.s.byte()}}
	default:
		if inBatch {
			if g.s.pick(2) == 0 {
				return g.routeClaim(g.now)
			}
			return Claim{Key: g.key(), ClientID: g.candidate(), Now: g.now}
		}
		b := Batch{}
		for range 1 + g.s.pick(8) {
			b.Commands = append(b.Commands, g.command(true))
		}
		return b
	}
}
