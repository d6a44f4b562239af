package directory

import "slices"

// The appliers below run under the write lock. They change workers only
// through workerTable.edit and placements only through placementTable.set
// and removePlacement, which is what readers see once the entry is
// published. Map iteration appears only where the outcome does not depend
// on its order (every element gets the same treatment); anything that
// reaches a result follows the command's own order.

func (m *Machine) applyInit(c Init) Result {
	if len(c.Secret) == 0 {
		return Result{Code: CodeInvalid, Reason: "empty secret"}
	}
	if len(m.st.secret) != 0 {
		return Result{Code: CodeExisting}
	}
	m.st.secret = append([]byte(nil), c.Secret...)
	return Result{Code: CodeOK}
}

func (m *Machine) applyReseal(c Reseal) Result {
	if len(c.Secret) == 0 || len(m.st.secret) == 0 {
		return Result{Code: CodeInvalid, Reason: "no secret to reseal"}
	}
	m.st.secret = append([]byte(nil), c.Secret...)
	return Result{Code: CodeOK}
}

// activeDrain returns the drain of clientID if it is in force at now.
func (m *Machine) activeDrain(clientID string, now int64) (Drain, bool) {
	d, ok := m.st.drains[clientID]
	if !ok || !d.Active(now) {
		return Drain{}, false
	}
	return d, true
}

// drainFor returns the operator drain in force on w at now: its client
// id's or its node id's, the stricter when both are (so the lease cap and
// the deadline the worker is told come from one record).
func (m *Machine) drainFor(w *Worker, now int64) (Drain, bool) {
	d, ok := m.activeDrain(w.ClientID, now)
	if w.NodeID == "" {
		return d, ok
	}
	nd, nok := m.st.nodeDrains[w.NodeID]
	if !nok || !nd.Active(now) {
		return d, ok
	}
	if !ok || nd.stricter(d) {
		return nd, true
	}
	return d, true
}

// renew extends w's lease for a registration or heartbeat at now. The lease
// never moves backwards (the worker may already hold the later expiry) and
// is not extended past a timed drain's deadline.
func (m *Machine) renew(w *Worker, now, ttl int64) Result {
	d, draining := m.drainFor(w, now)
	exp := now + ttl
	if draining {
		exp = d.capLease(exp, now)
	}
	w.LeaseExpiry = max(w.LeaseExpiry, exp)
	w.LastHeartbeat = max(w.LastHeartbeat, now)
	return Result{
		Code:        CodeOK,
		LeaseExpiry: w.LeaseExpiry,
		ExpiresInMs: max(0, w.LeaseExpiry-now),
		Draining:    draining,
		Drain:       d,
		Degraded:    w.Degraded,
	}
}

