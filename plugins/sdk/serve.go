package sdk

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinnedd/pinnedd/internal/harden"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// Serve runs the plugin side of the protocol for hosts and never returns:
// the process exits once pinnedd shuts the plugin down. Call it from main.
func Serve(hosts map[string]Host) {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	slog.SetDefault(logger)
	if ppid := os.Getenv(plugins.EnvParentPID); ppid != "" && ppid != strconv.Itoa(os.Getppid()) {
		// pinnedd died before our parent-death signal was armed.
		logger.Error("parent pinnedd is gone; exiting", "expected_ppid", ppid, "ppid", os.Getppid())
		os.Exit(1)
	}
	// The data socket's secret and the cluster-call credential are in this
	// process's memory and environment: another process of the same user
	// must not read them (/proc/<pid>/environ, mem, ptrace).
	if err := harden.NonDumpable(); err != nil {
		logger.Warn("could not make the plugin process non-dumpable", "err", err)
	}
	rt, err := NewRuntime(hosts, logger)
	if err != nil {
		logger.Error("invalid hosts", "err", err)
		os.Exit(1)
	}
	if path := os.Getenv(plugins.EnvDataSocket); path != "" {
		if err := rt.ListenUnix(path); err != nil {
			logger.Error("data socket", "err", err)
			os.Exit(1)
		}
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugins.Handshake,
		Plugins:         plugins.PluginSet(rt),
		GRPCServer:      plugin.DefaultGRPCServer,
	})
	rt.Close()
}

// Runtime is the plugin side: it holds the hosts and their live instances and
// serves the Control service and the data socket. Serve uses it;
// tests and benchmarks may drive it directly.
type Runtime struct {
	proto.UnimplementedControlServer

	hosts  map[string]Host
	logger *slog.Logger

	mu        sync.Mutex
	instances map[key]*live
	// resetting holds the instances being reset (see resetInstance): a
	// request waits for the reset, and a Deactivate in the meantime
	// deletes the entry, so the reset then brings nothing back.
	resetting map[key]*reset

	socket string
	srv    *http.Server

	// secured: requests must carry socketSecret (set by ListenUnix: the
	// data socket is reachable by other local processes). Until Describe
	// hands the secret over, every request is refused.
	secured      atomic.Bool
	socketSecret atomic.Pointer[string]
	clusterToken atomic.Pointer[string]

	events chan *proto.Event

	brokerMu sync.Mutex
	broker   *plugin.GRPCBroker
	store    proto.StoreClient
}

// SetBroker implements plugins.Server.
func (rt *Runtime) SetBroker(b *plugin.GRPCBroker) {
	rt.brokerMu.Lock()
	defer rt.brokerMu.Unlock()
	rt.broker = b
}

// UseStore connects the runtime to a Store service directly (pinnedd does
// it through the broker in Describe); for tests of host code.
func (rt *Runtime) UseStore(c proto.StoreClient) {
	rt.brokerMu.Lock()
	defer rt.brokerMu.Unlock()
	rt.store = c
}

// Instance returns the live instance (ns, id), or nil.
func (rt *Runtime) Instance(ns, id string) *Instance {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if l := rt.instances[key{ns, id}]; l != nil {
		return l.inst
	}
	return nil
}

func (rt *Runtime) storeClient() proto.StoreClient {
	rt.brokerMu.Lock()
	defer rt.brokerMu.Unlock()
	return rt.store
}

type key struct{ ns, id string }

type live struct {
	inst    *Instance
	handler http.Handler
}

// NewRuntime validates hosts and builds a runtime.
func NewRuntime(hosts map[string]Host, logger *slog.Logger) (*Runtime, error) {
	if len(hosts) == 0 {
		return nil, errors.New("no hosts")
	}
	for ns, h := range hosts {
		if err := plugins.ValidateNamespace(ns); err != nil {
			return nil, err
		}
		if h.New == nil {
			return nil, fmt.Errorf("host %s: New is nil", ns)
		}
	}
	return &Runtime{hosts: hosts, logger: logger, instances: map[key]*live{}, resetting: map[key]*reset{},
		events: make(chan *proto.Event, 64)}, nil
}

