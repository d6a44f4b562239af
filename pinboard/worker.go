package pinboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
)

// Lease timing defaults: a lease lasts 15 s, renewed every 3 s, and is
// unhealthy from 5 s before it expires.
const (
	DefaultLeaseTTL          = 15 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultLeaseBuffer       = 5 * time.Second
)

// LeaseBuffer is how long before its expiry a lease of ttl turns
// unhealthy by default: DefaultLeaseBuffer, at most a third of the TTL so
// short TTLs stay sensible.
func LeaseBuffer(ttl time.Duration) time.Duration { return min(DefaultLeaseBuffer, ttl/3) }

// LeaseState is the worker's own view of its lease. The worker acts on it
// by itself: safety never depends on the directory reaching this process.
type LeaseState int

// Lease states, from the worker's own clock.
const (
	// LeaseUnregistered: no registration has succeeded yet.
	LeaseUnregistered LeaseState = iota
	// LeaseHealthy: an ack arrived before expires_at - buffer. Serves everything.
	LeaseHealthy
	// LeaseUnhealthy: no ack inside that window. Live instances keep
	// serving; new activations are refused.
	LeaseUnhealthy
	// LeaseExpired: past expires_at. Every instance request is refused;
	// the directory may re-place the ids.
	LeaseExpired
)

func (s LeaseState) String() string {
	return [...]string{"unregistered", "healthy", "unhealthy", "expired"}[s]
}

// WorkerConfig configures this node's worker.
type WorkerConfig struct {
	NodeID       string
	AdvertiseURL string
	Namespaces   []string
	TTL          time.Duration // asked of the directory; default 15s
	Interval     time.Duration // heartbeat interval; default 3s
	// Buffer before expires_at at which the lease turns unhealthy; default
	// 5s, capped at a third of the TTL so short test TTLs stay sensible.
	Buffer   time.Duration
	Headroom func() int64
	Logger   *slog.Logger
	// LiveIDs lists the instances running here, sent with a
	// re-registration so the directory can say which are no longer ours.
	LiveIDs func() []InstanceKey
	// OnDuplicates is told the ids a re-registration found we no longer
	// own; the caller quits them.
	OnDuplicates func([]InstanceKey)
	// StateFile, if set, remembers this process's client and session id.
	// The next process on the same data dir (which holds the Raft lock, so
	// the previous one is certainly gone) deregisters that session first,
	// so a restarted node takes its advertise URL back at once instead of
	// waiting out the dead session's lease.
	StateFile string
	// Draining, if set, also reports a drain of this node by itself that
	// did not come through SetLocalDrain (FrontDoor.Drain); heartbeats
	// carry either so placements skip us.
	Draining func() bool
	// OnOperatorDrain is told, on every ack, the operator drain in force
	// for this worker (active false: none). Drains ride heartbeat acks.
	OnOperatorDrain func(active bool, deadline time.Time, cordon bool)
	// Routes, in hostname-aware mode, lists what this node serves (its
	// plugins' hostnames); read at every registration, so routes come and
	// go with plugins. Namespaces is then empty.
	Routes func() []RouteSpec
	// OnSuperseded is told the routes the directory refused (a binding at
	// a higher epoch) or superseded (a higher epoch rebound them), and
	// why: the caller stops serving them (aborts their instances). The
	// worker registers without them from then on.
	OnSuperseded func(routes []RouteSpec, why string)
}

// Worker holds this node's registration and lease.
type Worker struct {
	cfg       WorkerConfig
	clientID  string
	registrar Registrar

	mu        sync.Mutex
	sessionID string
	expiresAt time.Time
	degraded  bool
	draining  bool  // an operator drain is in force (the last ack said so)
	drainDL   int64 // its deadline, unix ms (0 with a cordon)
	cordoned  bool
	local     localDrain
	flaps     int
	reregs    int
	// keys are the attestation keys (attestKeys), read on every owner-side
	// request without w.mu.
	keys atomic.Pointer[workerKeys]

	challenges map[string]string // recent challenge -> value
	order      []string

	// dropped are the routes the directory refused or superseded, with
	// why: registrations leave them out, status and readiness report them.
	dropped []DroppedRoute
	// namespaces are what registrations announce (cfg.Namespaces, then
	// SetNamespaces), nsGen counts their changes and registeredGen is the
	// count the last registration announced; kick asks Run to register
	// again at once.
	namespaces    []string
	nsGen         int
	registeredGen int
	kick          chan struct{}

	// unfit, if set, says why this node must take no new placements
	// (its state store is unavailable); nil: it may.
	unfit atomic.Pointer[func() error]
}