func (m *Machine) applyRegister(c Register) Result {
	switch {
	case c.ClientID == "":
		return Result{Code: CodeInvalid, Reason: "empty client id"}
	case c.SessionID == "":
		return Result{Code: CodeInvalid, Reason: "empty session id"}
	case c.TTLMs <= 0:
		return Result{Code: CodeInvalid, Reason: "lease TTL must be positive"}
	}
	if c.AdvertiseURL != "" {
		if other, ok := m.st.byURL[c.AdvertiseURL]; ok && other != c.ClientID {
			if ow, ok := m.st.workers.get(other); ok && ow.Live(c.Now) {
				// Two live processes cannot share an advertise URL: requests
				// routed to one would reach the other.
				return Result{Code: CodeDuplicateAdvertise, Reason: "advertise URL held by live worker " + other}
			}
			// The old holder's lease lapsed: this process took its place.
			m.forgetWorker(other)
		}
	}

	w := m.st.workers.edit(c.ClientID)
	if w.AdvertiseURL != c.AdvertiseURL && m.st.byURL[w.AdvertiseURL] == c.ClientID {
		delete(m.st.byURL, w.AdvertiseURL)
	}
	if c.AdvertiseURL != "" {
		m.st.byURL[c.AdvertiseURL] = c.ClientID
	}
	if w.SessionID != c.SessionID {
		w.RegisteredAt = c.Now
	}
	w.SessionID = c.SessionID
	w.NodeID = c.NodeID
	w.AdvertiseURL = c.AdvertiseURL
	w.Namespaces = append([]string(nil), c.Namespaces...)
	w.Routes = nil // RegisterRoutes sets them
	w.Headroom = c.Headroom
	w.Degraded = false // registration is gated on a passing challenge
	w.Revoked = false  // a new session
	w.Unconfirmed = false
	w.Draining = c.Draining

	var live map[Key]struct{}
	if len(c.LiveIDs) != 0 {
		live = make(map[Key]struct{}, len(c.LiveIDs))
		for _, k := range c.LiveIDs {
			live[k] = struct{}{}
		}
	}
	// Placements from an earlier session of this process: the ids it still
	// runs move to the new session with their generation (the instance and its
	// fencing token are unchanged); the rest are released.
	for k := range m.st.placements.keysOf(c.ClientID) {
		p, _ := m.st.placements.get(k)
		if p.OwnerSession == c.SessionID {
			continue
		}
		if _, ok := live[k]; ok {
			p.OwnerSession = c.SessionID
			m.st.placements.set(p)
		} else {
			m.removePlacement(p)
		}
	}
	r := m.renew(w, c.Now, c.TTLMs)
	for _, k := range c.LiveIDs {
		if p, ok := m.st.placements.get(k); ok && p.Owner == c.ClientID {
			continue
		}
		if _, ok := live[k]; !ok {
			continue // listed twice; reported once
		}
		delete(live, k)
		r.Duplicates = append(r.Duplicates, k)
	}
	return r
}

func (m *Machine) applyHeartbeat(c Heartbeat) Result {
	cur, ok := m.st.workers.get(c.ClientID)
	if !ok || cur.SessionID == "" || cur.SessionID != c.SessionID {
		return Result{Code: CodeReregister, Reason: "unknown client or stale session"}
	}
	if c.Now > cur.LeaseExpiry || cur.Revoked {
		// A process waking past its lease (VM pause, long GC) must not be
		// revived silently: its ids may be placed elsewhere by now. It
		// re-registers and learns which ids it lost. Revoked covers the
		// heartbeat stamped before the lapse but applied after another
		// worker took one of its ids.
		return Result{Code: CodeReregister, Reason: "lease lapsed"}
	}
	if c.TTLMs <= 0 {
		return Result{Code: CodeInvalid, Reason: "lease TTL must be positive"}
	}
	w := m.st.workers.edit(c.ClientID)
	w.Headroom = c.Headroom
	w.Degraded = !c.ProbeOK
	w.Draining = c.Draining
	w.Unconfirmed = false // the process itself is heard from again
	r := m.renew(w, c.Now, c.TTLMs)
	r.Superseded = superseded(w)
	return r
}

// applyRenewLeases forgives the leaderless gap before a new leader's term
// judges any lease (see RenewLeases and the package doc). The walk's order
// cannot matter: each worker is treated on its own.
func (m *Machine) applyRenewLeases(c RenewLeases) Result {
	if c.TTLMs <= 0 {
		return Result{Code: CodeInvalid, Reason: "lease TTL must be positive"}
	}
	since := m.st.clock
	m.st.clock = max(m.st.clock, c.Now)
	for id, cur := range m.st.workers.all() {
		if cur.SessionID == "" || cur.Revoked || cur.LeaseExpiry < since {
			continue // lapsed while a leader could still renew it, or ended
		}
		w := m.st.workers.edit(id)
		if c.FormerLeader != "" && w.NodeID == c.FormerLeader {
			// The election happened because this node stopped answering
			// its peers (or handed over): no excuse for it, and no new
			// placements until it is heard from.
			w.Unconfirmed = true
			continue
		}
		exp := c.Now + c.TTLMs
		if d, ok := m.drainFor(w, c.Now); ok {
			exp = d.capLease(exp, c.Now)
		}
		w.LeaseExpiry = max(w.LeaseExpiry, exp)
	}
	return Result{Code: CodeOK}
}

