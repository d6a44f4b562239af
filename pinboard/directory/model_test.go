package directory

import (
	"cmp"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// checker is an independent model of the directory, written from the rules
// in doc.go rather than from the code: it predicts the answer to every
// command (revocation, Release's generation check, the drain cap, the
// cold-start quarantine, eligibility, one grant per key per entry) and
// fails on any difference. Beside it, it keeps what each worker process
// believes it serves and until when, in true time (the clock at which a
// command is delivered, which may be up to maxSkew after its stamp), and
// fails when two processes could serve one key at the same moment: the
// invariant the rest exists for.
type checker struct {
	tb testing.TB

	// The directory as the rules say it must be.
	workers    map[string]*mWorker
	byURL      map[string]string
	placements map[Key]Placement
	drains     map[string]Drain // by client id
	nodeDrains map[string]Drain // by node id
	coldStart  int64
	lastGen    uint64
	secret     bool
	clock      int64        // the latest Now applied (RenewLeases' "since")
	entryKeys  map[Key]bool // keys granted in the entry being applied
	// Hostname-aware mode: (hostname, namespace) -> env and env -> takeover.
	bindings map[hostNS]Binding
	envs     map[string]EnvPolicy

	// beliefs is what each process serves: the keys it was granted or
	// kept at its last registration, until it learns otherwise.
	beliefs map[string]map[Key]belief

	now int64 // true time of the entry being observed (run sets it)
}

type mWorker struct {
	session    string
	url        string
	node       string
	namespaces []string
	routes     []Route
	lease      int64 // the directory's expiry
	told       int64 // the latest expiry acknowledged to the process
	degraded   bool
	draining   bool
	revoked    bool
	// unconfirmed: found on the former leader's node by a RenewLeases and
	// not heard from since: no new placements.
	unconfirmed bool
	// What operators see of it (GET /registry/workers).
	headroom      int64 // as last reported, minus one per grant since
	registeredAt  int64 // Now of the registration that began the session
	lastHeartbeat int64 // the latest Now a renewal carried
}

// belief is one key a process serves while its lease holds. lostAt is the
// true time the directory took the key from it without its knowledge (0
// while the placement is still its own): from then on, its lease must
// never again reach lostAt, or it serves beside the key's next owner.
type belief struct {
	gen    uint64
	lostAt int64
}

// nowOf returns the time a command carries, 0 if none: a batch's latest.
func nowOf(c Command) int64 {
	if b, ok := c.(Batch); ok {
		var t int64
		for _, sub := range b.Commands {
			t = max(t, nowOf(sub))
		}
		return t
	}
	return commandNow(c)
}

func newChecker(tb testing.TB) *checker {
	return &checker{tb: tb, workers: map[string]*mWorker{}, byURL: map[string]string{},
		placements: map[Key]Placement{}, drains: map[string]Drain{}, nodeDrains: map[string]Drain{}, entryKeys: map[Key]bool{},
		beliefs: map[string]map[Key]belief{}, bindings: map[hostNS]Binding{}, envs: map[string]EnvPolicy{}}
}

// observe checks the machine's answer r to cmd, applied at index at true
// time c.now, and advances the model.
func (c *checker) observe(index uint64, cmd Command, r Result) {
	c.tb.Helper()
	clear(c.entryKeys)
	if b, ok := cmd.(Batch); ok {
		if r.Code != CodeOK || len(r.Results) != len(b.Commands) {
			c.tb.Fatalf("index %d: batch answered %v with %d results for %d commands", index, r.Code, len(r.Results), len(b.Commands))
		}
		for i, sub := range b.Commands {
			c.step(index, sub, r.Results[i])
		}
		return
	}
	c.step(index, cmd, r)
}

func (c *checker) step(index uint64, cmd Command, got Result) {
	c.tb.Helper()
	want := c.expect(cmd)
	if d := diffResult(want, got); d != "" {
		c.tb.Fatalf("index %d: %T %+v: %s (model %+v, machine %+v)", index, cmd, cmd, d, want, got)
	}
}

// diffResult compares what the model predicts with the machine's answer,
// field by field; Reason is compared only where it is part of the API.
func diffResult(want, got Result) string {
	switch {
	case want.Code != got.Code:
		return fmt.Sprintf("code %v, model says %v", got.Code, want.Code)
	case (want.Code == CodeIneligible || want.Code == CodeBindingConflict || want.Code == CodeTakeover ||
		want.Code == CodeHeld) && want.Reason != got.Reason:
		return fmt.Sprintf("%v because %q, model says %q", want.Code, got.Reason, want.Reason)
	case !reflect.DeepEqual(want.Superseded, got.Superseded):
		return fmt.Sprintf("superseded %+v, model says %+v", got.Superseded, want.Superseded)
	case want.Placement != got.Placement:
		return fmt.Sprintf("placement %+v, model says %+v", got.Placement, want.Placement)
	case want.LeaseExpiry != got.LeaseExpiry || want.ExpiresInMs != got.ExpiresInMs:
		return fmt.Sprintf("lease %d (in %d ms), model says %d (in %d ms)", got.LeaseExpiry, got.ExpiresInMs, want.LeaseExpiry, want.ExpiresInMs)
	case want.Draining != got.Draining || want.Drain != got.Drain:
		return fmt.Sprintf("drain %v %+v, model says %v %+v", got.Draining, got.Drain, want.Draining, want.Drain)
	case want.Degraded != got.Degraded:
		return fmt.Sprintf("degraded %v", got.Degraded)
	case want.RemainingMs != got.RemainingMs:
		return fmt.Sprintf("quarantine remaining %d ms, model says %d", got.RemainingMs, want.RemainingMs)
	case !slices.Equal(want.Duplicates, got.Duplicates):
		return fmt.Sprintf("duplicates %v, model says %v", got.Duplicates, want.Duplicates)
	case want.WorkersForgotten != got.WorkersForgotten || want.PlacementsDropped != got.PlacementsDropped || want.DrainsExpired != got.DrainsExpired:
		return fmt.Sprintf("gc %d/%d/%d, model says %d/%d/%d", got.WorkersForgotten, got.PlacementsDropped, got.DrainsExpired,
			want.WorkersForgotten, want.PlacementsDropped, want.DrainsExpired)
	}
	return ""
}

func (c *checker) expect(cmd Command) Result {
	c.clock = max(c.clock, nowOf(cmd))
	switch cmd := cmd.(type) {
	case RenewLeases:
		return c.renewLeases(cmd)
	case Init:
		switch {
		case len(cmd.Secret) == 0:
			return Result{Code: CodeInvalid}
		case c.secret:
			return Result{Code: CodeExisting}
		}
		c.secret = true
		return Result{Code: CodeOK}
	case Reseal:
		if len(cmd.Secret) == 0 || !c.secret {
			return Result{Code: CodeInvalid}
		}
		return Result{Code: CodeOK}
	case Register:
		return c.register(cmd)
	case RegisterRoutes:
		return c.registerRoutes(cmd)
	case ClaimRoute:
		if cmd.Hostname == "" || cmd.TTLMs <= 0 {
			return Result{Code: CodeInvalid}
		}
		return c.claim(cmd.Claim, &cmd)
	case Heartbeat:
		return c.heartbeat(cmd)
	case Deregister:
		w := c.workers[cmd.ClientID]
		if w == nil || w.session == "" || w.session != cmd.SessionID {
			return Result{Code: CodeNotFound}
		}
		// The process itself asked: it stops serving what it held.
		c.dropPlacementsOf(cmd.ClientID, false)
		delete(c.beliefs, cmd.ClientID)
		w.session = ""
		return Result{Code: CodeOK}
	case Claim:
		return c.claim(cmd, nil)
	case Release:
		p, ok := c.placements[cmd.Key]
		if !ok {
			return Result{Code: CodeNotFound}
		}
		// Compare-and-set: a stale release (an older generation, another
		// owner) must not remove the placement its current owner serves.
		if p.Owner != cmd.ClientID || p.Generation != cmd.Generation {
			return Result{Code: CodeNotFound, Placement: p}
		}
		c.removePlacement(p)
		delete(c.beliefs[p.Owner], p.Key)
		return Result{Code: CodeOK}
	case GiveBack:
		w := c.workers[cmd.ClientID]
		switch {
		case w == nil:
			return Result{Code: CodeUnknownWorker}
		case w.session == "" || w.session != cmd.SessionID:
			return Result{Code: CodeReregister}
		}
		p, ok := c.placements[cmd.Key]
		if !ok {
			return Result{Code: CodeNotFound}
		}
		// Session and generation in one step: a worker acting on a
		// replaced session, or on an id regranted since, removes nothing.
		if p.Owner != cmd.ClientID || p.OwnerSession != cmd.SessionID || p.Generation != cmd.Generation {
			return Result{Code: CodeHeld, Placement: p}
		}
		c.removePlacement(p)
		delete(c.beliefs[p.Owner], p.Key)
		return Result{Code: CodeOK}
	case DrainWorker:
		if c.workers[cmd.ClientID] == nil {
			return Result{Code: CodeUnknownWorker}
		}
		d := Drain{ClientID: cmd.ClientID, Cordon: cmd.Cordon, SetAt: cmd.Now}
		if !cmd.Cordon {
			d.Deadline = cmd.Deadline
		}
		c.drains[cmd.ClientID] = d
		r := Result{Code: CodeOK, Draining: d.Active(cmd.Now)}
		if r.Draining {
			r.Drain = d // the encoding carries the drain only while it is in force
		}
		return r
	case UndrainWorker:
		if _, ok := c.drains[cmd.ClientID]; ok {
			delete(c.drains, cmd.ClientID)
			return Result{Code: CodeOK}
		}
		if c.workers[cmd.ClientID] == nil {
			return Result{Code: CodeUnknownWorker}
		}
		return Result{Code: CodeOK}
	case DrainNode:
		if cmd.NodeID == "" {
			return Result{Code: CodeInvalid}
		}
		// A node id is known while a known worker registered with it (or
		// it has a drain record already): a typo must not drain nothing.
		if _, ok := c.nodeDrains[cmd.NodeID]; !ok && !c.nodeKnown(cmd.NodeID) {
			return Result{Code: CodeUnknownWorker}
		}
		d := Drain{NodeID: cmd.NodeID, Cordon: cmd.Cordon, SetAt: cmd.Now}
		if !cmd.Cordon {
			d.Deadline = cmd.Deadline
		}
		c.nodeDrains[cmd.NodeID] = d
		r := Result{Code: CodeOK, Draining: d.Cordon || cmd.Now <= d.Deadline+DrainRetention}
		if r.Draining {
			r.Drain = d
		}
		return r
	case UndrainNode:
		if cmd.NodeID == "" {
			return Result{Code: CodeInvalid}
		}
		_, known := c.nodeDrains[cmd.NodeID]
		delete(c.nodeDrains, cmd.NodeID)
		// Undraining a node frees it whichever way it was drained: the
		// drains of its workers' client ids go too.
		for id, w := range c.workers {
			if w.node == cmd.NodeID {
				known = true
				delete(c.drains, id)
			}
		}
		if !known {
			return Result{Code: CodeUnknownWorker}
		}
		return Result{Code: CodeOK}
	case GC:
		keep := cmd.WorkerRetentionMs
		if keep <= 0 {
			keep = DefaultWorkerRetention
		}
		var r Result
		for _, id := range slices.Sorted(maps.Keys(c.workers)) {
			if cmd.Now-c.workers[id].lease > keep {
				r.PlacementsDropped += c.forget(id)
				r.WorkersForgotten++
			}
		}
		for _, drains := range []map[string]Drain{c.drains, c.nodeDrains} {
			for id, d := range drains {
				if !(d.Cordon || cmd.Now <= d.Deadline+DrainRetention) {
					delete(drains, id)
					r.DrainsExpired++
				}
			}
		}
		// A binding goes with its last live worker that agrees with it.
		for k, b := range c.bindings {
			if !c.bindingHeld(b, "", cmd.Now) {
				delete(c.bindings, k)
			}
		}
		for env, e := range c.envs {
			if !c.envHeld(e, "", cmd.Now) {
				delete(c.envs, env)
			}
		}
		return r
	case Opaque:
		if cmd.Ignorable {
			return Result{Code: CodeUnknownCommand}
		}
		return Result{Code: CodeError}
	}
	c.tb.Fatalf("model: %T has no model yet: add it to checker.expect", cmd)
	return Result{}
}

func (c *checker) nodeKnown(node string) bool {
	for _, w := range c.workers {
		if w.node == node {
			return true
		}
	}
	return false
}

// activeDrain is the operator drain in force on worker id at now, by its
// client id or by its node id: a cordon until undrained, a timed drain
// until DrainRetention past its deadline. With both, the one that binds
// harder: a timed drain over a cordon, the earlier deadline of two.
func (c *checker) activeDrain(id string, now int64) (Drain, bool) {
	active := func(d Drain, ok bool) bool { return ok && (d.Cordon || now <= d.Deadline+DrainRetention) }
	d, ok := c.drains[id]
	ok = active(d, ok)
	var nd Drain
	nok := false
	if w := c.workers[id]; w != nil && w.node != "" {
		nd, nok = c.nodeDrains[w.node]
		nok = active(nd, nok)
	}
	switch {
	case !ok && !nok:
		return Drain{}, false
	case !nok:
		return d, true
	case !ok:
		return nd, true
	case !nd.Cordon && (d.Cordon || nd.Deadline < d.Deadline):
		return nd, true
	}
	return d, true
}

// renew is a lease extension at now: never backwards, never past an active
// timed drain's deadline (unless the lease was already beyond it).
func (c *checker) renew(id string, now, ttlMs int64) Result {
	w := c.workers[id]
	exp := now + ttlMs
	d, draining := c.activeDrain(id, now)
	if draining && !d.Cordon && exp > d.Deadline {
		exp = d.Deadline
	}
	w.lease = max(w.lease, exp)
	w.told = w.lease
	w.unconfirmed = false // heard from
	w.lastHeartbeat = max(w.lastHeartbeat, now)
	// The process now serves what it believes it holds until w.lease: a key
	// taken from it since must stay out of that window.
	for k, b := range c.beliefs[id] {
		if b.lostAt != 0 && w.lease >= b.lostAt {
			c.tb.Fatalf("%s lost %v at %d (true time) but was then told its lease holds until %d: two owners at once",
				id, k, b.lostAt, w.lease)
		}
	}
	r := Result{Code: CodeOK, LeaseExpiry: w.lease, ExpiresInMs: max(0, w.lease-now), Draining: draining, Degraded: w.degraded}
	if draining {
		r.Drain = d
	}
	return r
}

func (c *checker) register(cmd Register) Result {
	switch {
	case cmd.ClientID == "" || cmd.SessionID == "" || cmd.TTLMs <= 0:
		return Result{Code: CodeInvalid}
	}
	if cmd.AdvertiseURL != "" {
		if other, ok := c.byURL[cmd.AdvertiseURL]; ok && other != cmd.ClientID {
			if ow := c.workers[other]; ow != nil && ow.session != "" && cmd.Now <= ow.lease {
				return Result{Code: CodeDuplicateAdvertise}
			}
			c.forget(other)
		}
	}
	w := c.workers[cmd.ClientID]
	if w == nil {
		w = &mWorker{}
		c.workers[cmd.ClientID] = w
	}
	if w.url != cmd.AdvertiseURL && c.byURL[w.url] == cmd.ClientID {
		delete(c.byURL, w.url)
	}
	if cmd.AdvertiseURL != "" {
		c.byURL[cmd.AdvertiseURL] = cmd.ClientID
	}
	if w.session != cmd.SessionID {
		w.registeredAt = cmd.Now
	}
	w.session, w.url, w.node, w.namespaces, w.headroom = cmd.SessionID, cmd.AdvertiseURL, cmd.NodeID, cmd.Namespaces, cmd.Headroom
	w.routes = nil
	w.degraded, w.revoked, w.draining = false, false, cmd.Draining

	listed := map[Key]bool{}
	for _, k := range cmd.LiveIDs {
		listed[k] = true
	}
	for _, p := range c.sortedPlacements() {
		if p.Owner != cmd.ClientID || p.OwnerSession == cmd.SessionID {
			continue
		}
		if listed[p.Key] {
			p.OwnerSession = cmd.SessionID
			c.placements[p.Key] = p
		} else {
			c.removePlacement(p)
		}
	}
	// The process runs what it listed, minus what it is told to quit.
	var dups []Key
	beliefs := map[Key]belief{}
	for _, k := range cmd.LiveIDs {
		if p, ok := c.placements[k]; ok && p.Owner == cmd.ClientID {
			beliefs[k] = belief{gen: p.Generation}
			continue
		}
		if listed[k] {
			listed[k] = false
			dups = append(dups, k)
		}
	}
	c.beliefs[cmd.ClientID] = beliefs
	r := c.renew(cmd.ClientID, cmd.Now, cmd.TTLMs)
	r.Duplicates = dups
	return r
}

func (c *checker) heartbeat(cmd Heartbeat) Result {
	w := c.workers[cmd.ClientID]
	if w == nil || w.session == "" || w.session != cmd.SessionID {
		return Result{Code: CodeReregister}
	}
	// A session that lost an id to a lapse is never renewed again, however
	// early its heartbeat was stamped: it re-registers and learns the loss.
	if cmd.Now > w.lease || w.revoked {
		return Result{Code: CodeReregister}
	}
	if cmd.TTLMs <= 0 {
		return Result{Code: CodeInvalid}
	}
	w.degraded, w.draining, w.headroom = !cmd.ProbeOK, cmd.Draining, cmd.Headroom
	r := c.renew(cmd.ClientID, cmd.Now, cmd.TTLMs)
	for _, rt := range w.routes {
		if rt.Superseded {
			r.Superseded = append(r.Superseded, rt) // the worker is told
		}
	}
	return r
}

func (c *checker) claim(cmd Claim, rc *ClaimRoute) Result {
	var bound Binding
	if rc != nil {
		b, ok := c.bindings[hostNS{rc.Hostname, cmd.Key.Namespace}]
		switch {
		case !ok:
			return Result{Code: CodeIneligible, Reason: ReasonNoHostname}
		case b.Env != cmd.Key.Env:
			return Result{Code: CodeConflict}
		}
		bound = b
	}
	if c.coldStart == 0 {
		c.coldStart = cmd.Now
	}
	p, placed := c.placements[cmd.Key]
	if placed {
		if hw := c.workers[p.Owner]; hw != nil && hw.session == p.OwnerSession && cmd.Now <= hw.lease {
			if rc != nil && p.Hostname != "" && p.Hostname != rc.Hostname {
				// Another hostname of the env holds it: its takeover decides.
				if c.envs[cmd.Key.Env].Takeover == TakeoverDeny {
					return Result{Code: CodeHeld, Reason: ReasonOtherHostname, Placement: p}
				}
				if p.FenceUntil == 0 {
					p.FenceUntil = cmd.Now + rc.TTLMs
					c.placements[p.Key] = p
					return Result{Code: CodeTakeover, Reason: ReasonFenced, Placement: p, RemainingMs: rc.TTLMs}
				}
				if cmd.Now >= p.FenceUntil {
					return Result{Code: CodeTakeover, Reason: ReasonFencePassed, Placement: p}
				}
				return Result{Code: CodeTakeover, Placement: p, RemainingMs: p.FenceUntil - cmd.Now}
			}
			if p.Owner == cmd.ClientID {
				return Result{Code: CodeExisting, Placement: p}
			}
			return Result{Code: CodeHeld, Placement: p}
		}
	}
	if rc != nil && cmd.Now < bound.DisplacedUntil {
		return Result{Code: CodeIneligible, Reason: ReasonDisplaced, RemainingMs: bound.DisplacedUntil - cmd.Now}
	}
	if end := c.coldStart + cmd.QuarantineMs; cmd.Now < end {
		return Result{Code: CodeQuarantine, RemainingMs: end - cmd.Now}
	}
	w := c.workers[cmd.ClientID]
	if w == nil {
		return Result{Code: CodeIneligible, Reason: ReasonUnknownWorker}
	}
	_, drained := c.activeDrain(cmd.ClientID, cmd.Now)
	switch {
	case w.session == "":
		return Result{Code: CodeIneligible, Reason: ReasonNotRegistered}
	case cmd.Now > w.lease:
		return Result{Code: CodeIneligible, Reason: ReasonLeaseLapsed}
	case rc == nil && !slices.Contains(w.namespaces, cmd.Key.Namespace),
		rc != nil && !c.servesRoute(w, rc.Hostname, cmd.Key.Namespace, cmd.Key.Env):
		return Result{Code: CodeIneligible, Reason: ReasonNamespace}
	case w.degraded:
		return Result{Code: CodeIneligible, Reason: ReasonDegraded}
	case w.revoked:
		return Result{Code: CodeIneligible, Reason: ReasonLeaseLapsed}
	case w.unconfirmed:
		return Result{Code: CodeIneligible, Reason: ReasonUnconfirmed}
	case w.draining || drained:
		return Result{Code: CodeIneligible, Reason: ReasonDraining}
	}
	if c.entryKeys[cmd.Key] {
		return Result{Code: CodeConflict}
	}
	if placed {
		if hw := c.workers[p.Owner]; hw != nil && hw.session == p.OwnerSession && p.Owner != cmd.ClientID {
			hw.revoked = true
		}
		c.removePlacement(p)
		c.lose(p)
	}
	gen := c.lastGen + 1
	if cmd.Now > 0 {
		gen = max(gen, uint64(cmd.Now)*1000)
	}
	c.lastGen = gen
	np := Placement{Key: cmd.Key, Owner: cmd.ClientID, OwnerSession: w.session, Generation: gen, PlacedAt: cmd.Now}
	if rc != nil {
		np.Hostname = rc.Hostname
	}
	c.placements[cmd.Key] = np
	c.entryKeys[cmd.Key] = true
	if w.headroom > 0 {
		w.headroom-- // until the next report
	}
	// The new owner serves from now (true time); every other process that
	// believes it holds the key must be past its lease by then.
	for _, id := range slices.Sorted(maps.Keys(c.beliefs)) {
		if _, ok := c.beliefs[id][cmd.Key]; ok && id != cmd.ClientID && c.leaseOf(id) >= c.now {
			c.tb.Fatalf("%v granted to %s at %d (true time) while %s still serves it until %d",
				cmd.Key, cmd.ClientID, c.now, id, c.leaseOf(id))
		}
	}
	if c.beliefs[cmd.ClientID] == nil {
		c.beliefs[cmd.ClientID] = map[Key]belief{}
	}
	c.beliefs[cmd.ClientID][cmd.Key] = belief{gen: gen}
	return Result{Code: CodeGranted, Placement: np}
}

// leaseOf is how long process id believes it may serve: the lease it was
// last told, which a new leader's renewal does not change.
func (c *checker) leaseOf(id string) int64 {
	if w := c.workers[id]; w != nil {
		return w.told
	}
	return 0
}

// renewLeases is a new leader forgiving the leaderless gap: leases live
// at the clock (when the former leader last committed) run a fresh TTL
// from Now, as far as a timed drain allows; the former leader's node gets
// no renewal and no new placements until it is heard from. The processes
// are told nothing.
func (c *checker) renewLeases(cmd RenewLeases) Result {
	if cmd.TTLMs <= 0 {
		return Result{Code: CodeInvalid}
	}
	since := c.clock
	c.clock = max(c.clock, cmd.Now)
	for _, id := range slices.Sorted(maps.Keys(c.workers)) {
		w := c.workers[id]
		if w.session == "" || w.revoked || w.lease < since {
			continue
		}
		if cmd.FormerLeader != "" && w.node == cmd.FormerLeader {
			w.unconfirmed = true
			continue
		}
		exp := cmd.Now + cmd.TTLMs
		if d, ok := c.activeDrain(id, cmd.Now); ok && !d.Cordon && exp > d.Deadline {
			exp = d.Deadline
		}
		w.lease = max(w.lease, exp)
	}
	return Result{Code: CodeOK}
}

// lose records that p's owner lost its key without being told: it still
// believes it serves it until its lease ends, which must be before now.
func (c *checker) lose(p Placement) {
	b, ok := c.beliefs[p.Owner][p.Key]
	if !ok || b.gen != p.Generation {
		return
	}
	if l := c.leaseOf(p.Owner); l >= c.now {
		c.tb.Fatalf("%v taken from %s at %d (true time) while its lease holds until %d", p.Key, p.Owner, c.now, l)
	}
	b.lostAt = c.now
	c.beliefs[p.Owner][p.Key] = b
}

// forget drops a worker the directory no longer knows (its lease long
// lapsed, or its advertise URL taken by a new process); its drain stays.
func (c *checker) forget(id string) int {
	n := c.dropPlacementsOf(id, true)
	if w := c.workers[id]; w != nil && c.byURL[w.url] == id {
		delete(c.byURL, w.url)
	}
	delete(c.workers, id)
	return n
}

func (c *checker) dropPlacementsOf(id string, unknowing bool) int {
	n := 0
	for _, p := range c.sortedPlacements() {
		if p.Owner == id {
			c.removePlacement(p)
			if unknowing {
				c.lose(p)
			}
			n++
		}
	}
	return n
}

func (c *checker) removePlacement(p Placement) { delete(c.placements, p.Key) }

func (c *checker) sortedPlacements() []Placement {
	ps := slices.Collect(maps.Values(c.placements))
	slices.SortFunc(ps, func(a, b Placement) int { return a.Key.Compare(b.Key) })
	return ps
}

// compareState checks the machine's reads against the model's state.
func (c *checker) compareState(m *Machine) {
	c.tb.Helper()
	ws := m.Workers()
	if len(ws) != len(c.workers) {
		c.tb.Fatalf("machine knows %d workers, model %d", len(ws), len(c.workers))
	}
	for _, w := range ws {
		mw := c.workers[w.ClientID]
		if mw == nil || mw.session != w.SessionID || mw.lease != w.LeaseExpiry || mw.revoked != w.Revoked ||
			mw.degraded != w.Degraded || mw.draining != w.Draining || mw.url != w.AdvertiseURL || mw.node != w.NodeID ||
			!slices.Equal(mw.namespaces, w.Namespaces) || mw.headroom != w.Headroom || mw.registeredAt != w.RegisteredAt ||
			mw.lastHeartbeat != w.LastHeartbeat || mw.unconfirmed != w.Unconfirmed || !slices.Equal(mw.routes, w.Routes) {
			c.tb.Fatalf("worker %+v, model %+v", w, mw)
		}
		if one, ok := m.Worker(w.ClientID); !ok || !reflect.DeepEqual(one, w) {
			c.tb.Fatalf("Worker(%s) %+v (%v), Workers has %+v", w.ClientID, one, ok, w)
		}
		for _, p := range m.PlacementsOf(w.ClientID) {
			if c.placements[p.Key] != p {
				c.tb.Fatalf("placement %+v, model %+v", p, c.placements[p.Key])
			}
		}
	}
	for k, p := range c.placements {
		if got, ok := m.Placement(k); !ok || got != p {
			c.tb.Fatalf("placement of %v: machine %+v (%v), model %+v", k, got, ok, p)
		}
		// Owner names the owner's record only while its session holds p.
		got, w, ok := m.Owner(k)
		mw := c.workers[p.Owner]
		switch {
		case !ok || got != p:
			c.tb.Fatalf("owner of %v: placement %+v (%v), model %+v", k, got, ok, p)
		case mw != nil && mw.session == p.OwnerSession && (w.ClientID != p.Owner || w.SessionID != p.OwnerSession || w.LeaseExpiry != mw.lease):
			c.tb.Fatalf("owner of %v: worker %+v, model %+v", k, w, mw)
		case (mw == nil || mw.session != p.OwnerSession) && w.ClientID != "":
			c.tb.Fatalf("owner of %v: worker %+v for a session that does not hold it", k, w)
		}
	}
	if got := m.Secret() != nil; got != c.secret {
		c.tb.Fatalf("secret set: %v, model %v", got, c.secret)
	}
	ds := m.Drains()
	want := slices.Collect(maps.Values(c.drains))
	slices.SortFunc(want, func(a, b Drain) int { return cmp.Compare(a.ClientID, b.ClientID) })
	nodes := slices.Collect(maps.Values(c.nodeDrains))
	slices.SortFunc(nodes, func(a, b Drain) int { return cmp.Compare(a.NodeID, b.NodeID) })
	want = append(want, nodes...)
	if !slices.Equal(ds, want) {
		c.tb.Fatalf("drains %+v, model %+v", ds, want)
	}
	if m.ColdStart() != c.coldStart {
		c.tb.Fatalf("cold start %d, model %d", m.ColdStart(), c.coldStart)
	}
	// The reads the front door places with: who may take a new id now.
	for _, ns := range genNS {
		var want []string
		served := false
		for _, id := range slices.Sorted(maps.Keys(c.workers)) {
			w := c.workers[id]
			served = served || slices.Contains(w.namespaces, ns) || slices.ContainsFunc(w.routes, func(r Route) bool { return r.Namespace == ns })
			_, drained := c.activeDrain(id, c.now)
			if w.session != "" && c.now <= w.lease && slices.Contains(w.namespaces, ns) && !w.degraded && !w.revoked && !w.unconfirmed && !w.draining && !drained {
				want = append(want, id)
			}
		}
		var got []string
		for _, w := range m.Candidates(ns, c.now) {
			got = append(got, w.ClientID)
		}
		if !slices.Equal(got, want) {
			c.tb.Fatalf("candidates for %s at %d: %v, model %v", ns, c.now, got, want)
		}
		if m.NamespaceServed(ns) != served {
			c.tb.Fatalf("namespace %s served: %v, model %v", ns, m.NamespaceServed(ns), served)
		}
	}
	c.compareHostnames(m)
	if c.coldStart != 0 {
		if got, want := m.QuarantineMs(c.now, ttl), max(0, c.coldStart+ttl-c.now); got != want {
			c.tb.Fatalf("quarantine left at %d: %d ms, model %d", c.now, got, want)
		}
	}
}

// The hostname-aware rules (seed 004), as the model holds them.

func (c *checker) servesRoute(w *mWorker, hostname, ns, env string) bool {
	for _, r := range w.routes {
		if !r.Superseded && r.Hostname == hostname && r.Namespace == ns && r.Env == env {
			return true
		}
	}
	return false
}

// held reports whether a live worker other than except serves an
// unsuperseded route that ok accepts.
func (c *checker) held(except string, now int64, ok func(Route) bool) bool {
	for id, w := range c.workers {
		if id == except || w.session == "" || now > w.lease {
			continue
		}
		for _, r := range w.routes {
			if !r.Superseded && ok(r) {
				return true
			}
		}
	}
	return false
}

func (c *checker) bindingHeld(b Binding, except string, now int64) bool {
	return c.held(except, now, func(r Route) bool {
		return r.Hostname == b.Hostname && r.Namespace == b.Namespace && r.Env == b.Env
	})
}

func (c *checker) envHeld(e EnvPolicy, except string, now int64) bool {
	return c.held(except, now, func(r Route) bool { return r.Env == e.Env && r.Takeover == e.Takeover })
}

func (c *checker) supersede(except string, hit func(Route) bool) {
	for id, w := range c.workers {
		if id == except {
			continue
		}
		rs := slices.Clone(w.routes)
		for i := range rs {
			if hit(rs[i]) {
				rs[i].Superseded = true
			}
		}
		w.routes = rs
	}
}

func (c *checker) registerRoutes(cmd RegisterRoutes) Result {
	// Bad input first: the routes among themselves.
	hosts, takeovers := map[hostNS]bool{}, map[string]TakeoverPolicy{}
	for _, r := range cmd.Routes {
		k := hostNS{r.Hostname, r.Namespace}
		t, seen := takeovers[r.Env]
		if r.Hostname == "" || r.Namespace == "" || r.Env == "" || r.Takeover > TakeoverDeny || r.Superseded ||
			hosts[k] || seen && t != r.Takeover {
			return Result{Code: CodeInvalid}
		}
		hosts[k], takeovers[r.Env] = true, r.Takeover
	}
	if len(cmd.Routes) == 0 || len(cmd.Namespaces) != 0 {
		return Result{Code: CodeInvalid}
	}
	// Then the bindings in force (held by some other live worker): a
	// disagreeing route needs a higher epoch.
	for _, r := range cmd.Routes {
		if b, ok := c.bindings[hostNS{r.Hostname, r.Namespace}]; ok && c.bindingHeld(b, cmd.ClientID, cmd.Now) && b.Env != r.Env && r.Epoch <= b.Epoch {
			return Result{Code: CodeBindingConflict, Reason: fmt.Sprintf(
				"hostname %s%s is bound to env %s at epoch %d, not %s — register with a higher epoch to displace",
				r.Hostname, r.Namespace, b.Env, b.Epoch, r.Env), Superseded: []Route{r}}
		}
		if e, ok := c.envs[r.Env]; ok && c.envHeld(e, cmd.ClientID, cmd.Now) && e.Takeover != r.Takeover && r.Epoch <= e.Epoch {
			return Result{Code: CodeBindingConflict, Reason: fmt.Sprintf(
				"env %s agreed takeover %s at epoch %d, not %s — register with a higher epoch to displace",
				r.Env, e.Takeover, e.Epoch, r.Takeover), Superseded: []Route{r}}
		}
	}
	res := c.register(cmd.Register)
	if res.Code != CodeOK {
		return res
	}
	c.workers[cmd.ClientID].routes = slices.Clone(cmd.Routes)
	for _, r := range cmd.Routes {
		k := hostNS{r.Hostname, r.Namespace}
		b, ok := c.bindings[k]
		if ok && b.Env == r.Env {
			b.Epoch = max(b.Epoch, r.Epoch)
		} else {
			// New, or rebound: whoever still serves it otherwise is
			// superseded, and a rebinding of live holders waits one lease.
			held := ok && c.bindingHeld(b, cmd.ClientID, cmd.Now)
			b = Binding{Hostname: r.Hostname, Namespace: r.Namespace, Env: r.Env, Epoch: r.Epoch}
			if held {
				b.DisplacedUntil = cmd.Now + cmd.TTLMs
			}
			c.supersede(cmd.ClientID, func(o Route) bool {
				return o.Hostname == r.Hostname && o.Namespace == r.Namespace && o.Env != r.Env
			})
		}
		c.bindings[k] = b
		e, ok := c.envs[r.Env]
		if ok && e.Takeover == r.Takeover {
			e.Epoch = max(e.Epoch, r.Epoch)
		} else {
			e = EnvPolicy{Env: r.Env, Takeover: r.Takeover, Epoch: r.Epoch}
			c.supersede(cmd.ClientID, func(o Route) bool { return o.Env == r.Env && o.Takeover != r.Takeover })
		}
		c.envs[r.Env] = e
	}
	return res
}

// compareHostnames checks the hostname-aware reads: bindings, env
// policies, and who a claim through each hostname may place on.
func (c *checker) compareHostnames(m *Machine) {
	c.tb.Helper()
	bs, es := m.Bindings()
	want := slices.Collect(maps.Values(c.bindings))
	slices.SortFunc(want, compareBindings)
	wantEnvs := slices.Collect(maps.Values(c.envs))
	slices.SortFunc(wantEnvs, func(a, b EnvPolicy) int { return cmp.Compare(a.Env, b.Env) })
	if !slices.Equal(bs, want) || !slices.Equal(es, wantEnvs) {
		c.tb.Fatalf("bindings %+v %+v, model %+v %+v", bs, es, want, wantEnvs)
	}
	for _, h := range genHosts {
		for _, ns := range genNS {
			b, bound := c.bindings[hostNS{h, ns}]
			if got, ok := m.Binding(h, ns); ok != bound || got != b {
				c.tb.Fatalf("binding of %s%s: %+v (%v), model %+v (%v)", h, ns, got, ok, b, bound)
			}
			var want []string
			for _, id := range slices.Sorted(maps.Keys(c.workers)) {
				w := c.workers[id]
				_, drained := c.activeDrain(id, c.now)
				if bound && w.session != "" && c.now <= w.lease && c.servesRoute(w, h, ns, b.Env) && !w.degraded && !w.revoked && !w.unconfirmed && !w.draining && !drained {
					want = append(want, id)
				}
			}
			env, ws := m.RouteCandidates(h, ns, c.now)
			var got []string
			for _, w := range ws {
				got = append(got, w.ClientID)
			}
			if env != b.Env || !slices.Equal(got, want) {
				c.tb.Fatalf("route candidates for %s%s at %d: %s %v, model %s %v", h, ns, c.now, env, got, b.Env, want)
			}
		}
	}
}
