package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
	"github.com/pinnedd/pinnedd/statestore"
)

// Spec says how to start one plugin binary.
type Spec struct {
	// Name tags the plugin in logs, metrics and status.
	Name string
	Path string
	Args []string
	// Env is this plugin's own environment (KEY=VALUE), on top of the
	// allow-listed part of pinnedd's (plugins.AllowedEnv): what the
	// operator passes per plugin (ParsePluginEnv, ApplyPluginEnv). A
	// pinnedd secret in it (PINBOARD_*, DATABASE_URL) is dropped, logged.
	Env []string
	// Namespaces the operator expects this binary to serve (from
	// --plugin /ns=path). Empty: whatever it describes.
	Namespaces []string
	// Watch reloads the plugin (hot swap) when the binary at Path is
	// replaced by a different one (Config.BinaryPoll, BinarySettle).
	Watch bool
	// User is the account the plugin process runs as (LookupUser,
	// ApplyPluginUsers); pinnedd must then run as root. nil: pinnedd's own.
	User *User
	// Bind is the plugin's hostname-aware binding (zero in single mode):
	// its namespaces are served under Bind.Hostname, their ids live in
	// Bind.Env.
	Bind Binding
}

// State of a plugin process, as status reports it.
type State string

// Plugin states.
const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StateBackoff  State = "backoff"
	StateStopped  State = "stopped"
)

// incarnation is one run of a plugin binary.
type incarnation struct {
	proc    *pluginProc
	seq     int
	client  *goplugin.Client
	conn    *plugins.Conn
	pid     int
	socket  string
	hosts   map[string]*proto.HostInfo
	proxy   *httputil.ReverseProxy
	tr      *http.Transport      // streamed uploads and upgrades
	fast    *httpx.SyncTransport // everything else
	started time.Time
	cancel  context.CancelFunc // ends the Events stream

	// Per-process secrets, handed over in Describe (see privilege.go).
	socketSecret string
	callToken    string
	dead         chan struct{} // closed once the process is gone

	// A hot swap retires an incarnation: no new activations, its
	// instances wind down by retireBy, then it is stopped on purpose.
	retired  atomic.Bool
	retireBy time.Time
	bin      binStat // the binary this incarnation runs
}

func (inc *incarnation) alive() bool {
	select {
	case <-inc.dead:
		return false
	default:
		return true
	}
}

// pluginProc supervises one plugin binary across its incarnations.
type pluginProc struct {
	sup    *Supervisor
	spec   Spec
	logger *slog.Logger

	mu         sync.Mutex
	cur        *incarnation // nil while down
	state      State
	seq        int
	crashes    int // consecutive short-lived runs
	restarts   int
	degraded   bool
	namespaces []string
	lastErr    string
	orphans    []orphan       // instances to bring back in the current incarnation
	swapped    chan struct{}  // closed and replaced by every hot swap
	reloadMu   sync.Mutex     // one swap at a time
	retiring   sync.WaitGroup // old processes a swap is winding down
	// cancelRun ends run's loop (launch): no restart after the process
	// ends, as when the plugin is removed.
	cancelRun context.CancelFunc
}

// errors a caller maps to responses.
var (
	ErrPluginDown = errors.New("plugin is not running")
	ErrDegraded   = errors.New("namespace degraded on this node")
	ErrStopping   = errors.New("supervisor is stopping")
	ErrUnknownNS  = errors.New("unknown namespace")
	// ErrOtherRoute: the instance is live here, run by the plugin of
	// another hostname of its env; a takeover moves it.
	ErrOtherRoute = errors.New("instance live here under another hostname")
	ErrActivation = errors.New("activation failed")
	// ErrStoreUnavailable: the instance could not load its state (the
	// state store failed or did not answer in time), or the store has been
	// failing for its grace: nothing ran, retry later. It is
	// statestore.ErrUnavailable, whose errors say why.
	ErrStoreUnavailable = statestore.ErrUnavailable
	errHandshakeHosts   = errors.New("plugin does not serve the configured namespace")
)