func (m *Machine) applyDeregister(c Deregister) Result {
	w, ok := m.st.workers.get(c.ClientID)
	if !ok || w.SessionID == "" || w.SessionID != c.SessionID {
		return Result{Code: CodeNotFound}
	}
	m.dropPlacementsOf(c.ClientID)
	m.st.workers.edit(c.ClientID).SessionID = ""
	return Result{Code: CodeOK}
}

// eligible returns "" when w may take a new placement at now, else the
// reason it may not; serves says whether w serves what is placed (the
// namespace, or in hostname-aware mode the route).
func (m *Machine) eligible(w *Worker, serves bool, now int64) string {
	switch {
	case w.SessionID == "":
		return ReasonNotRegistered
	case now > w.LeaseExpiry:
		return ReasonLeaseLapsed
	case !serves:
		return ReasonNamespace
	case w.Degraded:
		return ReasonDegraded
	case w.Revoked:
		return ReasonLeaseLapsed
	case w.Unconfirmed:
		return ReasonUnconfirmed
	case w.Draining:
		return ReasonDraining
	}
	if _, ok := m.drainFor(w, now); ok {
		return ReasonDraining
	}
	return ""
}

// holderLive reports whether the worker session holding p is live at now.
func (m *Machine) holderLive(p Placement, now int64) bool {
	w, ok := m.st.workers.get(p.Owner)
	return ok && w.SessionID == p.OwnerSession && w.Live(now)
}

func (m *Machine) applyClaim(c Claim) Result { return m.claim(c, nil) }

// claim grants c.Key to c.ClientID; rc, when set, is the hostname-aware
// claim c came in (see hostnames.go).
func (m *Machine) claim(c Claim, rc *ClaimRoute) Result {
	if rc != nil {
		if r, ok := m.routeBound(rc); !ok {
			return r
		}
	}
	if m.st.coldStart == 0 {
		// A fresh directory cannot know which ids old owners still serve;
		// it waits one lease TTL from the first attempt for them to lapse.
		m.st.coldStart = c.Now
	}
	p, placed := m.st.placements.get(c.Key)
	if placed && m.holderLive(p, c.Now) {
		if rc != nil {
			if r, ok := m.routeClaimHeld(rc, p); ok {
				return r
			}
		}
		if w, ok := m.st.workers.get(c.ClientID); p.Owner == c.ClientID && ok && w.SessionID == p.OwnerSession {
			return Result{Code: CodeExisting, Placement: p}
		}
		return Result{Code: CodeHeld, Placement: p}
	}
	if rc != nil {
		if r, ok := m.routeDisplaced(rc); ok {
			return r // ids already placed (above) keep serving through a displaced binding
		}
	}
	if end := m.st.coldStart + c.QuarantineMs; c.Now < end {
		return Result{Code: CodeQuarantine, RemainingMs: end - c.Now}
	}
	w, ok := m.st.workers.get(c.ClientID)
	if !ok {
		return Result{Code: CodeIneligible, Reason: ReasonUnknownWorker}
	}
	serves := rc == nil && w.Serves(c.Key.Namespace)
	if rc != nil {
		serves = w.ServesRoute(rc.Hostname, c.Key.Namespace, c.Key.Env)
	}
	if why := m.eligible(&w, serves, c.Now); why != "" {
		return Result{Code: CodeIneligible, Reason: why}
	}
	if _, removed := m.removedNow[c.Key]; removed || placed && p.Generation > m.entryGen {
		return Result{Code: CodeConflict, Reason: "key already granted in this entry"}
	}
	var took *Takeover
	if placed {
		// The holder lost this id because its lease lapsed: that session
		// must never be renewed again, even by a heartbeat stamped before
		// the lapse that arrives late (queued through a partition). It
		// re-registers and learns the id is gone.
		hw, known := m.st.workers.get(p.Owner)
		if known && hw.SessionID == p.OwnerSession && hw.ClientID != w.ClientID {
			m.st.workers.edit(p.Owner).Revoked = true
		}
		if m.onTakeover != nil {
			took = &Takeover{Key: c.Key, Owner: w.ClientID, Previous: p.Owner}
			if known {
				took.PreviousNode = hw.NodeID
			}
		}
		m.removePlacement(p)
	}
	key := c.Key
	if i := slices.Index(w.Namespaces, key.Namespace); i >= 0 {
		key.Namespace = w.Namespaces[i] // one copy of each namespace string, not one per placement
	}
	np := Placement{
		Key:          key,
		Owner:        w.ClientID, // share the worker's string, not the decoded copy
		OwnerSession: w.SessionID,
		Generation:   m.nextGeneration(c.Now),
		PlacedAt:     c.Now,
	}
	if rc != nil {
		np.Hostname = rc.Hostname
	}
	m.st.placements.set(np)
	// Each new placement takes one unit of
	// headroom until the next heartbeat reports the real figure.
	if w.Headroom > 0 {
		m.st.workers.edit(w.ClientID).Headroom--
	}
	if took != nil {
		took.Generation = np.Generation
		m.onTakeover(*took)
	}
	return Result{Code: CodeGranted, Placement: np}
}