// setUnfit makes heartbeats report the worker degraded while fn returns
// an error (the front door sets it from its Instances' StoreHealth).
func (w *Worker) setUnfit(fn func() error) { w.unfit.Store(&fn) }

// heartbeatChallenge is the challenge a heartbeat offers: none while the
// worker is unfit, so the directory's probe fails and marks it degraded:
// new placements skip it (the mechanism a crash-looping node's failed
// probe uses), while its lease renews and its instances keep serving.
func (w *Worker) heartbeatChallenge() Challenge {
	if fn := w.unfit.Load(); fn != nil && (*fn)() != nil {
		return Challenge{}
	}
	return w.newChallenge()
}

// NewWorker mints this process's client id; Run registers it.
func NewWorker(cfg WorkerConfig, r Registrar) *Worker {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultHeartbeatInterval
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = LeaseBuffer(cfg.TTL)
	}
	cfg.Buffer = min(cfg.Buffer, cfg.TTL/3)
	if cfg.Headroom == nil {
		cfg.Headroom = func() int64 { return 1024 }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Worker{cfg: cfg, clientID: newID(), registrar: r, challenges: map[string]string{},
		namespaces: slices.Clone(cfg.Namespaces), kick: make(chan struct{}, 1)}
}

// SetNamespaces changes what this worker serves (a plugin added or
// removed at run time) and has Run register again at once, so the
// directory places the new namespaces here and lets go of the old ones.
func (w *Worker) SetNamespaces(nss []string) {
	w.mu.Lock()
	w.namespaces = slices.Clone(nss)
	w.nsGen++
	w.mu.Unlock()
	w.Reregister()
}

// SetNamespacesAndWait is SetNamespaces that returns once a registration
// announced them (or ctx ends): from then on the directory places nothing
// new here in a namespace left out.
func (w *Worker) SetNamespacesAndWait(ctx context.Context, nss []string) error {
	w.SetNamespaces(nss)
	w.mu.Lock()
	gen := w.nsGen
	w.mu.Unlock()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		w.mu.Lock()
		done := w.registeredGen >= gen
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("register the new namespaces: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Reregister has Run register again at once (also what Routes returns is
// read then).
func (w *Worker) Reregister() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// maxChallenges bounds the pairs a worker remembers; probes answer within
// one request, so a handful covers retries.
const maxChallenges = 16

// newChallenge mints the pair for one registration or heartbeat.
func (w *Worker) newChallenge() Challenge {
	c := Challenge{Challenge: newID(), ChallengeValue: newID()}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.challenges[c.Challenge] = c.ChallengeValue
	w.order = append(w.order, c.Challenge)
	if len(w.order) > maxChallenges {
		delete(w.challenges, w.order[0])
		w.order = w.order[1:]
	}
	return c
}

// ServeChallenge answers GET /_pinned/challenge?challenge=... with the value
// only this process knows, or 404.
func (w *Worker) ServeChallenge(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	v, ok := w.challenges[r.URL.Query().Get("challenge")]
	w.mu.Unlock()
	if !ok {
		httpx.WriteError(rw, http.StatusNotFound, "unknown challenge", 0)
		return
	}
	rw.Header().Set("Content-Type", "text/plain")
	rw.Header().Set("Cache-Control", "no-store")
	_, _ = rw.Write([]byte(v))
}

// newID returns 16 random bytes in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ClientID is minted per process start.
func (w *Worker) ClientID() string { return w.clientID }

// workerKeys are the session's attestation key (RegisterAck.AttestationKey)
// and the previous session's, replaced at prevSince.
type workerKeys struct {
	cur, prev []byte
	prevSince time.Time
}

// attestKeys are the keys attestations for this worker are checked with:
// the session's, and the previous session's for window after the
// re-registration replaced it (a front door whose replica has not applied
// the new session yet still signs with that one). Either may be nil.
func (w *Worker) attestKeys(now time.Time, window time.Duration) (cur, prev []byte) {
	k := w.keys.Load()
	if k == nil {
		return nil, nil
	}
	if k.prev != nil && now.Sub(k.prevSince) <= window {
		prev = k.prev
	}
	return k.cur, prev
}

// SessionID is the current registration's session, "" before the first.
func (w *Worker) SessionID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sessionID
}

// Lease reports the lease state at now.
func (w *Worker) Lease(now time.Time) LeaseState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leaseLocked(now)
}