// current returns the serving incarnation, or why there is none.
func (p *pluginProc) current() (*incarnation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.degraded {
		return nil, ErrDegraded
	}
	if p.cur == nil || !p.cur.alive() {
		return nil, ErrPluginDown
	}
	return p.cur, nil
}

// spawn starts one incarnation and completes the handshake.
func (p *pluginProc) spawn(ctx context.Context) (*incarnation, error) {
	s := p.sup
	p.mu.Lock()
	p.seq++
	seq := p.seq
	p.state = StateStarting
	p.mu.Unlock()

	bin := statBinary(p.spec.Path)
	logger := p.logger.With("incarnation", seq)
	client := p.newClient(seq, logger)
	runtime.LockOSThread()
	rpc, err := client.Client()
	runtime.UnlockOSThread()
	if err != nil {
		client.Kill()
		if xerr := p.spec.CheckExecutable(); xerr != nil {
			// A binary replaced since the start (a hot swap) by one its
			// user cannot run: say that, not exec's "permission denied".
			err = xerr
		}
		return nil, fmt.Errorf("start plugin %s: %w", p.spec.Name, err)
	}
	raw, err := rpc.Dispense(plugins.PluginName)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("start plugin %s: %w", p.spec.Name, err)
	}
	conn := raw.(*plugins.Conn)
	storeID := s.serveStore(p, conn, logger)
	socketSecret, callToken := newSecret(), newSecret()
	dctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	desc, err := conn.Control.Describe(dctx, &proto.DescribeRequest{
		StoreBrokerId: storeID, SocketSecret: socketSecret, ClusterCallToken: callToken,
	})
	cancel()
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("describe plugin %s: %w", p.spec.Name, err)
	}
	hosts := map[string]*proto.HostInfo{}
	for _, h := range desc.Hosts {
		hosts[h.Namespace] = h
	}
	for _, ns := range p.spec.Namespaces {
		if hosts[ns] == nil {
			client.Kill()
			return nil, fmt.Errorf("%w: %s does not describe %s", errHandshakeHosts, p.spec.Name, ns)
		}
	}
	if desc.DataSocket == "" {
		client.Kill()
		return nil, fmt.Errorf("plugin %s: no data socket", p.spec.Name)
	}

	inc := &incarnation{
		proc: p, seq: seq, client: client, conn: conn, pid: int(desc.Pid), bin: bin,
		socket: desc.DataSocket, hosts: hosts, started: time.Now(), dead: make(chan struct{}),
		socketSecret: socketSecret, callToken: callToken,
	}
	s.calls.add(callToken, inc)
	inc.dialTransports()
	inc.proxy = s.newProxy(inc)

	ectx, ecancel := context.WithCancel(context.Background())
	inc.cancel = ecancel
	events, err := conn.Control.Events(ectx, &proto.EventsRequest{})
	if err == nil {
		var first *proto.Event
		first, err = events.Recv()
		if err == nil && first.Kind != proto.EventKind_EVENT_KIND_READY {
			err = fmt.Errorf("first event is %v, want READY", first.Kind)
		}
	}
	if err != nil {
		ecancel()
		s.calls.remove(callToken)
		client.Kill()
		return nil, fmt.Errorf("plugin %s events: %w", p.spec.Name, err)
	}
	go p.watch(inc, events)

	p.mu.Lock()
	p.cur = inc
	p.state = StateRunning
	p.lastErr = ""
	if p.namespaces == nil {
		// Serve what the operator configured; a binary may describe more
		// hosts than this node is asked to run.
		p.namespaces = append(p.namespaces, p.spec.Namespaces...)
		if len(p.namespaces) == 0 {
			for ns := range hosts {
				p.namespaces = append(p.namespaces, ns)
			}
		}
	}
	p.mu.Unlock()
	s.metrics.pluginUp.WithLabelValues(p.spec.Name).Set(1)
	logger.Info("plugin started", "pid", inc.pid, "namespaces", len(hosts), "sdk", desc.SdkVersion)
	return inc, nil
}

