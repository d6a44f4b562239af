package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/logrepeat"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
)

// Key names an instance on this node: its id in a namespace, and the env
// that lives in (hostname-aware mode; "" in single mode).
type Key struct{ Env, Namespace, ID string }

func (k Key) String() string { return plugins.StateNamespace(k.Env, k.Namespace) + "/" + k.ID }

// Config configures a Supervisor. Zero durations take the defaults below.
type Config struct {
	Specs  []Spec
	Logger *slog.Logger
	// Registerer receives the pinned_* collectors; nil registers nothing.
	Registerer prometheus.Registerer
	// RuntimeDir holds the plugins' sockets (data sockets and go-plugin's
	// own). The caller must own it alone and hold the lock that proves no
	// other pinnedd uses it (the data dir's): Start makes it 0700 and
	// removes whatever it holds, a dead predecessor's leftovers. When its
	// socket paths would pass the 107-byte unix limit, the sockets go to a
	// short private directory instead, removed by Stop. Empty: a private
	// temporary directory, removed by Stop.
	RuntimeDir string

	// Store is the node's state store, served to plugins over the
	// go-plugin broker; nil means plugins have no durable state.
	Store statestore.Store

	DetachedTimeout    time.Duration // default 60s; a host may set its own
	HandshakeTimeout   time.Duration // default 10s
	UpgradeIdle        time.Duration // an upgraded (101) connection quiet both ways this long is closed; 0: never
	StopGrace          time.Duration // default 10s: tasks' time to return at shutdown
	BackoffMin         time.Duration // default 100ms
	BackoffMax         time.Duration // default 30s
	StablePeriod       time.Duration // default 30s: a run this long resets the crash count
	CrashLoopThreshold int           // default 3 consecutive short runs → degraded
	SwapDeadline       time.Duration // default 10s: a hot swap's wind-down of the old process
	// A watched plugin binary (Spec.Watch) is looked at every BinaryPoll
	// (default 1s); a replacement is loaded once its size, mtime, inode
	// and mode have not moved for BinarySettle (default 2s).
	BinaryPoll   time.Duration
	BinarySettle time.Duration

	// OnEvicted is called once an instance is gone for good (idle,
	// drained, shut down): release is false when its host keeps the
	// placement across idle eviction. It is not called when a plugin
	// crash takes an instance down: the id stays placed here and
	// re-activates on its next request.
	OnEvicted func(k Key, generation uint64, release bool)
	// OnDegraded is called, on a goroutine of its own, when a plugin's
	// crash loop degrades its namespaces on this node: the ids placed here
	// in them cannot be served here until it recovers, so the node gives
	// them up for other nodes to take.
	OnDegraded func(routes []Route)

	// FrontDoorURL is the node's own front door, where instances make
	// cluster calls (plugins.EnvFrontDoor in their environment).
	FrontDoorURL string
	// FrontDoorCA, with an https FrontDoorURL under a private CA, is that
	// CA (PEM), which plugins verify their cluster calls with
	// (plugins.EnvFrontDoorCA); nil: the system roots.
	FrontDoorCA []byte

	// KeepPlacementsOnIdle keeps every id placed here across idle eviction,
	// whatever its host says: with a node-local state store, its state is
	// here, and the next activation must be here too.
	KeepPlacementsOnIdle bool
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DetachedTimeout, 60*time.Second)
	def(&c.HandshakeTimeout, 10*time.Second)
	def(&c.StopGrace, 10*time.Second)
	def(&c.BackoffMin, 100*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.StablePeriod, 30*time.Second)
	def(&c.SwapDeadline, 10*time.Second)
	def(&c.BinaryPoll, time.Second)
	def(&c.BinarySettle, 2*time.Second)
	if c.CrashLoopThreshold <= 0 {
		c.CrashLoopThreshold = 3
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Supervisor runs this node's plugins and instances.
type Supervisor struct {
	cfg        Config
	metrics    *metrics
	runtimeDir string // where the plugins' sockets go
	ownDir     bool   // runtimeDir was made by Start: Stop removes it
	fallback   string // the link in Config.RuntimeDir to runtimeDir, if any

	// set is the plugins and the namespaces they serve: an immutable
	// snapshot, replaced whole when a plugin is added or removed (plugins.go).
	set      atomic.Pointer[pluginSet]
	changeMu sync.Mutex // one add or remove at a time

	mu        sync.Mutex
	instances map[Key]*instance
	counts    map[string]*NamespaceStats
	drains    map[string]drainSpec
	drainedCh chan struct{} // replaced on every change WaitDrained cares about
	stopping  bool
	started   bool

	bufs httpx.BufferPool // proxy copy buffers, shared by every plugin

	calls callCredentials // live plugin processes' cluster-call credentials

	// storeHealth judges the state store (nil without one): every call
	// through cfg.Store reports to it, and Start runs its probe.
	storeHealth *statestore.Monitor

	runCtx context.Context
	// warnings summarises WARNs that repeat while their cause lasts.
	warnings  *logrepeat.Repeats
	runCancel context.CancelFunc
	wg        sync.WaitGroup
}

// New validates the configuration; Start spawns the plugins.
func New(cfg Config) (*Supervisor, error) {
	cfg.setDefaults()
	if len(cfg.Specs) == 0 {
		return nil, errors.New("supervisor: no plugins configured")
	}
	s := &Supervisor{cfg: cfg, metrics: newMetrics(cfg.Registerer), instances: map[Key]*instance{}, counts: map[string]*NamespaceStats{},
		drains: map[string]drainSpec{}, drainedCh: make(chan struct{}), warnings: logrepeat.New(logrepeat.Window)}
	if cfg.Store != nil {
		// The one place every state-store call of this node passes (the
		// Store service plugins call, activation's load included): each has
		// a deadline shorter than a client's, and its outcome is health.
		s.storeHealth = statestore.NewMonitor(statestore.MonitorConfig{Logger: cfg.Logger})
		s.cfg.Store = statestore.Bounded(cfg.Store, statestore.CallTimeout, s.storeHealth)
		if cfg.Registerer != nil {
			cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "pinned_state_store_up",
				Help: "1 while this node's state store answers (0 once its failures have lasted the 5s grace).",
			}, func() float64 {
				if s.StoreHealth() != nil {
					return 0
				}
				return 1
			}))
		}
	}
	set := newPluginSet(nil)
	for _, sp := range cfg.Specs {
		p, err := s.newProc(set, sp)
		if err != nil {
			return nil, err
		}
		set.procs = append(set.procs, p)
	}
	s.set.Store(set)
	return s, nil
}

