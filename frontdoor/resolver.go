package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/pinboard"
	"github.com/pinnedd/pinnedd/pinboard/directory"
	"github.com/pinnedd/pinnedd/supervisor"
)

// claimTimeout bounds how long a request waits for its placement.
const claimTimeout = 5 * time.Second

// Claim outcomes that are not placements; the router turns them into
// answers (claimFailed).
var (
	errNoBackends = errors.New("no live workers for namespace")
	errQuarantine = errors.New("cold start quarantine")
	// errStarting: this node's replica has not caught up with the leader
	// since it started, so what it lacks (workers, namespaces) proves
	// nothing. Its answer says so instead of "no live workers".
	errStarting = errors.New("this node is starting: its copy of the directory has not caught up with the cluster yet")
	// Hostname-aware mode's, in the seeds' words.
	errNoHostname    = errors.New(directory.ReasonNoHostname)
	errOtherHostname = errors.New(directory.ReasonOtherHostname)
)

// takeoverError: the id is live under another hostname of its env, whose
// takeover is wind_down. tell: the owner is to be told to wind it down by
// the fence's end (p.FenceUntil); remaining is how long the fence lasts.
type takeoverError struct {
	p         directory.Placement
	remaining time.Duration
	tell      bool
}

func (takeoverError) Error() string { return "takeover in progress, retry" }

// displacedError: the hostname's binding was displaced by a higher epoch
// less than a lease ago; nothing is placed through it for remaining.
type displacedError struct{ remaining time.Duration }

func (displacedError) Error() string { return directory.ReasonDisplaced }

// startingWait bounds how long a request on a starting node waits for its
// replica to catch up before it is answered errStarting.
const startingWait = claimTimeout

// quarantineError is a claim refused by the directory's cold-start
// quarantine, with how long it still lasts.
type quarantineError struct{ remaining time.Duration }

func (e quarantineError) Error() string { return errQuarantine.Error() }
func (e quarantineError) Unwrap() error { return errQuarantine }

// resolver says where an instance is, or places it: live on this node
// (liveHere), placed on a live worker as this node's replica shows it
// (placedOn), or claimed through the leader (claimFor). It speaks no HTTP;
// the router answers its errors.
type resolver struct {
	dir        *pinboard.Directory
	self       *pinboard.Self
	worker     *pinboard.Worker       // nil on a node without hosts
	local      *supervisor.Supervisor // nil on a node without hosts
	policy     pinboard.PlacementPolicy
	quarantine time.Duration
	// hostnames: hostname-aware mode. leaseTTL is a takeover fence's
	// length.
	hostnames bool
	leaseTTL  time.Duration
	logger    *slog.Logger
	// resolutions is pinboard_placement_resolutions_total; the parts that
	// serve a request book its outcome through counter.
	resolutions *prometheus.CounterVec
}

func newResolver(dir *pinboard.Directory, self *pinboard.Self, local *supervisor.Supervisor, policy pinboard.PlacementPolicy, quarantine time.Duration, logger *slog.Logger) *resolver {
	return &resolver{
		dir: dir, self: self, worker: self.Worker(), local: local, policy: policy, quarantine: quarantine, logger: logger,
		resolutions: newCounterVec("pinboard_placement_resolutions_total",
			"Placement resolutions at this front door, by outcome.", "outcome", resolutionOutcomes),
	}
}

// counter is resolutions{outcome}, for a part to book with on its hot path.
func (rv *resolver) counter(outcome string) prometheus.Counter {
	return rv.resolutions.WithLabelValues(outcome)
}

// collectors are the resolver's metrics, for the registry.
func (rv *resolver) collectors() []prometheus.Collector {
	return []prometheus.Collector{rv.resolutions}
}

// storeHealth is the local state store's health (nil: fine, or none).
// While it is not nil the node is not ready and takes no new placements.
func (rv *resolver) storeHealth() error {
	if rv.local == nil {
		return nil
	}
	return rv.local.StoreHealth()
}

// knownNamespace: served here, or by any worker the directory knows.
func (rv *resolver) knownNamespace(ns string) bool {
	if rv.local != nil && rv.local.Serves(ns) {
		return true
	}
	return rv.dir.Machine().NamespaceServed(ns)
}

// liveHere reports the generation key runs under on this node, if it is
// live here, and the hostname whose plugin runs it ("" in single mode):
// the first question for a request, from net/http or the kept-alive loop
// alike.
func (rv *resolver) liveHere(key directory.Key) (gen uint64, host string, live bool) {
	if rv.worker == nil || rv.local == nil {
		return 0, "", false
	}
	return rv.local.LiveGeneration(supervisor.Key(key))
}