// ListenUnix serves instance HTTP on a unix socket at path.
func (rt *Runtime) ListenUnix(path string) error {
	_ = os.Remove(path) // a stale socket from a crashed predecessor
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen %s: %w", path, err)
	}
	rt.secured.Store(true)
	rt.socket = path
	rt.srv = &http.Server{Handler: rt, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := rt.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			rt.logger.Error("data socket stopped", "err", err)
		}
	}()
	return nil
}

// Close stops the data socket and every instance without waiting.
func (rt *Runtime) Close() {
	if rt.srv != nil {
		_ = rt.srv.Close()
	}
	rt.deactivateAll(context.Background(), 0)
}

// ServeHTTP is the data plane: pinnedd names the instance in headers.
func (rt *Runtime) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !rt.admit(r) {
		http.Error(w, `{"error":"not from pinnedd: missing or wrong `+plugins.HeaderSocketSecret+`"}`, http.StatusForbidden)
		return
	}
	k := key{r.Header.Get(plugins.HeaderNamespace), r.Header.Get(plugins.HeaderID)}
	rt.mu.Lock()
	l := rt.instances[k]
	rs := rt.resetting[k]
	rt.mu.Unlock()
	if l == nil && rs != nil {
		// Reset after a failed commit: the fresh activation is moments
		// away (a load from the store).
		select {
		case <-rs.done:
		case <-r.Context().Done():
			return
		}
		rt.mu.Lock()
		l = rt.instances[k]
		rt.mu.Unlock()
	}
	if l == nil {
		w.Header().Set(plugins.HeaderRefusal, plugins.RefusalInactive)
		w.Header().Set("Retry-After", "1") // nothing ran; a reset may be under way
		http.Error(w, `{"error":"instance not active"}`, http.StatusServiceUnavailable)
		return
	}
	r.Header.Del(plugins.HeaderNamespace)
	r.Header.Del(plugins.HeaderID)
	serveRecovering(w, r, l)
}

// admit checks the data-socket secret and strips it, so instance code
// never sees it. A secured runtime without a secret yet (Describe has not
// run) admits nothing: any local process can reach the socket.
func (rt *Runtime) admit(r *http.Request) bool {
	got := r.Header.Values(plugins.HeaderSocketSecret)
	r.Header.Del(plugins.HeaderSocketSecret)
	if !rt.secured.Load() {
		return true
	}
	want := rt.socketSecret.Load()
	return want != nil && *want != "" && len(got) == 1 &&
		subtle.ConstantTimeCompare([]byte(got[0]), []byte(*want)) == 1
}