func (m *Machine) applyRelease(c Release) Result {
	p, ok := m.st.placements.get(c.Key)
	if !ok {
		return Result{Code: CodeNotFound}
	}
	if p.Owner != c.ClientID || p.Generation != c.Generation {
		return Result{Code: CodeNotFound, Placement: p}
	}
	m.removePlacement(p)
	return Result{Code: CodeOK}
}

// applyGiveBack: CodeUnknownWorker for a client id the directory does not
// know, CodeReregister for a session that is not the worker's current one
// (deregistered, or replaced by a later registration), CodeNotFound when
// the key has no placement (given back already: a retry answers so),
// CodeHeld with the placement when another worker holds it or this one
// under another generation, else CodeOK with the placement removed.
func (m *Machine) applyGiveBack(c GiveBack) Result {
	w, known := m.st.workers.get(c.ClientID)
	switch {
	case !known:
		return Result{Code: CodeUnknownWorker}
	case w.SessionID == "" || w.SessionID != c.SessionID:
		return Result{Code: CodeReregister, Reason: "unknown or replaced session"}
	}
	p, ok := m.st.placements.get(c.Key)
	if !ok {
		return Result{Code: CodeNotFound}
	}
	if p.Owner != c.ClientID || p.OwnerSession != c.SessionID || p.Generation != c.Generation {
		return Result{Code: CodeHeld, Placement: p}
	}
	m.removePlacement(p)
	return Result{Code: CodeOK}
}

func (m *Machine) applyDrain(c DrainWorker) Result {
	if _, ok := m.st.workers.get(c.ClientID); !ok {
		return Result{Code: CodeUnknownWorker}
	}
	d := Drain{ClientID: c.ClientID, Cordon: c.Cordon, SetAt: c.Now}
	if !c.Cordon {
		d.Deadline = c.Deadline
	}
	m.st.drains[c.ClientID] = d
	return Result{Code: CodeOK, Draining: d.Active(c.Now), Drain: d}
}

func (m *Machine) applyUndrain(c UndrainWorker) Result {
	if _, ok := m.st.drains[c.ClientID]; ok {
		delete(m.st.drains, c.ClientID)
		return Result{Code: CodeOK}
	}
	if _, ok := m.st.workers.get(c.ClientID); !ok {
		return Result{Code: CodeUnknownWorker}
	}
	return Result{Code: CodeOK}
}

// nodeKnown reports whether a worker the directory knows registered with
// nodeID (the order of the walk cannot matter: it only looks).
func (m *Machine) nodeKnown(nodeID string) bool {
	for _, w := range m.st.workers.all() {
		if w.NodeID == nodeID {
			return true
		}
	}
	return false
}