func (w *Worker) leaseLocked(now time.Time) LeaseState {
	switch {
	case w.expiresAt.IsZero():
		return LeaseUnregistered
	case now.After(w.expiresAt):
		return LeaseExpired
	case now.After(w.expiresAt.Add(-w.cfg.Buffer)):
		return LeaseUnhealthy
	default:
		return LeaseHealthy
	}
}

// ExpiresAt is the worker's own lease expiry (zero before registration).
func (w *Worker) ExpiresAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.expiresAt
}

// Run registers (retrying with capped backoff) and heartbeats until ctx
// ends. It does not deregister: the caller does that after evicting.
func (w *Worker) Run(ctx context.Context) {
	w.retirePrevious(ctx)
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := 100 * time.Millisecond
	for {
		reregister := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
			reregister = true
		}
		// Each attempt is bounded so a directory without a leader cannot
		// stall renewals: the next try comes at the next interval.
		actx, cancel := context.WithTimeout(ctx, max(w.cfg.Interval, time.Second))
		var err error
		// A worker past its own lease re-registers rather than heartbeats:
		// ids may have moved meanwhile, and only a registration reports
		// them (a heartbeat could even revive the lapsed session).
		if reregister || w.SessionID() == "" || w.Lease(time.Now()) == LeaseExpired {
			err = w.register(actx)
		} else {
			err = w.heartbeat(actx)
			if errors.Is(err, ErrReregister) {
				err = w.register(actx)
			}
		}
		cancel()
		next := w.cfg.Interval
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.cfg.Logger.Warn("lease renewal failed", "err", err, "lease", w.Lease(time.Now()).String())
			if w.SessionID() == "" {
				next, backoff = backoff, min(2*backoff, 30*time.Second)
			} else {
				// Keep trying quicker than the interval while the lease
				// is in danger.
				next = min(w.cfg.Interval, w.cfg.Buffer/2)
			}
		} else {
			backoff = 100 * time.Millisecond
		}
		t.Reset(next)
	}
}

// ErrReregister means the directory lost our session: register again at once.
var ErrReregister = errors.New("directory asks to re-register")

func (w *Worker) register(ctx context.Context) error {
	sent := time.Now()
	w.mu.Lock()
	nss, gen := slices.Clone(w.namespaces), w.nsGen
	w.mu.Unlock()
	req := RegisterRequest{
		ClientID: w.clientID, NodeID: w.cfg.NodeID, AdvertiseURL: w.cfg.AdvertiseURL,
		Namespaces: nss, Headroom: w.cfg.Headroom(), Challenge: w.newChallenge(),
		Draining: w.SelfDraining(),
	}
	if w.cfg.Routes != nil {
		req.Routes = w.liveRoutes()
		if len(req.Routes) == 0 {
			return ErrNoRoutes
		}
	}
	if w.cfg.LiveIDs != nil {
		req.LiveIDs = w.cfg.LiveIDs()
	}
	ack, err := w.registrar.Register(ctx, req)
	var re *RouteError
	if errors.As(err, &re) && errors.Is(err, ErrBindingConflict) && len(re.Routes) != 0 {
		// Serve the rest: this route waits for an operator (a higher
		// epoch, or the plugin removed).
		w.drop(re.Routes, re.Error())
		return w.register(ctx)
	}
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	// Quit the ids we no longer own before the new lease lets anything be
	// served: until then a lapsed lease keeps refusing.
	if len(ack.Duplicates) > 0 && w.cfg.OnDuplicates != nil {
		w.cfg.OnDuplicates(ack.Duplicates)
	}
	key, err := decodeAttestationKey(ack.AttestationKey)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	w.mu.Lock()
	first := w.sessionID == ""
	w.sessionID = ack.SessionID
	w.registeredGen = max(w.registeredGen, gen)
	next := &workerKeys{cur: key}
	if old := w.keys.Load(); old != nil {
		next.prev, next.prevSince = old.cur, time.Now()
	}
	w.keys.Store(next)
	if !first {
		w.reregs++
	}
	w.acceptLocked(sent, ack.Ack)
	w.mu.Unlock()
	w.remember(ack.SessionID)
	w.tellDrain(ack.Ack)
	if first {
		w.cfg.Logger.Info("worker registered", "client_id", w.clientID, "session_id", ack.SessionID, "expires_in_ms", ack.ExpiresInMs)
	} else {
		w.cfg.Logger.Info("worker re-registered", "client_id", w.clientID, "session_id", ack.SessionID, "duplicates", len(ack.Duplicates))
	}
	return nil
}