// placedOn is key's placement through host ("" in single mode) on a live
// worker other than exclude, as this node's replica shows it (without
// waiting on an apply): the second question, for an id not live here. A
// placement through another hostname is a takeover's, for claimFor.
func (rv *resolver) placedOn(key directory.Key, host, exclude string, now time.Time) (directory.Placement, directory.Worker, bool) {
	p, owner, ok := rv.dir.Machine().Owner(key)
	if !ok || !owner.Live(now.UnixMilli()) || owner.ClientID == exclude || p.Hostname != host {
		return directory.Placement{}, directory.Worker{}, false
	}
	return p, owner, true
}

// envOf is, in hostname-aware mode, the env (host, ns) is bound to: its
// ids' env. One map look-up in the replica's published view, as
// knownNamespace is for single mode: a binding no live worker serves any
// more routes to no placement, and the claim then answers errNoHostname.
// ok false: none is bound.
func (rv *resolver) envOf(host, ns string) (string, bool) {
	b, ok := rv.dir.Machine().Binding(host, ns)
	return b.Env, ok
}

// placementHints are what a new placement may lean on (PlacementRequest);
// all empty when there is no client, as for the scanner's wakes.
type placementHints struct {
	clientIP string
	affinity *string
	caller   string // this node's worker, on a cluster call from one of its instances
}

// claimFor asks the leader (linearizably) to place key on a candidate the
// policy picks, never exclude, and returns the placement the directory
// holds afterwards: ours, or whoever already held it. In hostname-aware
// mode (host set) the claim goes through host's binding (ClaimRoute): an
// id held under another hostname of its env meets the env's takeover
// (takeoverError, errOtherHostname), and a displaced binding places
// nothing for a while (displacedError).
func (rv *resolver) claimFor(ctx context.Context, key directory.Key, host, exclude string, hints placementHints) (directory.Placement, directory.Worker, error) {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	m := rv.dir.Machine()
	tried := map[string]bool{}
	if exclude != "" {
		tried[exclude] = true
	}
	for attempt := 0; attempt < 3; attempt++ {
		now := time.Now()
		var cands []pinboard.Candidate
		ws := m.Candidates(key.Namespace, now.UnixMilli())
		if host != "" {
			key.Env, ws = m.RouteCandidates(host, key.Namespace, now.UnixMilli())
		}
		for _, wk := range ws {
			if tried[wk.ClientID] {
				continue
			}
			// Our own replica may still call us live while our lease is
			// in danger; we know better.
			if rv.worker != nil && wk.ClientID == rv.self.ID() && (rv.worker.Lease(now) != pinboard.LeaseHealthy || rv.storeHealth() != nil) {
				continue
			}
			cands = append(cands, pinboard.Candidate{ClientID: wk.ClientID, Headroom: wk.Headroom})
		}
		if len(cands) == 0 {
			return directory.Placement{}, directory.Worker{}, rv.noneFor(host)
		}
		choice, _ := rv.policy.Choose(pinboard.PlacementRequest{
			Key:         key.Env + "\x00" + key.Namespace + "\x00" + key.ID,
			ClientIP:    hints.clientIP,
			CallerID:    hints.caller,
			AffinityKey: hints.affinity,
		}, cands)
		var cmd directory.Command = directory.Claim{
			Key: key, ClientID: choice, Now: time.Now().UnixMilli(), QuarantineMs: rv.quarantine.Milliseconds(),
		}
		if host != "" {
			cmd = directory.ClaimRoute{Claim: cmd.(directory.Claim), Hostname: host, TTLMs: rv.leaseTTL.Milliseconds()}
		}
		res, err := rv.dir.Do(ctx, cmd)
		if err != nil {
			return directory.Placement{}, directory.Worker{}, err
		}
		if err := routeRefusal(res); err != nil {
			return directory.Placement{}, directory.Worker{}, err
		}
		switch res.Code {
		case directory.CodeGranted, directory.CodeExisting, directory.CodeHeld:
			owner, ok := m.Worker(res.Placement.Owner)
			if !ok {
				// The leader knows a worker our replica has not heard of
				// yet; a moment later it will.
				continue
			}
			if res.Code == directory.CodeGranted {
				rv.resolutions.WithLabelValues(outcomePlaced).Inc()
			}
			return res.Placement, owner, nil
		case directory.CodeQuarantine:
			return directory.Placement{}, directory.Worker{}, quarantineError{time.Duration(res.RemainingMs) * time.Millisecond}
		case directory.CodeIneligible:
			tried[choice] = true
		case directory.CodeConflict:
		default:
			return directory.Placement{}, directory.Worker{}, errors.New("placement refused: " + res.Code.String() + " " + res.Reason)
		}
	}
	return directory.Placement{}, directory.Worker{}, rv.noneFor(host)
}

// noneFor is the error for a claim no worker may take: errNoBackends, or
// in hostname-aware mode errNoHostname.
func (rv *resolver) noneFor(host string) error {
	if host != "" {
		return errNoHostname
	}
	return errNoBackends
}

