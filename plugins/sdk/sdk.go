package sdk

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinnedd/pinnedd/plugins"
)

// Version is reported to pinnedd in Describe.
const Version = "0.1.0"

// Host builds the instances of one namespace.
type Host struct {
	// New builds the instance inst.ID(). The handler serves the instance's
	// routes with paths relative to the instance: a request for
	// /counters/alice/increment reaches it as /increment.
	//
	// The handler may implement the hooks Starter (before its first
	// request), WindDowner (told of an eviction deadline: drain, operator
	// wind-down, hot swap), Idler (asked before an idle eviction) and
	// Stopper (last); see the package doc for their order.
	New func(inst *Instance) (http.Handler, error)
	// DetachedTimeout: an instance with no request or stream open for this
	// long is evicted. 0 leaves pinnedd's default.
	DetachedTimeout time.Duration
	// KeepPlacementOnIdle keeps the id placed on this node across idle
	// eviction, where its placement would otherwise be released.
	KeepPlacementOnIdle bool
	// Trays maps a tray namespace to the handler that executes its work
	// items (see Tray.Append). Trays of other namespaces hold fields only:
	// items appended to them are never run.
	Trays map[string]TrayHandler
}

// Starter is implemented by an instance handler that must do work before its
// first request (restore state, start tasks). An error fails the activation
// and the request that caused it.
type Starter interface {
	Start(ctx context.Context) error
}

// Idler is implemented by an instance handler that wants a say when it goes
// idle: returning true keeps it resident. Drains, swaps and shutdowns do not
// ask.
type Idler interface {
	Idle(ctx context.Context) (keep bool)
}

// Stopper is implemented by an instance handler that must clean up. Stop runs
// after the instance context is cancelled and its tracked tasks returned (or
// the grace period passed).
type Stopper interface {
	Stop(ctx context.Context)
}

// WindDowner is implemented by an instance handler that wants to know it
// will be evicted at deadline (drain, operator wind-down, hot swap), for
// example to stop taking new work.
type WindDowner interface {
	WindDown(ctx context.Context, deadline time.Time)
}

// ErrWindingDown is what EvictionCheckpoint returns once the instance is
// being wound down: tracked work should stop at that point and leave the
// rest to the next activation (durable work is redelivered there).
var ErrWindingDown = errors.New("instance is winding down")

// Instance is what a host's instance sees of itself.
type Instance struct {
	ns, id      string
	generation  uint64
	activatedAt time.Time
	ctx         context.Context
	cancel      context.CancelFunc
	logger      *slog.Logger

	tasks  sync.WaitGroup
	ntasks atomic.Int32
	// tasksMu orders Go's Add before stop's Wait: once stopping is set,
	// Go starts nothing (the context is cancelled anyway).
	tasksMu  sync.Mutex
	stopping bool
	// windDown is the eviction deadline in unix ms, 0 when none.
	windDown atomic.Int64

	requestEviction func()
	onFenced        func()
	onReset         func()
	// clusterToken is the process's cluster-call credential (from
	// Describe), "" outside pinnedd.
	clusterToken func() string
	attached     sync.Map // see Attach
	fenceOnce    sync.Once
	resetOnce    sync.Once

	state *state
}

// fenced stops an instance whose write was fenced: a newer activation owns
// the id now, so this one must do nothing more.
func (i *Instance) fenced() {
	i.fenceOnce.Do(func() {
		i.logger.Warn("instance fenced by a newer activation; stopping")
		i.cancel()
		if i.onFenced != nil {
			i.onFenced()
		}
	})
}

// reset replaces an instance whose commit failed with a fresh activation
// loaded from the store: its memory may hold writes the store never took,
// and answering from it could reveal them. By its return the runtime
// routes no new request to i.
func (i *Instance) reset() {
	i.resetOnce.Do(func() {
		i.cancel()
		if i.onReset != nil {
			i.onReset()
		}
	})
}

// RequestEviction asks pinnedd to evict this instance as soon as it has no
// open request (for example once its work is finished).
func (i *Instance) RequestEviction() {
	if i.requestEviction != nil {
		i.requestEviction()
	}
}

func newInstance(ns, id string, generation uint64, logger *slog.Logger) *Instance {
	ctx, cancel := context.WithCancel(context.Background())
	return &Instance{
		ns: ns, id: id, generation: generation, activatedAt: time.Now(),
		ctx: ctx, cancel: cancel,
		logger: logger.With("instance", ns+"/"+id),
	}
}

// Namespace is the host's namespace, e.g. "/counters".
func (i *Instance) Namespace() string { return i.ns }

// ID is the instance id within the namespace.
func (i *Instance) ID() string { return i.id }

// Generation is the placement generation this activation runs under; durable
// writes carry it so a stale activation can be fenced off.
func (i *Instance) Generation() uint64 { return i.generation }

// Context is cancelled when the instance is evicted.
func (i *Instance) Context() context.Context { return i.ctx }