func (w *Worker) heartbeat(ctx context.Context) error {
	sent := time.Now()
	ack, err := w.registrar.Heartbeat(ctx, HeartbeatRequest{
		ClientID: w.clientID, SessionID: w.SessionID(), Headroom: w.cfg.Headroom(), Challenge: w.heartbeatChallenge(),
		Draining: w.SelfDraining(),
	})
	var re *RouteError
	superseded := errors.As(err, &re) && errors.Is(err, ErrSuperseded)
	if err != nil && !superseded {
		return fmt.Errorf("heartbeat: %w", err)
	}
	w.mu.Lock()
	w.acceptLocked(sent, ack)
	w.mu.Unlock()
	w.tellDrain(ack)
	if superseded {
		// The seeds' superseded nack: stop serving those routes, and
		// register without them (the directory's record still lists them).
		w.drop(re.Routes, re.Error())
		return ErrReregister
	}
	return nil
}

// ErrNoRoutes: in hostname-aware mode, every route this node had was
// refused or superseded, or it has none: it registers nothing.
var ErrNoRoutes = errors.New("no routes to register: every plugin's hostname is superseded or refused, or none is configured")

// DroppedRoute is a route the directory refused or superseded.
type DroppedRoute struct {
	RouteSpec
	Reason string `json:"reason"`
}

// drop records routes as refused or superseded and tells the caller.
func (w *Worker) drop(routes []RouteSpec, why string) {
	w.mu.Lock()
	for _, r := range routes {
		if !slices.ContainsFunc(w.dropped, func(d DroppedRoute) bool { return sameRoute(d.RouteSpec, r) }) {
			w.dropped = append(w.dropped, DroppedRoute{RouteSpec: r, Reason: why})
		}
	}
	w.mu.Unlock()
	w.cfg.Logger.Warn("routes superseded: this node stops serving them", "routes", routeNames(routes), "reason", why)
	if w.cfg.OnSuperseded != nil {
		w.cfg.OnSuperseded(routes, why)
	}
}

// liveRoutes are the configured routes minus the dropped ones.
func (w *Worker) liveRoutes() []RouteSpec {
	rs := w.cfg.Routes()
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(rs), func(r RouteSpec) bool {
		return slices.ContainsFunc(w.dropped, func(d DroppedRoute) bool { return sameRoute(d.RouteSpec, r) })
	})
}

// Dropped lists the routes the directory refused or superseded.
func (w *Worker) Dropped() []DroppedRoute {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.dropped)
}

// Forget clears a dropped route (its plugin was removed, or re-added at a
// higher epoch): a later registration may list it again.
func (w *Worker) Forget(r RouteSpec) {
	w.mu.Lock()
	w.dropped = slices.DeleteFunc(w.dropped, func(d DroppedRoute) bool { return sameRoute(d.RouteSpec, r) })
	w.mu.Unlock()
}

// localDrain is this node's drain by itself (a local `pinnedd drain`,
// SIGTERM).
type localDrain struct {
	active   bool
	deadline time.Time // zero with cordon
	cordon   bool
}