// Start spawns every plugin and waits for each first handshake. An error
// leaves nothing running.
func (s *Supervisor) Start(ctx context.Context) error {
	if err := s.openRuntimeDir(); err != nil {
		return fmt.Errorf("runtime dir: %w", err)
	}
	s.runCtx, s.runCancel = context.WithCancel(context.Background())
	if s.storeHealth != nil {
		if p, ok := s.cfg.Store.(statestore.Pinger); ok {
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.storeHealth.Run(s.runCtx, p) }()
		}
	}
	set := s.plugins()
	firsts := make([]chan error, len(set.procs))
	for i, p := range set.procs {
		firsts[i] = s.launch(p)
	}
	var errs []error
	for i := range set.procs {
		select {
		case err := <-firsts[i]:
			errs = append(errs, err)
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.Stop(context.Background())
		return err
	}
	next := newPluginSet(set.procs)
	for _, p := range set.procs {
		if err := next.serve(p); err != nil {
			s.Stop(context.Background())
			return err
		}
	}
	s.set.Store(next)
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	return nil
}

// Ready reports whether every plugin has completed its handshake and the
// supervisor is not stopping.
func (s *Supervisor) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started && !s.stopping
}

// StoreHealth is nil while the node's state store answers (or it has
// none), else why not: its failures have lasted the grace (5 s). While it
// is not nil, this node takes no new activations.
func (s *Supervisor) StoreHealth() error {
	if s.storeHealth == nil {
		return nil
	}
	return s.storeHealth.Err()
}

// Namespaces served on this node (under any hostname), sorted.
func (s *Supervisor) Namespaces() []string {
	served := s.plugins().served
	out := make([]string, 0, len(served))
	for ns := range served {
		out = append(out, ns)
	}
	sort.Strings(out)
	return out
}

