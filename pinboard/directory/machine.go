package directory

import (
	"bytes"
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// Machine is the directory state machine. Apply and Restore serialize on
// the write side of mu. The front door's per-request reads (Owner, Placement,
// Worker, Workers, NamespaceServed, Secret) take no lock: they read the view
// published after each entry. The other reads take mu's read side. Every
// read returns copies, so a caller can never reach (or race on) internal
// state.
type Machine struct {
	mu   sync.RWMutex
	st   state
	view atomic.Pointer[view]

	// Scratch of the entry being applied, guarded by mu's write side.
	index uint64
	// A key is granted at most once per entry (a second claim answers
	// CodeConflict), so one batch cannot flip an id between workers.
	// Generations only grow, so a placement newer than entryGen (the last
	// generation before this entry) was granted in it; removedNow keeps
	// the few such placements the entry also removed.
	entryGen   uint64
	removedNow map[Key]struct{}

	onTakeover func(Takeover) // see OnTakeover; guarded by mu's write side
	open       SecretOpener   // see SetSecretOpener
}

// SecretOpener turns the secret as recorded into the secret, nil if it
// cannot; stale says it opened with a token being rotated out (Reseal).
type SecretOpener func(recorded []byte) (secret []byte, stale bool)

// view is what the lock-free reads see. The placement table is the live
// one (its readers see committed entries only); workers and secret are as
// of the last entry that changed them, and never modified once published.
type view struct {
	placements *placementTable
	workers    map[string]*Worker
	secret     *secretBox // shared by the views of one recorded secret
	bindings   map[hostNS]Binding
}

// secretBox is the secret as recorded, opened (SetSecretOpener) when first
// read: not as each entry applies, so a log replayed from before a token
// rotation does not try the records the rotation replaced.
type secretBox struct {
	recorded []byte
	open     SecretOpener
	once     sync.Once
	secret   []byte
	stale    bool
}

func (b *secretBox) opened() ([]byte, bool) {
	b.once.Do(func() {
		switch {
		case len(b.recorded) == 0:
		case b.open == nil:
			b.secret = b.recorded
		default:
			b.secret, b.stale = b.open(b.recorded)
		}
	})
	return b.secret, b.stale
}

// Takeover is a claim that took an id from a worker whose lease had lapsed
// (or whose session ended without releasing it).
type Takeover struct {
	Key          Key
	Generation   uint64 // the new placement's
	Owner        string // client id that got the id
	Previous     string // client id that held it
	PreviousNode string // the node id that worker registered with ("" if unknown)
}

// SetSecretOpener sets how the secret as recorded (Init's or Reseal's,
// which its proposer may have sealed) becomes the secret Secret returns;
// nil for the bytes it cannot open. Without one the recorded bytes are the
// secret. It must be set before the first entry is applied (or restored).
// Only readers' view depends on it, never the state.
func (m *Machine) SetSecretOpener(open SecretOpener) {
	m.mu.Lock()
	m.open = open
	m.mu.Unlock()
}

// OnTakeover sets fn to be told of every takeover this machine applies,
// after the state changed. It is a side channel for logging: the state
// never depends on it. fn runs under the machine's lock, so it must return
// quickly and must not call the Machine. nil removes it.
func (m *Machine) OnTakeover(fn func(Takeover)) {
	m.mu.Lock()
	m.onTakeover = fn
	m.mu.Unlock()
}

type state struct {
	applied uint64
	lastGen uint64 // the newest placement generation granted
	// clock is the latest Now of any command applied: the directory's
	// own notion of how far time got while a leader committed.
	clock      int64
	coldStart  int64
	secret     []byte
	workers    *workerTable
	byURL      map[string]string // advertise URL -> client id holding it
	placements *placementTable
	drains     map[string]Drain // by client id
	nodeDrains map[string]Drain // by node id
	// Hostname-aware mode (hostnames.go). bindingsChanged: an applier
	// changed bindings since the last publish.
	bindings        map[hostNS]Binding
	bindingsChanged bool
	envs            map[string]EnvPolicy
}

func newState() state {
	return state{
		workers:    newWorkerTable(),
		byURL:      make(map[string]string),
		placements: newPlacementTable(),
		drains:     make(map[string]Drain),
		nodeDrains: make(map[string]Drain),
		bindings:   make(map[hostNS]Binding),
		envs:       make(map[string]EnvPolicy),
	}
}

// New returns an empty directory: no secret, no workers, cold start unstamped.
func New() *Machine {
	m := &Machine{st: newState()}
	m.publish()
	return m
}

// Apply applies one log entry at index and returns the encoded Result
// (DecodeResult reads it). It never fails: bad input becomes CodeError and
// leaves the state as it was, so every node answers the same way.
func (m *Machine) Apply(index uint64, cmd []byte) []byte {
	c, err := DecodeCommand(cmd)
	m.mu.Lock()
	r := m.applyLocked(index, c, err)
	m.mu.Unlock()
	return EncodeResult(r)
}

func (m *Machine) applyLocked(index uint64, c Command, decodeErr error) Result {
	if index <= m.st.applied {
		// An entry applied twice would apply its commands twice.
		return Result{Code: CodeError, Reason: "index not above the applied index"}
	}
	m.st.applied = index
	if decodeErr != nil {
		return Result{Code: CodeError, Reason: decodeErr.Error()}
	}
	if c == nil {
		return Result{Code: CodeError, Reason: "nil command"}
	}
	m.index = index
	m.entryGen = m.st.lastGen
	r := m.exec(c, false)
	if len(m.removedNow) != 0 {
		clear(m.removedNow)
	}
	m.publish()
	return r
}

// publish shows readers the state the applier left: first the workers and
// secret (when they changed), then the placements, so a reader that finds
// a placement and then loads the view sees the worker it names as of that
// entry or a later one. Callers hold mu's write side.
func (m *Machine) publish() {
	old := m.view.Load()
	workers, changed := m.st.workers.publish()
	// The secret goes from unset to set, is sealed anew (Reseal), or is
	// replaced along with the placement table by Restore.
	sameSecret := old != nil && bytes.Equal(old.secret.recorded, m.st.secret)
	if changed || old == nil || old.placements != m.st.placements || !sameSecret || m.st.bindingsChanged {
		v := &view{placements: m.st.placements, workers: workers, secret: &secretBox{recorded: m.st.secret, open: m.open}}
		if sameSecret {
			v.secret = old.secret // opened once
		}
		if !changed && old != nil {
			v.workers = old.workers
		}
		if m.st.bindingsChanged || old == nil || old.placements != m.st.placements {
			v.bindings = maps.Clone(m.st.bindings) // rare: registrations that bind something new
		} else {
			v.bindings = old.bindings
		}
		m.st.bindingsChanged = false
		m.view.Store(v)
	}
	m.st.placements.commit()
}

func (m *Machine) exec(c Command, inBatch bool) Result {
	if now := commandNow(c); now > m.st.clock {
		m.st.clock = now
	}
	switch c := c.(type) {
	case Init:
		return m.applyInit(c)
	case Reseal:
		return m.applyReseal(c)
	case Register:
		return m.applyRegister(c)
	case Heartbeat:
		return m.applyHeartbeat(c)
	case Deregister:
		return m.applyDeregister(c)
	case Claim:
		return m.applyClaim(c)
	case RegisterRoutes:
		return m.applyRegisterRoutes(c)
	case ClaimRoute:
		return m.applyClaimRoute(c)
	case Release:
		return m.applyRelease(c)
	case GiveBack:
		return m.applyGiveBack(c)
	case DrainWorker:
		return m.applyDrain(c)
	case UndrainWorker:
		return m.applyUndrain(c)
	case DrainNode:
		return m.applyDrainNode(c)
	case UndrainNode:
		return m.applyUndrainNode(c)
	case GC:
		return m.applyGC(c)
	case RenewLeases:
		return m.applyRenewLeases(c)
	case Batch:
		if inBatch {
			return Result{Code: CodeError, Reason: ErrNestedBatch.Error()}
		}
		rs := make([]Result, len(c.Commands))
		for i, sub := range c.Commands {
			rs[i] = m.exec(sub, true)
		}
		return Result{Code: CodeOK, Results: rs}
	case Opaque:
		if c.Ignorable {
			return Result{Code: CodeUnknownCommand}
		}
		return Result{Code: CodeError, Reason: ErrUnknownCommand.Error()}
	}
	return Result{Code: CodeError, Reason: ErrUnknownCommand.Error()}
}

// commandNow is the time c carries, 0 if it carries none (a batch's
// commands advance the clock one by one).
func commandNow(c Command) int64 {
	switch c := c.(type) {
	case Register:
		return c.Now
	case Heartbeat:
		return c.Now
	case Claim:
		return c.Now
	case RegisterRoutes:
		return c.Now
	case ClaimRoute:
		return c.Now
	case DrainWorker:
		return c.Now
	case DrainNode:
		return c.Now
	case GC:
		return c.Now
	}
	return 0 // RenewLeases reads the clock before its own Now counts
}

// Placement returns the placement of key, if any. It says nothing about the
// owner's lease: check Worker(p.Owner).Live(now) before routing to it.
func (m *Machine) Placement(key Key) (Placement, bool) {
	return m.view.Load().placements.load(key)
}

// Worker returns the worker record of clientID.
func (m *Machine) Worker(clientID string) (Worker, bool) {
	w, ok := m.view.Load().workers[clientID]
	if !ok {
		return Worker{}, false
	}
	return *w, true
}

// Owner returns the placement of key together with its owner's record (the
// front door's hot path). The owner's record is as of the entry that made
// the placement or a later one; a record whose session is not the
// placement's is not returned.
func (m *Machine) Owner(key Key) (Placement, Worker, bool) {
	p, ok := m.view.Load().placements.load(key)
	if !ok {
		return Placement{}, Worker{}, false
	}
	// Loaded after the placement: publish stores workers before placements.
	w, ok := m.view.Load().workers[p.Owner]
	if !ok || w.SessionID != p.OwnerSession {
		return p, Worker{}, true
	}
	return p, *w, true
}

// NamespaceServed reports whether any known worker serves ns (by
// namespace, or through a route). The
// front door asks it for every request to a namespace this node does not
// host, so it reads in place instead of copying the workers.
func (m *Machine) NamespaceServed(ns string) bool {
	for _, w := range m.view.Load().workers {
		if w.Serves(ns) || slices.ContainsFunc(w.Routes, func(r Route) bool { return r.Namespace == ns }) {
			return true
		}
	}
	return false
}

// Workers returns every known worker, sorted by client id.
func (m *Machine) Workers() []Worker {
	published := m.view.Load().workers
	ws := make([]Worker, 0, len(published))
	for _, w := range published {
		ws = append(ws, *w)
	}
	slices.SortFunc(ws, func(a, b Worker) int { return cmp.Compare(a.ClientID, b.ClientID) })
	return ws
}

// Candidates returns the workers a new placement in namespace ns may go to
// at now: live, serving ns, not draining, not degraded; sorted by client id.
func (m *Machine) Candidates(ns string, now int64) []Worker {
	m.mu.RLock()
	var ws []Worker
	for _, w := range m.st.workers.all() {
		if m.eligible(w, w.Serves(ns), now) == "" {
			ws = append(ws, *w)
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(ws, func(a, b Worker) int { return cmp.Compare(a.ClientID, b.ClientID) })
	return ws
}

// DrainOf returns the drain record of clientID, whether or not it is still
// in force (see Drain.Active).
func (m *Machine) DrainOf(clientID string) (Drain, bool) {
	m.mu.RLock()
	d, ok := m.st.drains[clientID]
	m.mu.RUnlock()
	return d, ok
}

// NodeDrainOf returns the drain record of node id nodeID, whether or not
// it is still in force.
func (m *Machine) NodeDrainOf(nodeID string) (Drain, bool) {
	m.mu.RLock()
	d, ok := m.st.nodeDrains[nodeID]
	m.mu.RUnlock()
	return d, ok
}

// DrainFor returns the operator drain in force on w at now: the record of
// its client id or of its node id (the stricter when both are). Placement,
// lease renewal and every listing judge a worker's drain by it.
func (m *Machine) DrainFor(w Worker, now int64) (Drain, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.drainFor(&w, now)
}

// Drains returns every drain record: those of client ids sorted by client
// id, then those of node ids sorted by node id.
func (m *Machine) Drains() []Drain {
	m.mu.RLock()
	ds := make([]Drain, 0, len(m.st.drains)+len(m.st.nodeDrains))
	for _, d := range m.st.drains {
		ds = append(ds, d)
	}
	for _, d := range m.st.nodeDrains {
		ds = append(ds, d)
	}
	m.mu.RUnlock()
	slices.SortFunc(ds, compareDrains)
	return ds
}

func compareDrains(a, b Drain) int {
	if c := cmp.Compare(a.NodeID, b.NodeID); c != 0 {
		return c
	}
	return cmp.Compare(a.ClientID, b.ClientID)
}

// ColdStart returns the unix ms of the first placement attempt on this
// directory, 0 before it.
func (m *Machine) ColdStart() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.coldStart
}

// QuarantineMs returns how long placements stay refused at now for a
// quarantine of quarantineMs: 0 before the first attempt and after it ends
// (quarantineMs on GET /registry/health).
func (m *Machine) QuarantineMs(now, quarantineMs int64) int64 {
	cs := m.ColdStart()
	if cs == 0 {
		return 0
	}
	return max(0, cs+quarantineMs-now)
}

// Secret returns the cluster secret, nil before Init. It is set once (a
// Reseal records the same secret sealed anew) and never modified, so this
// is the Machine's own slice, not a copy (every forwarded request reads
// it): callers must not modify it.
func (m *Machine) Secret() []byte {
	s, _ := m.view.Load().secret.opened()
	return s
}

// SecretStale reports whether the secret opened with a token being rotated
// out: a leader records it again sealed under its own (Reseal).
func (m *Machine) SecretStale() bool {
	_, stale := m.view.Load().secret.opened()
	return stale
}

// AppliedIndex returns the index of the last entry applied (or restored).
func (m *Machine) AppliedIndex() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.applied
}

// LivePlacements returns every placement and the newest generation granted, both as of one
// entry: a placement with a generation at or below newest that is not listed is gone for good,
// and every later one has a greater generation. The state store's fence collection rests on it.
func (m *Machine) LivePlacements() (ps []Placement, newest uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ps = make([]Placement, 0, m.st.placements.n)
	m.st.placements.each(func(p Placement) { ps = append(ps, p) })
	return ps, m.st.lastGen
}

// PlacementsOf returns the placements owned by clientID, sorted by key.
func (m *Machine) PlacementsOf(clientID string) []Placement {
	m.mu.RLock()
	keys := m.st.placements.keysOf(clientID)
	ps := make([]Placement, 0, len(keys))
	for k := range keys {
		p, _ := m.st.placements.get(k)
		ps = append(ps, p)
	}
	m.mu.RUnlock()
	slices.SortFunc(ps, func(a, b Placement) int { return a.Key.Compare(b.Key) })
	return ps
}

// Len returns the number of workers and placements, for metrics.
func (m *Machine) Len() (workers, placements int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.workers.len(), m.st.placements.n
}