// Drain sources, as status, /registry/workers and pinned_draining name them.
const (
	DrainSourceLocal    = "local"    // this node drains by itself
	DrainSourceOperator = "operator" // POST /registry/drain, riding heartbeat acks
)

// SetLocalDrain records this node's own drain (a zero deadline and no
// cordon revoke it) and logs when one starts or ends. The next heartbeat
// carries it to the directory, so placements skip this worker.
func (w *Worker) SetLocalDrain(deadline time.Time, cordon bool) {
	next := localDrain{active: cordon || !deadline.IsZero(), cordon: cordon}
	if !cordon {
		next.deadline = deadline
	}
	w.mu.Lock()
	prev := w.local
	w.local = next
	w.mu.Unlock()
	switch {
	case next.active && (!prev.active || prev != next):
		w.logDrain(true, DrainSourceLocal, next.deadline, next.cordon)
	case !next.active && prev.active:
		w.logDrain(false, DrainSourceLocal, time.Time{}, false)
	}
}

// logDrain is the one line a drain's start (or change) and end leave.
func (w *Worker) logDrain(started bool, source string, deadline time.Time, cordon bool) {
	if !started {
		w.cfg.Logger.Info("drain ended", "source", source, "client_id", w.clientID)
		return
	}
	args := []any{"source", source, "client_id", w.clientID, "cordon", cordon}
	if !cordon {
		args = append(args, "deadline", deadline.UTC().Format(time.RFC3339), "in", time.Until(deadline).Round(time.Second).String())
	}
	w.cfg.Logger.Info("drain started", args...)
}

func (w *Worker) SelfDraining() bool {
	w.mu.Lock()
	active := w.local.active
	w.mu.Unlock()
	return active || w.cfg.Draining != nil && w.cfg.Draining()
}

// DrainingBy reports whether a drain from source (DrainSourceLocal,
// DrainSourceOperator) is in force, as this worker knows it.
func (w *Worker) DrainingBy(source string) bool {
	switch source {
	case DrainSourceLocal:
		return w.SelfDraining()
	case DrainSourceOperator:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.draining
	}
	return false
}

// tellDrain passes the operator drain an ack carries to the node.
func (w *Worker) tellDrain(ack Ack) {
	if w.cfg.OnOperatorDrain == nil {
		return
	}
	var dl time.Time
	if ack.Draining && !ack.Cordoned {
		dl = time.UnixMilli(ack.DrainDeadline)
	}
	w.cfg.OnOperatorDrain(ack.Draining, dl, ack.Cordoned)
}

// Heartbeat now (after a local drain starts, say) rather than at the next
// interval; errors are left to the regular loop.
func (w *Worker) HeartbeatNow(ctx context.Context) {
	if w.SessionID() == "" {
		return
	}
	_ = w.heartbeat(ctx)
}

// acceptLocked re-anchors the lease on the ack: expires_at = send time +
// expiresInMs, so the worker's expiry is never later than the directory's.
func (w *Worker) acceptLocked(sent time.Time, ack Ack) {
	before := w.leaseLocked(time.Now())
	w.expiresAt = sent.Add(time.Duration(ack.ExpiresInMs) * time.Millisecond)
	w.degraded = ack.Degraded
	changed := w.draining != ack.Draining || ack.Draining && (w.drainDL != ack.DrainDeadline || w.cordoned != ack.Cordoned)
	w.draining = ack.Draining
	w.drainDL = ack.DrainDeadline
	w.cordoned = ack.Cordoned
	if changed {
		w.logDrain(ack.Draining, DrainSourceOperator, time.UnixMilli(ack.DrainDeadline), ack.Cordoned)
	}
	after := w.leaseLocked(time.Now())
	if before != after && before != LeaseUnregistered {
		w.flaps++
		w.cfg.Logger.Info("lease restored", "from", before.String(), "to", after.String())
	}
}

type workerState struct {
	ClientID  string `json:"clientId"`
	SessionID string `json:"sessionId"`
}