// Serves reports whether ns is served on this node (under any hostname).
func (s *Supervisor) Serves(ns string) bool { return s.plugins().served[ns] > 0 }

// Degraded reports whether r is degraded on this node: its plugin
// crash-loops, and no request for it is served here until it recovers.
func (s *Supervisor) Degraded(r Route) bool {
	p, ok := s.plugins().byRoute[r]
	if !ok {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.degraded
}

// DegradedNamespaces are the routes degraded on this node ("/NS", or
// "HOST/NS" in hostname-aware mode), sorted.
func (s *Supervisor) DegradedNamespaces() []string {
	var out []string
	for _, r := range s.Routes() {
		if s.Degraded(r.Route) {
			out = append(out, r.String())
		}
	}
	return out
}

// Stop evicts every instance (tasks get StopGrace), ends every plugin and
// waits until their processes are gone. It is idempotent.
func (s *Supervisor) Stop(ctx context.Context) {
	s.mu.Lock()
	if s.stopping && s.runCancel == nil {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	all := make([]*instance, 0, len(s.instances))
	for _, in := range s.instances {
		all = append(all, in)
	}
	cancel := s.runCancel
	s.runCancel = nil
	s.mu.Unlock()

	var wg sync.WaitGroup
	for _, in := range all {
		wg.Add(1)
		go func() { defer wg.Done(); s.evict(ctx, in, proto.Reason_REASON_SHUTDOWN, s.cfg.StopGrace) }()
	}
	wg.Wait()
	if cancel != nil {
		cancel() // no restarts from here on
	}
	for _, p := range s.plugins().procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(s.cfg.StopGrace) }()
	}
	wg.Wait()
	s.wg.Wait()
	s.closeRuntimeDir()
}

// Reload hot-swaps the plugin serving route ("/NS", or "HOST/NS" in
// hostname-aware mode), or every plugin when route is "".
func (s *Supervisor) Reload(ctx context.Context, route string) error {
	set := s.plugins()
	if route == "" {
		var errs []error
		for _, p := range set.procs {
			errs = append(errs, p.reload(ctx))
		}
		return errors.Join(errs...)
	}
	p, ok := set.find(route)
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownNS, route)
	}
	return p.reload(ctx)
}

// instancesOn counts the live instances of one incarnation.
func (s *Supervisor) instancesOn(inc *incarnation) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, in := range s.instances {
		if in.inc == inc {
			n++
		}
	}
	return n
}

// PluginStatus is one plugin as `pinnedd status` shows it.
type PluginStatus struct {
	Name        string   `json:"name"`
	Path        string   `json:"path"`
	State       State    `json:"state"`
	PID         int      `json:"pid,omitempty"`
	Incarnation int      `json:"incarnation"`
	Restarts    int      `json:"restarts"`
	Degraded    bool     `json:"degraded"`
	Namespaces  []string `json:"namespaces"`
	// Hostname-aware mode: the hostname and env the plugin serves its
	// namespaces under, its env's takeover and its epoch.
	Hostname  string `json:"hostname,omitempty"`
	Env       string `json:"env,omitempty"`
	Takeover  string `json:"takeover,omitempty"`
	Epoch     uint64 `json:"epoch,omitempty"`
	LastError string `json:"lastError,omitempty"`
	Version   string `json:"version,omitempty"` // sha256 prefix of the binary the process runs
	// User is the account the process runs as (--plugin-user); empty: pinnedd's own.
	User string `json:"user,omitempty"`
}

// InstanceStatus is one live instance.
type InstanceStatus struct {
	// Env and Hostname, in hostname-aware mode: the env the id lives in
	// and the hostname of the plugin that runs it.
	Env         string `json:"env,omitempty"`
	Hostname    string `json:"hostname,omitempty"`
	Namespace   string `json:"namespace"`
	ID          string `json:"id"`
	Generation  uint64 `json:"generation"`
	Connections int    `json:"connections"`
	IdleMs      int64  `json:"idleMs"`
	ActivatedAt int64  `json:"activatedAt"`
	Plugin      string `json:"plugin"`
	PID         int    `json:"pid"`
	Tasks       int    `json:"tasks"`
	// DeadlineMs is when it goes (Unix ms) while it winds down (a
	// wind-down, a drain, a hot swap); absent: it is not winding down.
	DeadlineMs int64 `json:"deadlineMs,omitempty"`
}

