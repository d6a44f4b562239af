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
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// Spec says how to start one plugin binary.
type Spec struct {
	// Name tags the plugin in logs, metrics and status.
	Name string
	Path string
	Args []string
	Env  []string
	// Namespaces the operator expects this binary to serve (from
	// --plugin /ns=path). Empty: whatever it describes.
	Namespaces []string
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
	tr      *http.Transport // streamed uploads and upgrades
	fast    *unixTransport  // everything else
	started time.Time
	cancel  context.CancelFunc // ends the Events stream
	dead    chan struct{}      // closed once the process is gone
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
	orphans    []orphan // instances the last crash took down
}

// errors a caller maps to responses.
var (
	ErrPluginDown     = errors.New("plugin is not running")
	ErrDegraded       = errors.New("namespace degraded on this node")
	ErrStopping       = errors.New("supervisor is stopping")
	ErrUnknownNS      = errors.New("unknown namespace")
	ErrActivation     = errors.New("activation failed")
	ErrInstanceGone   = errors.New("instance is gone")
	errHandshakeHosts = errors.New("plugin does not serve the configured namespace")
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

	socket := filepath.Join(s.runtimeDir, fmt.Sprintf("%s-%d.sock", p.spec.Name, seq))
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Env = append(cmd.Env,
		plugins.EnvDataSocket+"="+socket,
		plugins.EnvParentPID+"="+strconv.Itoa(os.Getpid()),
		plugins.EnvPluginName+"="+p.spec.Name,
	)
	// The child gets SIGKILL when the thread that forked it dies; the
	// spawning goroutine is locked to its thread below, and Go never ends
	// an unlocked thread, so in practice this fires when pinnedd dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	logger := p.logger.With("incarnation", seq)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugins.Handshake,
		Plugins:          plugins.PluginSet(nil),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		StartTimeout:     s.cfg.HandshakeTimeout,
		Logger:           hclogAdapter(logger),
		Stderr:           &lineLogger{logger: logger},
	})
	runtime.LockOSThread()
	rpc, err := client.Client()
	runtime.UnlockOSThread()
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("start plugin %s: %w", p.spec.Name, err)
	}
	raw, err := rpc.Dispense(plugins.PluginName)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("dispense plugin %s: %w", p.spec.Name, err)
	}
	conn := raw.(*plugins.Conn)
	storeID := s.serveStore(&incarnation{conn: conn})
	dctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	desc, err := conn.Control.Describe(dctx, &proto.DescribeRequest{StoreBrokerId: storeID})
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
		proc: p, seq: seq, client: client, conn: conn, pid: int(desc.Pid),
		socket: desc.DataSocket, hosts: hosts, started: time.Now(), dead: make(chan struct{}),
	}
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
	inc.fast = newUnixTransport(desc.DataSocket, inc.tr)
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

// watch consumes the Events stream; its end means the process is going.
func (p *pluginProc) watch(inc *incarnation, events proto.Control_EventsClient) {
	for {
		ev, err := events.Recv()
		if err != nil {
			break
		}
		switch ev.Kind {
		case proto.EventKind_EVENT_KIND_EVICT_ME:
			go p.sup.evictKey(Key{ev.Namespace, ev.Id}, inc, proto.Reason_REASON_IDLE, true)
		case proto.EventKind_EVENT_KIND_FENCED:
			p.sup.dropFenced(Key{ev.Namespace, ev.Id}, inc)
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
	inc.tr.CloseIdleConnections()
	inc.fast.close()
	_ = os.Remove(inc.socket)
	p.mu.Lock()
	if p.cur == inc {
		p.cur = nil
	}
	p.mu.Unlock()
	p.sup.metrics.pluginUp.WithLabelValues(p.spec.Name).Set(0)
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
			stable := time.NewTimer(cfg.StablePeriod)
			select {
			case <-inc.dead:
			case <-ctx.Done():
				stable.Stop()
				return
			case <-stable.C:
				p.mu.Lock()
				p.crashes, p.degraded = 0, false
				p.mu.Unlock()
				select {
				case <-inc.dead:
				case <-ctx.Done():
					return
				}
			}
			stable.Stop()
			uptime = time.Since(inc.started)
			p.logger.Error("plugin exited unexpectedly", "pid", inc.pid, "uptime", uptime.Round(time.Millisecond))
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
			p.logger.Error("plugin is crash-looping; its namespaces are degraded on this node", "crashes", p.crashes)
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
	p.mu.Lock()
	inc := p.cur
	p.state = StateStopped
	p.mu.Unlock()
	if inc == nil {
		return
	}
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