// remember records the current session in StateFile (atomically).
func (w *Worker) remember(sessionID string) {
	if w.cfg.StateFile == "" {
		return
	}
	b, _ := json.Marshal(workerState{ClientID: w.clientID, SessionID: sessionID})
	tmp := w.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		w.cfg.Logger.Warn("remember worker session", "err", err)
		return
	}
	if err := os.Rename(tmp, w.cfg.StateFile); err != nil {
		w.cfg.Logger.Warn("remember worker session", "err", err)
	}
}

// retirePrevious deregisters the session the previous process on this data
// dir left behind (see WorkerConfig.StateFile).
func (w *Worker) retirePrevious(ctx context.Context) {
	if w.cfg.StateFile == "" {
		return
	}
	b, err := os.ReadFile(w.cfg.StateFile)
	if err != nil {
		return
	}
	var prev workerState
	if json.Unmarshal(b, &prev) != nil || prev.ClientID == "" || prev.ClientID == w.clientID {
		return
	}
	// The directory may not be reachable yet (no leader); keep trying for
	// a while, since until this lands the old session holds our URL.
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		err := w.registrar.Deregister(ctx, prev.ClientID, prev.SessionID)
		if err == nil {
			w.cfg.Logger.Info("retired the previous process's worker session", "client_id", prev.ClientID)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		if delay >= 2*time.Second {
			w.cfg.Logger.Warn("could not retire the previous worker session; its lease will lapse", "client_id", prev.ClientID, "err", err)
			return
		}
	}
}

// Deregister ends the session so the directory forgets our placements.
func (w *Worker) Deregister(ctx context.Context) error {
	sid := w.SessionID()
	if sid == "" || w.Lease(time.Now()) == LeaseExpired {
		return nil // nothing to end, or the directory already let it lapse
	}
	err := w.registrar.Deregister(ctx, w.clientID, sid)
	w.mu.Lock()
	w.sessionID = ""
	w.expiresAt = time.Time{}
	w.mu.Unlock()
	return err
}

// WorkerStatus is the worker as status endpoints report it. Draining is
// true while any drain is in force; DrainSources names them ("local",
// "operator"), DrainDeadline is the earliest deadline in force (unix ms),
// Cordoned says a drain has none.
type WorkerStatus struct {
	ClientID       string   `json:"clientId"`
	SessionID      string   `json:"sessionId"`
	Lease          string   `json:"lease"`
	ExpiresInMs    int64    `json:"expiresInMs"`
	Degraded       bool     `json:"degraded"`
	Draining       bool     `json:"draining"`
	DrainSources   []string `json:"drainSources,omitempty"`
	Cordoned       bool     `json:"cordoned,omitempty"`
	DrainDeadline  int64    `json:"drainDeadline,omitempty"`
	LeaseFlaps     int      `json:"leaseFlaps"`
	Reregistations int      `json:"reregistrations"`
	// Superseded: hostname-aware routes the directory refused or
	// superseded; the node serves them no more.
	Superseded []DroppedRoute `json:"superseded,omitempty"`
}

// Status reports the worker's state.
func (w *Worker) Status() WorkerStatus {
	external := w.cfg.Draining != nil && w.cfg.Draining() // outside w.mu: it takes the supervisor's lock
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	st := WorkerStatus{
		ClientID: w.clientID, SessionID: w.sessionID, Lease: w.leaseLocked(now).String(),
		Degraded: w.degraded, LeaseFlaps: w.flaps, Reregistations: w.reregs,
		Superseded: slices.Clone(w.dropped),
	}
	if w.local.active || external {
		st.DrainSources = append(st.DrainSources, DrainSourceLocal)
		st.Cordoned = st.Cordoned || w.local.cordon
		if !w.local.deadline.IsZero() {
			st.DrainDeadline = w.local.deadline.UnixMilli()
		}
	}
	if w.draining {
		st.DrainSources = append(st.DrainSources, DrainSourceOperator)
		st.Cordoned = st.Cordoned || w.cordoned
		if w.drainDL != 0 && (st.DrainDeadline == 0 || w.drainDL < st.DrainDeadline) {
			st.DrainDeadline = w.drainDL
		}
	}
	st.Draining = len(st.DrainSources) > 0
	if !w.expiresAt.IsZero() {
		st.ExpiresInMs = max(0, w.expiresAt.Sub(now).Milliseconds())
	}
	return st
}