// Logger logs with the instance's namespace and id.
func (i *Instance) Logger() *slog.Logger { return i.logger }

// Go runs fn as a tracked background task: eviction cancels ctx and waits
// (up to the grace period) for fn to return. A panic in fn is logged, not
// fatal to the plugin. Once the instance is stopping, Go does nothing.
func (i *Instance) Go(name string, fn func(ctx context.Context)) {
	i.tasksMu.Lock()
	if i.stopping {
		i.tasksMu.Unlock()
		return
	}
	i.tasks.Add(1)
	i.ntasks.Add(1)
	i.tasksMu.Unlock()
	go func() {
		defer i.tasks.Done()
		defer func() {
			// The last task of a winding-down instance returning means it
			// can go before its deadline.
			if i.ntasks.Add(-1) == 0 && i.windDown.Load() != 0 {
				i.RequestEviction()
			}
		}()
		defer func() {
			if r := recover(); r != nil {
				i.logger.Error("task panicked", "task", name, "panic", r)
			}
		}()
		fn(i.ctx)
	}()
}

// Attach stores v on the instance under key, for libraries built on the SDK
// that must find their per-instance object again from a tray run (Run.Instance):
// statewire finds its server this way. Use an unexported key type.
func (i *Instance) Attach(key, v any) { i.attached.Store(key, v) }

// Attached returns what Attach stored under key, or nil.
func (i *Instance) Attached(key any) any {
	v, _ := i.attached.Load(key)
	return v
}

// WindingDown reports the eviction deadline if the instance is being wound
// down.
func (i *Instance) WindingDown() (time.Time, bool) {
	ms := i.windDown.Load()
	if ms == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// EvictionCheckpoint returns ErrWindingDown once the instance is being
// wound down (and the instance context's error once it is evicted):
// long-running tracked work calls it between steps and returns when it
// fails.
func (i *Instance) EvictionCheckpoint() error {
	if err := i.ctx.Err(); err != nil {
		return err
	}
	if i.windDown.Load() != 0 {
		return ErrWindingDown
	}
	return nil
}

// Tasks is the number of tracked tasks still running.
func (i *Instance) Tasks() int { return int(i.ntasks.Load()) }

// waitTasks waits for tracked tasks up to grace and reports how many were
// still running.
func (i *Instance) waitTasks(grace time.Duration) int {
	i.tasksMu.Lock()
	i.stopping = true
	i.tasksMu.Unlock()
	done := make(chan struct{})
	go func() { i.tasks.Wait(); close(done) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return 0
	case <-t.C:
		return i.Tasks()
	}
}

// NewMemoryInstance returns an instance whose trays live in memory only,
// outside any pinnedd: for testing and benchmarking host code in-process.
// Cancel its context with Stop.
func NewMemoryInstance(ns, id string) *Instance {
	inst := newInstance(ns, id, 1, slog.Default())
	inst.state = newState(inst, nil, Host{}, nil)
	return inst
}

// Stop cancels a NewMemoryInstance's context and waits for its tasks.
func (i *Instance) Stop() {
	i.cancel()
	i.tasks.Wait()
}

// ClusterClient returns an HTTP client for calling other instances through
// this node's front door: it resolves paths like "/counters/alice/value"
// against the node's URL and marks the requests as cluster calls from this
// instance's namespace, so an id placed by such a call prefers this node.
// The mark carries the plugin process's own credential, which pinnedd
// honours for this process's namespaces only. Outside pinnedd it calls
// nothing (requests fail).
func (i *Instance) ClusterClient() *http.Client {
	var token string
	if i.clusterToken != nil {
		token = i.clusterToken()
	}
	return &http.Client{Transport: clusterTransport{
		base: strings.TrimRight(os.Getenv(plugins.EnvFrontDoor), "/"),
		ns:   i.ns, token: token,
	}}
}

type clusterTransport struct{ base, ns, token string }

func (c clusterTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.base == "" {
		return nil, errors.New("not running under pinnedd: no front door to call")
	}
	u, err := url.Parse(c.base + r.URL.RequestURI())
	if err != nil {
		return nil, err
	}
	r2 := r.Clone(r.Context())
	r2.URL, r2.Host = u, ""
	if c.token != "" {
		r2.Header.Set(plugins.HeaderClusterCall, plugins.ClusterCallValue(c.ns, c.token))
	}
	return frontDoorTransport().RoundTrip(r2)
}

// frontDoorTransport carries cluster calls: http.DefaultTransport's, also
// trusting the CA pinnedd names for an https front door under a private
// one (plugins.EnvFrontDoorCA).
var frontDoorTransport = sync.OnceValue(func() http.RoundTripper {
	caPEM := os.Getenv(plugins.EnvFrontDoorCA)
	if caPEM == "" {
		return http.DefaultTransport
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pool.AppendCertsFromPEM([]byte(caPEM))
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t
})