// serveRecovering runs the instance's handler behind its output gate and
// keeps a panicking handler from taking the plugin down with it: the
// client gets a 500 if nothing was sent yet.
func serveRecovering(w http.ResponseWriter, r *http.Request, l *live) {
	g, r := newGate(w, r, l.inst.state)
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			l.inst.logger.Error("handler panicked", "panic", p, "stack", string(debug.Stack()))
			if !g.started && !g.hijacked {
				// What was held is discarded: the error reveals no state.
				h := w.Header()
				clear(h)
				h.Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"error":"internal error"}` + "\n"))
			}
			return
		}
		g.finish()
		if g.cut {
			// The status left before a write it followed failed: the
			// client must not take the rest for a whole answer.
			panic(http.ErrAbortHandler)
		}
	}()
	l.handler.ServeHTTP(g, r)
}

// Describe implements proto.ControlServer. It also connects the plugin to
// pinnedd's Store service when the request names one.
func (rt *Runtime) Describe(_ context.Context, req *proto.DescribeRequest) (*proto.DescribeResponse, error) {
	if req.StoreBrokerId != 0 {
		rt.brokerMu.Lock()
		b := rt.broker
		rt.brokerMu.Unlock()
		if b == nil {
			return nil, status.Error(codes.FailedPrecondition, "no broker to reach the store through")
		}
		conn, err := b.DialWithOptions(req.StoreBrokerId, plugins.StoreDialOptions()...)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "dial store: %v", err)
		}
		rt.brokerMu.Lock()
		rt.store = proto.NewStoreClient(conn)
		rt.brokerMu.Unlock()
	}
	// The first Describe's secrets hold for the life of the process: pinnedd
	// describes each process once, so a later one is not pinnedd's.
	if req.SocketSecret != "" {
		rt.socketSecret.CompareAndSwap(nil, &req.SocketSecret)
	}
	if req.ClusterCallToken != "" {
		rt.clusterToken.CompareAndSwap(nil, &req.ClusterCallToken)
	}
	resp := &proto.DescribeResponse{DataSocket: rt.socket, SdkVersion: Version, Pid: int32(os.Getpid())}
	for ns, h := range rt.hosts {
		resp.Hosts = append(resp.Hosts, &proto.HostInfo{
			Namespace:              ns,
			DetachedTimeoutMs:      h.DetachedTimeout.Milliseconds(),
			ReleasePlacementOnIdle: !h.KeepPlacementOnIdle,
		})
	}
	sort.Slice(resp.Hosts, func(i, j int) bool { return resp.Hosts[i].Namespace < resp.Hosts[j].Namespace })
	return resp, nil
}

// Activate implements proto.ControlServer. Activating a live instance again
// is a no-op, so pinnedd may retry after an unknown outcome.
func (rt *Runtime) Activate(ctx context.Context, req *proto.ActivateRequest) (*proto.ActivateResponse, error) {
	return rt.activate(ctx, req, nil)
}

// activate builds and registers an instance. rs is the reset it is for
// (nil for pinnedd's own Activate): the new instance is registered only if
// that reset still stands, i.e. no Deactivate or Activate came between.
func (rt *Runtime) activate(ctx context.Context, req *proto.ActivateRequest, rs *reset) (*proto.ActivateResponse, error) {
	h, ok := rt.hosts[req.Namespace]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown namespace %q", req.Namespace)
	}
	k := key{req.Namespace, req.Id}
	rt.mu.Lock()
	_, exists := rt.instances[k]
	rt.mu.Unlock()
	if exists {
		return &proto.ActivateResponse{}, nil
	}
	inst := newInstance(req.Namespace, req.Id, req.Generation, rt.logger)
	inst.requestEviction = func() { rt.emit(inst, proto.EventKind_EVENT_KIND_EVICT_ME) }
	inst.onFenced = func() { go rt.dropFenced(k, inst) }
	inst.onReset = func() {
		if rs := rt.beginReset(k, inst); rs != nil {
			go rt.resetInstance(k, rs)
		}
	}
	inst.clusterToken = rt.clusterCallToken
	var loaded []*proto.TrayData
	store := rt.storeClient()
	if store != nil {
		// Load fences the predecessor: from here on its writes fail.
		resp, err := store.Load(ctx, &proto.StoreLoadRequest{Namespace: req.Namespace, Id: req.Id, Generation: req.Generation})
		if err != nil {
			inst.cancel()
			if status.Code(err) == codes.Aborted {
				return nil, status.Errorf(codes.FailedPrecondition, "activate %s/%s: %v", req.Namespace, req.Id, ErrFenced)
			}
			return nil, status.Errorf(codes.Unavailable, "activate %s/%s: load state: %v", req.Namespace, req.Id, err)
		}
		loaded = resp.Trays
	}
	inst.state = newState(inst, store, h, loaded)
	handler, err := build(h, inst)
	if err == nil {
		if s, ok := handler.(Starter); ok {
			err = callHook(inst, "start", func() error { return s.Start(ctx) })
		}
	}
	if err != nil {
		inst.cancel()
		inst.waitTasks(time.Second)
		return nil, status.Errorf(codes.FailedPrecondition, "activate %s/%s: %v", req.Namespace, req.Id, err)
	}
	rt.mu.Lock()
	_, exists = rt.instances[k]
	stale := exists || rs != nil && rt.resetting[k] != rs
	if !stale {
		rt.instances[k] = &live{inst: inst, handler: handler}
		delete(rt.resetting, k)
	}
	rt.mu.Unlock()
	if stale {
		// Another activation won, or the reset was overtaken by a
		// deactivation: this one never served.
		stop(ctx, &live{inst: inst, handler: handler}, time.Second)
		return &proto.ActivateResponse{}, nil
	}
	inst.state.redeliver()
	inst.logger.Debug("instance activated", "generation", req.Generation)
	return &proto.ActivateResponse{}, nil
}

func (rt *Runtime) clusterCallToken() string {
	if t := rt.clusterToken.Load(); t != nil {
		return *t
	}
	return ""
}

// emit queues an event for pinnedd.
func (rt *Runtime) emit(inst *Instance, kind proto.EventKind) {
	select {
	case rt.events <- &proto.Event{Kind: kind, Namespace: inst.ns, Id: inst.id}:
	default:
		inst.logger.Warn("event queue full; event dropped", "kind", kind.String())
	}
}

// dropFenced tears down an instance whose writes were fenced and tells
// pinnedd, which drops it without releasing the placement.
func (rt *Runtime) dropFenced(k key, inst *Instance) {
	rt.mu.Lock()
	l := rt.instances[k]
	if l == nil || l.inst != inst {
		rt.mu.Unlock()
		return
	}
	delete(rt.instances, k)
	rt.mu.Unlock()
	stop(context.Background(), l, 5*time.Second)
	rt.emit(inst, proto.EventKind_EVENT_KIND_FENCED)
}

// reset is an instance being replaced; done closes when it is over.
type reset struct {
	inst    *Instance
	handler http.Handler
	done    chan struct{}
}

// beginReset takes inst, whose commit failed, out of service: requests
// for it wait for its replacement from then on (resetInstance). Nil if
// inst is no longer the live instance.
func (rt *Runtime) beginReset(k key, inst *Instance) *reset {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if l := rt.instances[k]; l == nil || l.inst != inst {
		return nil
	}
	rs := &reset{inst: inst, handler: rt.instances[k].handler, done: make(chan struct{})}
	delete(rt.instances, k)
	rt.resetting[k] = rs
	return rs
}

// resetInstance replaces a reset instance by a fresh activation of the
// same placement loaded from the store (Cloudflare resets a Durable
// Object whose write failed the same way). If the store cannot be read,
// the id is left inactive (the plugin answers "not active": nothing ran)
// and pinnedd activates it again on its next request.
func (rt *Runtime) resetInstance(k key, rs *reset) {
	inst := rs.inst
	defer func() {
		rt.mu.Lock()
		if rt.resetting[k] == rs {
			delete(rt.resetting, k)
		}
		rt.mu.Unlock()
		close(rs.done)
	}()
	stop(context.Background(), &live{inst: inst, handler: rs.handler}, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), frontierWait)
	defer cancel()
	req := &proto.ActivateRequest{Namespace: k.ns, Id: k.id, Generation: inst.generation}
	if _, err := rt.activate(ctx, req, rs); err != nil {
		inst.logger.Warn("instance not reset: reactivation failed; its next request activates it", "err", err)
		return
	}
	inst.logger.Info("instance reset from the store after a failed commit", "generation", inst.generation)
}

func build(h Host, inst *Instance) (handler http.Handler, err error) {
	err = callHook(inst, "new", func() error {
		var e error
		handler, e = h.New(inst)
		if e == nil && handler == nil {
			e = errors.New("host returned a nil handler")
		}
		return e
	})
	return handler, err
}

// callHook turns a panic in host code into an error.
func callHook(inst *Instance, name string, fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			inst.logger.Error("hook panicked", "hook", name, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("%s hook panicked: %v", name, p)
		}
	}()
	return fn()
}

// Deactivate implements proto.ControlServer.
func (rt *Runtime) Deactivate(ctx context.Context, req *proto.DeactivateRequest) (*proto.DeactivateResponse, error) {
	k := key{req.Namespace, req.Id}
	rt.mu.Lock()
	l := rt.instances[k]
	delete(rt.resetting, k)
	rt.mu.Unlock()
	if l == nil {
		return &proto.DeactivateResponse{}, nil
	}
	if req.OnlyIfIdle && l.inst.Tasks() > 0 {
		return &proto.DeactivateResponse{Kept: true}, nil
	}
	if req.Reason == proto.Reason_REASON_IDLE {
		if idler, ok := l.handler.(Idler); ok {
			keep := false
			_ = callHook(l.inst, "idle", func() error { keep = idler.Idle(ctx); return nil })
			if keep {
				return &proto.DeactivateResponse{Kept: true}, nil
			}
		}
	}
	rt.mu.Lock()
	if rt.instances[k] != l { // a concurrent deactivation won
		rt.mu.Unlock()
		return &proto.DeactivateResponse{}, nil
	}
	delete(rt.instances, k)
	rt.mu.Unlock()
	abandoned := stop(ctx, l, time.Duration(req.GraceMs)*time.Millisecond)
	l.inst.logger.Debug("instance deactivated", "reason", req.Reason.String(), "abandoned_tasks", abandoned)
	return &proto.DeactivateResponse{AbandonedTasks: int32(abandoned)}, nil
}

// stop ends an instance: cancel its context, give its tasks grace, run the
// stop hook, then wait for the durability frontier, so pinnedd releases the
// placement only once everything the instance wrote is in the store.
func stop(ctx context.Context, l *live, grace time.Duration) int {
	l.inst.cancel()
	abandoned := l.inst.waitTasks(grace)
	if s, ok := l.handler.(Stopper); ok {
		_ = callHook(l.inst, "stop", func() error { s.Stop(ctx); return nil })
	}
	dctx, cancel := context.WithTimeout(context.Background(), max(grace, frontierWait))
	defer cancel()
	// A fence or a failed commit was logged when it happened; what is
	// left to say is a frontier that did not move in time.
	if err := l.inst.state.durable(dctx); err != nil && dctx.Err() != nil {
		l.inst.logger.Error("instance stopped before its writes were durable", "err", err)
	}
	return abandoned
}

// frontierWait bounds how long a stopping instance waits for its writes.
const frontierWait = 10 * time.Second

func (rt *Runtime) deactivateAll(ctx context.Context, grace time.Duration) {
	rt.mu.Lock()
	all := rt.instances
	rt.instances = map[key]*live{}
	clear(rt.resetting)
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		go func() { defer wg.Done(); stop(ctx, l, grace) }()
	}
	wg.Wait()
}

// WindDown implements proto.ControlServer.
func (rt *Runtime) WindDown(ctx context.Context, req *proto.WindDownRequest) (*proto.WindDownResponse, error) {
	rt.mu.Lock()
	l := rt.instances[key{req.Namespace, req.Id}]
	rt.mu.Unlock()
	if l == nil {
		return &proto.WindDownResponse{}, nil
	}
	l.inst.windDown.Store(req.DeadlineUnixMs)
	if req.DeadlineUnixMs == 0 {
		return &proto.WindDownResponse{}, nil
	}
	if wd, ok := l.handler.(WindDowner); ok {
		_ = callHook(l.inst, "wind down", func() error { wd.WindDown(ctx, time.UnixMilli(req.DeadlineUnixMs)); return nil })
	}
	if l.inst.Tasks() == 0 {
		l.inst.RequestEviction()
	}
	return &proto.WindDownResponse{}, nil
}

// Stats implements proto.ControlServer.
func (rt *Runtime) Stats(context.Context, *proto.StatsRequest) (*proto.StatsResponse, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	resp := &proto.StatsResponse{}
	for k, l := range rt.instances {
		resp.Instances = append(resp.Instances, &proto.InstanceStats{
			Namespace: k.ns, Id: k.id, Generation: l.inst.generation,
			Tasks: int32(l.inst.Tasks()), ActivatedAtMs: l.inst.activatedAt.UnixMilli(),
		})
	}
	sort.Slice(resp.Instances, func(i, j int) bool {
		a, b := resp.Instances[i], resp.Instances[j]
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Id < b.Id
	})
	return resp, nil
}

// Health implements proto.ControlServer.
func (rt *Runtime) Health(context.Context, *proto.HealthRequest) (*proto.HealthResponse, error) {
	return &proto.HealthResponse{Serving: true}, nil
}

// Shutdown implements proto.ControlServer: every instance is stopped (tasks
// get grace_ms) before pinnedd asks go-plugin to end the process.
func (rt *Runtime) Shutdown(ctx context.Context, req *proto.ShutdownRequest) (*proto.ShutdownResponse, error) {
	rt.deactivateAll(ctx, time.Duration(req.GraceMs)*time.Millisecond)
	return &proto.ShutdownResponse{}, nil
}

// Events implements proto.ControlServer: pinnedd holds it open for the life
// of the process.
func (rt *Runtime) Events(_ *proto.EventsRequest, stream proto.Control_EventsServer) error {
	if err := stream.Send(&proto.Event{Kind: proto.EventKind_EVENT_KIND_READY}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case ev := <-rt.events:
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}