// newClient is go-plugin's client for incarnation seq: the command (its
// environment without pinnedd's secrets, its user, a death signal) and the
// handshake's terms.
func (p *pluginProc) newClient(seq int, logger *slog.Logger) *goplugin.Client {
	s := p.sup
	dir := s.socketDir(p)
	socket := filepath.Join(dir, fmt.Sprintf("%s-%d.sock", p.spec.Name, seq))
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	env, dropped := pluginEnv(os.Environ(), p.spec.Env, p.pinnedEnv(socket, dir))
	if len(dropped) > 0 {
		p.logger.Warn("not passed to the plugin: pinnedd's secrets never reach plugins", "variables", dropped)
	}
	cmd.Env = env
	// The child gets SIGKILL when the thread that forked it dies; the
	// spawning goroutine is locked to its thread while it starts (spawn), and Go never ends
	// an unlocked thread, so in practice this fires when pinnedd dies.
	// With a Spec.User, the process gets that user's uid, primary gid and
	// supplementary groups (the kernel sets the death signal after them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: p.spec.credential()}
	var sockets *goplugin.UnixSocketConfig
	if u := p.spec.User; u != nil {
		// pinnedd's broker sockets (the Store service the plugin dials)
		// are made in pinnedd's temporary directory: give them the
		// plugin's group so its user can connect.
		sockets = &goplugin.UnixSocketConfig{Group: strconv.FormatUint(uint64(u.GID), 10)}
	}

	return goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: plugins.Handshake,
		// A plugin of an older protocol version completes the handshake
		// and is refused at Dispense, by name (plugins.ErrProtocolVersion).
		VersionedPlugins: plugins.HostVersions(),
		Cmd:              cmd,
		// go-plugin would otherwise add all of os.Environ() to cmd.Env.
		SkipHostEnv: true,
		// The control and broker sockets sit in a directory other
		// processes of pinnedd's user can reach: with mutual TLS (a key
		// made per process, never in the environment) only pinnedd can
		// call Describe, Activate or the Store service there.
		AutoMTLS:         true,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		UnixSocketConfig: sockets,
		StartTimeout:     s.cfg.HandshakeTimeout,
		Logger:           hclogAdapter(logger),
		Stderr:           &lineLogger{logger: logger},
	})
}

// dialTransports makes the incarnation's transports to its data socket:
// net/http's, and the synchronous one in front of it.
func (inc *incarnation) dialTransports() {
	inc.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", inc.socket)
		},
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	inc.fast = &httpx.SyncTransport{
		Dial: func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", inc.socket)
		},
		Fallback: inc.tr,
	}
}

// watch consumes the Events stream; its end means the process is going.
func (p *pluginProc) watch(inc *incarnation, events proto.Control_EventsClient) {
	for {
		ev, err := events.Recv()
		if err != nil {
			break
		}
		switch ev.Kind {
		case proto.EventKind_EVENT_KIND_EVICT_ME:
			go p.sup.evictKey(Key{p.spec.Bind.Env, ev.Namespace, ev.Id}, inc, proto.Reason_REASON_IDLE)
		case proto.EventKind_EVENT_KIND_FENCED:
			p.sup.dropFenced(Key{p.spec.Bind.Env, ev.Namespace, ev.Id}, inc)
		}
	}
	// The stream ends a moment before go-plugin reaps the process; give it
	// that moment, then make sure.
	deadline := time.Now().Add(3 * time.Second)
	for !inc.client.Exited() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !inc.client.Exited() {
		inc.client.Kill()
	}
	p.sup.calls.remove(inc.callToken)
	inc.tr.CloseIdleConnections()
	inc.fast.Close()
	_ = os.Remove(inc.socket)
	p.mu.Lock()
	if p.cur == inc {
		p.cur = nil
		p.sup.metrics.pluginUp.WithLabelValues(p.spec.Name).Set(0)
	}
	p.mu.Unlock()
	close(inc.dead)
	p.sup.dropIncarnation(inc)
}