// routeRefusal is the error for a route claim's answer that places
// nothing for this request (nil for the others).
func routeRefusal(res directory.Result) error {
	remaining := time.Duration(res.RemainingMs) * time.Millisecond
	switch {
	case res.Code == directory.CodeTakeover:
		return takeoverError{p: res.Placement, remaining: remaining, tell: res.Reason != ""}
	case res.Code == directory.CodeHeld && res.Reason == directory.ReasonOtherHostname:
		return errOtherHostname
	case res.Code == directory.CodeIneligible && res.Reason == directory.ReasonDisplaced:
		return displacedError{remaining}
	case res.Code == directory.CodeIneligible && res.Reason == directory.ReasonNoHostname:
		return errNoHostname
	}
	return nil
}

// noBackends says why no worker may take a new placement in ns: none is
// live, or every live one is draining (this node, when it is the only
// one), or each is degraded, draining or renewing its lease. All but the
// draining answers start "no live workers" (a stable prefix).
func (rv *resolver) noBackends(ns string, now time.Time) string {
	m := rv.dir.Machine()
	ms := now.UnixMilli()
	live, draining, selfDraining := 0, 0, false
	for _, wk := range m.Workers() {
		if !wk.Live(ms) || !wk.Serves(ns) {
			continue
		}
		live++
		src, _ := pinboard.DrainSources(m, wk, ms)
		self := wk.ClientID == rv.self.ID()
		if self && len(src) == 0 && rv.worker.SelfDraining() {
			src = []string{pinboard.DrainSourceLocal} // our heartbeat has not told the directory yet
		}
		if len(src) > 0 {
			draining++
			selfDraining = selfDraining || self
		}
	}
	switch {
	case live == 0:
		return "no live workers for namespace " + ns
	case draining == live && live == 1 && selfDraining:
		return "this node is draining: it takes no new instances of " + ns + " (pinnedd undrain ends the drain)"
	case draining == live:
		return fmt.Sprintf("every live worker for namespace %s is draining (%d of %d)", ns, draining, live)
	}
	return fmt.Sprintf("no live workers for namespace %s can take a new instance: %d of %d draining, the rest degraded or renewing their lease", ns, draining, live)
}

// hostFor is the hostname a placement of key without a request goes
// through: none in single mode; in hostname-aware mode the first hostname
// bound to key's env for its namespace that a worker may be placed
// through. ok false: none.
func (rv *resolver) hostFor(key directory.Key, now time.Time) (string, bool) {
	if !rv.hostnames {
		return "", true
	}
	bs, _ := rv.dir.Machine().Bindings()
	for _, b := range bs {
		if b.Namespace != key.Namespace || b.Env != key.Env {
			continue
		}
		if env, ws := rv.dir.Machine().RouteCandidates(b.Hostname, b.Namespace, now.UnixMilli()); env == key.Env && len(ws) > 0 {
			return b.Hostname, true
		}
	}
	return "", false
}

// placeToWake is Wake's directory side: key's placement, claimed on a
// live worker, when it needs waking (unplaced, or its owner's lease
// lapsed); needed is false when a live owner holds it already.
func (rv *resolver) placeToWake(ctx context.Context, key directory.Key) (p directory.Placement, owner directory.Worker, needed bool, err error) {
	if _, owner, ok := rv.dir.Machine().Owner(key); ok && owner.Live(time.Now().UnixMilli()) {
		return directory.Placement{}, directory.Worker{}, false, nil // its owner resumes it
	}
	host, ok := rv.hostFor(key, time.Now())
	if !ok {
		return directory.Placement{}, directory.Worker{}, false, errNoHostname
	}
	p, owner, err = rv.claimFor(ctx, key, host, "", placementHints{})
	return p, owner, err == nil, err
}

// releaseRefused gives back p, whose owner refused a request in-band, so
// the retry can place it elsewhere.
func (rv *resolver) releaseRefused(ctx context.Context, p directory.Placement) {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	_, _ = rv.dir.Do(ctx, directory.Release{Key: p.Key, ClientID: p.Owner, Generation: p.Generation})
}

// release gives back this worker's placement of key under generation (an
// instance evicted here: FrontDoor.Released).
func (rv *resolver) release(key directory.Key, generation uint64) {
	if rv.worker.Lease(time.Now()) == pinboard.LeaseExpired {
		// Our session is lapsing anyway, and with it the placement; a
		// directory we cannot renew with would not take the release either.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := rv.dir.Do(ctx, directory.Release{Key: key, ClientID: rv.worker.ClientID(), Generation: generation}); err != nil {
		rv.logger.Warn("release placement failed", "instance", key.String(), "err", err)
	}
}