func (m *Machine) applyDrainNode(c DrainNode) Result {
	if c.NodeID == "" {
		return Result{Code: CodeInvalid, Reason: "empty node id"}
	}
	if _, ok := m.st.nodeDrains[c.NodeID]; !ok && !m.nodeKnown(c.NodeID) {
		return Result{Code: CodeUnknownWorker}
	}
	d := Drain{NodeID: c.NodeID, Cordon: c.Cordon, SetAt: c.Now}
	if !c.Cordon {
		d.Deadline = c.Deadline
	}
	m.st.nodeDrains[c.NodeID] = d
	return Result{Code: CodeOK, Draining: d.Active(c.Now), Drain: d}
}

func (m *Machine) applyUndrainNode(c UndrainNode) Result {
	if c.NodeID == "" {
		return Result{Code: CodeInvalid, Reason: "empty node id"}
	}
	_, known := m.st.nodeDrains[c.NodeID]
	delete(m.st.nodeDrains, c.NodeID)
	for id, w := range m.st.workers.all() {
		if w.NodeID == c.NodeID {
			known = true
			delete(m.st.drains, id)
		}
	}
	if !known {
		return Result{Code: CodeUnknownWorker}
	}
	return Result{Code: CodeOK}
}

func (m *Machine) applyGC(c GC) Result {
	keep := c.WorkerRetentionMs
	if keep <= 0 {
		keep = DefaultWorkerRetention
	}
	var r Result
	for id, w := range m.st.workers.all() {
		// A deregistered worker is judged by the lease it held, so it stays
		// known (drainable) as long as a crashed one would.
		if c.Now-w.LeaseExpiry > keep {
			r.PlacementsDropped += m.forgetWorker(id)
			r.WorkersForgotten++
		}
	}
	for _, drains := range []map[string]Drain{m.st.drains, m.st.nodeDrains} {
		for id, d := range drains {
			if !d.Active(c.Now) {
				delete(drains, id)
				r.DrainsExpired++
			}
		}
	}
	m.collectBindings(c.Now)
	return r
}

// forgetWorker removes a worker and its placements, keeping its drain
// record; it returns how many placements went.
func (m *Machine) forgetWorker(clientID string) int {
	n := m.dropPlacementsOf(clientID)
	if w, ok := m.st.workers.get(clientID); ok && m.st.byURL[w.AdvertiseURL] == clientID {
		delete(m.st.byURL, w.AdvertiseURL)
	}
	m.st.workers.remove(clientID)
	return n
}

func (m *Machine) dropPlacementsOf(clientID string) int {
	keys := m.st.placements.keysOf(clientID)
	n := len(keys)
	for k := range keys {
		p, _ := m.st.placements.get(k)
		m.removePlacement(p)
	}
	return n
}

// removePlacement is the appliers' only way to remove a placement: it also
// notes a grant of this entry removed again (see Machine.removedNow).
func (m *Machine) removePlacement(p Placement) {
	if p.Generation > m.entryGen {
		if m.removedNow == nil {
			m.removedNow = make(map[Key]struct{})
		}
		m.removedNow[p.Key] = struct{}{}
	}
	m.st.placements.delete(p)
}

// nextGeneration issues a fencing token: strictly greater than every one
// this directory granted before, and at least the grant's time in ms × 1000.
// The time floor matters when a directory is rebuilt from scratch (a wiped
// data dir, a --dev restart) while the state store keeps the generations
// it has seen: the log index would restart at 1 and every write would be
// fenced, but the clock keeps counting. Both inputs are in the state or the
// command, so every replica computes the same token.
func (m *Machine) nextGeneration(now int64) uint64 {
	gen := m.st.lastGen + 1
	if now > 0 {
		gen = max(gen, uint64(now)*1000)
	}
	m.st.lastGen = gen
	return gen
}