// run keeps the plugin running until ctx ends. first receives the outcome
// of the first start.
func (p *pluginProc) run(ctx context.Context, first chan<- error) {
	cfg := p.sup.cfg
	for attempt := 0; ; attempt++ {
		inc, err := p.spawn(ctx)
		if first != nil {
			first <- err
			first = nil
			if err != nil {
				return
			}
		}
		var uptime time.Duration
		if err == nil && attempt > 0 {
			go p.sup.reactivate(p)
		}
		if err == nil {
			died, crashed := p.watchCurrent(ctx, inc)
			if !crashed {
				return
			}
			uptime = time.Since(died.started)
			p.logger.Error("plugin exited unexpectedly", "pid", died.pid, "uptime", uptime.Round(time.Millisecond))
		} else {
			p.logger.Error("plugin failed to start", "err", err)
		}
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		if err != nil {
			p.lastErr = err.Error()
		}
		if uptime >= cfg.StablePeriod {
			p.crashes = 0
		}
		p.crashes++
		if p.crashes >= cfg.CrashLoopThreshold && !p.degraded {
			p.degraded = true
			p.logger.Error("plugin is crash-looping; its namespaces are degraded on this node", "crashes", p.crashes, "namespaces", p.namespaces)
			if cfg.OnDegraded != nil {
				go cfg.OnDegraded(routesOf(p.spec.Bind.Hostname, p.namespaces))
			}
		}
		delay := backoff(p.crashes, cfg.BackoffMin, cfg.BackoffMax)
		p.state = StateBackoff
		p.restarts++
		p.mu.Unlock()
		p.sup.metrics.restarts.WithLabelValues(p.spec.Name).Inc()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchCurrent follows the serving incarnation until it dies unexpectedly
// (crashed true) or ctx ends. A hot swap replaces the incarnation under
// watch; a retired one stopping on purpose is not a crash. It also resets
// the crash count after a stable period, and reloads the plugin when its
// binary is replaced on disk (Spec.Watch, see binWatch).
func (p *pluginProc) watchCurrent(ctx context.Context, last *incarnation) (*incarnation, bool) {
	stable := time.NewTimer(p.sup.cfg.StablePeriod)
	defer stable.Stop()
	var (
		tick     <-chan time.Time
		bw       *binWatch
		reloaded chan error // non-nil while a reload for a changed binary runs
	)
	if p.spec.Watch {
		t := time.NewTicker(p.sup.cfg.BinaryPoll)
		defer t.Stop()
		tick = t.C
		bw = &binWatch{path: p.spec.Path, settle: p.sup.cfg.BinarySettle, logger: p.logger}
	}
	for {
		p.mu.Lock()
		cur, swapped := p.cur, p.swapped
		p.mu.Unlock()
		if cur == nil {
			return last, true
		}
		last = cur
		select {
		case <-cur.dead:
			if !cur.retired.Load() {
				return cur, true
			}
		case <-swapped:
		case <-stable.C:
			p.recovered()
		case err := <-reloaded:
			reloaded = nil
			if err != nil {
				p.logger.Error("reload after binary change failed; the old process keeps serving", "path", p.spec.Path, "err", err)
			}
		case now := <-tick:
			if reloaded != nil {
				break // one reload at a time; the next poll looks again
			}
			p.mu.Lock()
			running := cur.bin
			p.mu.Unlock()
			switch next, act := bw.poll(now, running); act {
			case binReload:
				p.logger.Info("plugin binary changed; reloading", "path", p.spec.Path, "old_pid", cur.pid)
				reloaded = make(chan error, 1)
				go func() { reloaded <- p.reload(ctx) }()
			case binSameContent:
				// Same bytes under a new stat (touch, a redeploy of the
				// same build): the process already runs this version.
				p.mu.Lock()
				cur.bin = next
				p.mu.Unlock()
			}
		case <-ctx.Done():
			return nil, false
		}
	}
}

// recovered clears the crash count after a stable run, and says so once
// when that ends a degradation.
func (p *pluginProc) recovered() {
	p.mu.Lock()
	was := p.degraded
	p.crashes, p.degraded = 0, false
	nss := append([]string(nil), p.namespaces...)
	p.mu.Unlock()
	if was {
		p.logger.Info("plugin recovered; namespace no longer degraded", "namespaces", nss, "stable_for", p.sup.cfg.StablePeriod)
	}
}

// reload hot-swaps the plugin: a new process starts and takes every new
// activation; the old one's instances wind down (by SwapDeadline) and come
// back in the new process at once; then the old process is stopped. If the
// new binary fails to start, the old process keeps serving.
func (p *pluginProc) reload(ctx context.Context) error {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	s := p.sup
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		// Stop may already have stopped this plugin: a process spawned
		// now would outlive it.
		return fmt.Errorf("reload %s: %w", p.spec.Name, ErrStopping)
	}
	p.mu.Lock()
	old := p.cur
	p.mu.Unlock()
	if _, err := p.spawn(ctx); err != nil {
		p.mu.Lock()
		if old != nil && old.alive() {
			p.state = StateRunning
		}
		p.lastErr = err.Error()
		p.mu.Unlock()
		return fmt.Errorf("reload %s: %w", p.spec.Name, err)
	}
	p.mu.Lock()
	close(p.swapped)
	p.swapped = make(chan struct{})
	p.mu.Unlock()
	if old == nil {
		return nil
	}
	s.mu.Lock()
	old.retireBy = time.Now().Add(s.cfg.SwapDeadline)
	old.retired.Store(true)
	acts := s.recomputeLocked()
	s.mu.Unlock()
	s.run(acts)
	p.logger.Info("plugin reloaded; old process winding down", "old_pid", old.pid, "deadline", s.cfg.SwapDeadline)
	p.retiring.Add(1) // under reloadMu: stop waits for it
	go func() {
		defer p.retiring.Done()
		// Wait until the old process serves nothing (or its deadline and
		// a little grace passed), then stop it.
		limit := time.Now().Add(s.cfg.SwapDeadline + 2*deadlineGrace)
		for s.instancesOn(old) > 0 && time.Now().Before(limit) {
			time.Sleep(20 * time.Millisecond)
		}
		p.stopIncarnation(old, s.cfg.StopGrace)
	}()
	return nil
}

// backoff is min·2^(n-1), capped at max.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// stop ends the current incarnation: a Shutdown RPC lets instances stop
// within grace, then go-plugin's Kill (graceful, then SIGKILL).
func (p *pluginProc) stop(grace time.Duration) {
	p.reloadMu.Lock() // no swap half-done underneath
	defer p.reloadMu.Unlock()
	p.mu.Lock()
	inc := p.cur
	p.state = StateStopped
	p.mu.Unlock()
	if inc != nil {
		p.stopIncarnation(inc, grace)
	}
	// Processes a hot swap retired end too before Stop returns.
	p.retiring.Wait()
}

// stopIncarnation ends one process: Shutdown lets its instances stop
// within grace, then go-plugin's Kill.
func (p *pluginProc) stopIncarnation(inc *incarnation, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace+time.Second)
	_, err := inc.conn.Control.Shutdown(ctx, &proto.ShutdownRequest{GraceMs: grace.Milliseconds()})
	cancel()
	if err != nil && inc.alive() {
		p.logger.Warn("plugin shutdown RPC failed; killing", "err", err)
	}
	inc.cancel()
	inc.client.Kill()
	<-inc.dead
}