// NamespaceStats counts a namespace's instance lifecycle on this node.
type NamespaceStats struct {
	Namespace   string `json:"namespace"`
	Activations int64  `json:"activations"`
	Evictions   int64  `json:"evictions"`
	Live        int    `json:"live"`
}

// count records an activation (+1) or eviction (-1) of ns.
func (s *Supervisor) count(ns string, activated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts[ns]
	if c == nil {
		c = &NamespaceStats{Namespace: ns}
		s.counts[ns] = c
	}
	if activated {
		c.Activations++
	} else {
		c.Evictions++
	}
}

// Stats reports per-namespace counts and the live instances with their
// tracked tasks (asked of each plugin, bounded by ctx).
func (s *Supervisor) Stats(ctx context.Context) ([]NamespaceStats, []InstanceStatus) {
	tasks := map[Key]int{}
	for _, p := range s.plugins().procs {
		inc, err := p.current()
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := inc.conn.Control.Stats(sctx, &proto.StatsRequest{})
		cancel()
		if err != nil {
			continue
		}
		for _, in := range resp.Instances {
			tasks[Key{p.spec.Bind.Env, in.Namespace, in.Id}] = int(in.Tasks)
		}
	}
	insts := s.Instances()
	for i := range insts {
		insts[i].Tasks = tasks[Key{insts[i].Env, insts[i].Namespace, insts[i].ID}]
	}
	s.mu.Lock()
	nss := make([]NamespaceStats, 0, len(s.plugins().served))
	for _, ns := range s.Namespaces() {
		c := NamespaceStats{Namespace: ns}
		if got := s.counts[ns]; got != nil {
			c = *got
		}
		nss = append(nss, c)
	}
	s.mu.Unlock()
	for i := range nss {
		for _, in := range insts {
			if in.Namespace == nss[i].Namespace {
				nss[i].Live++
			}
		}
	}
	return nss, insts
}

// Plugins reports every plugin's state.
func (s *Supervisor) Plugins() []PluginStatus {
	procs := s.plugins().procs
	out := make([]PluginStatus, 0, len(procs))
	for _, p := range procs {
		p.mu.Lock()
		st := PluginStatus{
			Name: p.spec.Name, Path: p.spec.Path, State: p.state, Incarnation: p.seq,
			Restarts: p.restarts, Degraded: p.degraded, LastError: p.lastErr,
			Namespaces: append([]string(nil), p.namespaces...),
			Hostname:   p.spec.Bind.Hostname, Env: p.spec.Bind.Env, Takeover: p.spec.Bind.Takeover, Epoch: p.spec.Bind.Epoch,
		}
		if p.spec.User != nil {
			st.User = p.spec.User.Name
		}
		var bin binStat
		if p.cur != nil {
			st.PID = p.cur.pid
			bin = p.cur.bin
		}
		p.mu.Unlock()
		if bin.present() {
			st.Version = versionOf(p.spec.Path, bin)
		}
		sort.Strings(st.Namespaces)
		out = append(out, st)
	}
	return out
}

// Instances reports the live instances, sorted by key.
func (s *Supervisor) Instances() []InstanceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := make([]InstanceStatus, 0, len(s.instances))
	for k, in := range s.instances {
		st := InstanceStatus{
			Env: k.Env, Hostname: in.inc.proc.spec.Bind.Hostname,
			Namespace: k.Namespace, ID: k.ID, Generation: in.gen, Connections: in.conns,
			ActivatedAt: in.activatedAt.UnixMilli(), Plugin: in.inc.proc.spec.Name, PID: in.inc.pid,
		}
		if in.conns == 0 {
			st.IdleMs = now.Sub(in.lastActive).Milliseconds()
		}
		if !in.deadline.IsZero() {
			st.DeadlineMs = in.deadline.UnixMilli()
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		return Key{out[i].Env, out[i].Namespace, out[i].ID}.String() < Key{out[j].Env, out[j].Namespace, out[j].ID}.String()
	})
	return out
}
