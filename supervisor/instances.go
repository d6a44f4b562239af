package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/internal/relay"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// instance is one live (namespace, id) on this node.
type instance struct {
	key         Key
	gen         uint64
	inc         *incarnation
	activatedAt time.Time

	ready chan struct{} // closed once activation finished (err says how)
	err   error

	// Guarded by Supervisor.mu. streams counts the connections whose
	// response turned out to be a stream (SSE, unknown length, upgrade):
	// they keep an instance resident, but not one that is winding down.
	conns      int
	streams    int
	lastActive time.Time
	evicting   bool
	evictDone  chan struct{} // closed when the latest eviction ended, kept or not
	idle       *time.Timer   // see armIdleLocked
	idleArmed  bool          // idle will fire
	stopped    chan struct{} // closed once removed from the table

	ctx    context.Context // cancelled at eviction: ends open streams
	cancel context.CancelFunc
	// relayed are the requests a caller's loop carries (Relay), guarded
	// by Supervisor.mu: the eviction that cancels ctx aborts them, as it
	// cancels the requests ServeInstance serves.
	relayed map[*reqState]relay.Ticket

	// Wind-down, guarded by Supervisor.mu. windDown is an operator's
	// deadline for this instance (zero: none); deadline is the one in
	// force (the earliest of it and the node's drain); sent is what the
	// plugin was last told; timer evicts at the deadline.
	windDown time.Time
	deadline time.Time
	sent     time.Time
	timer    *time.Timer
}

// activationTimeout bounds a host's New + Start.
const activationTimeout = 30 * time.Second

// acquire returns the live instance for k, activating it if needed, with
// one more open connection counted on it. Concurrent first requests share
// one activation. gen 0 means "only if live": nothing is activated and a
// missing instance is errNotLive.
func (s *Supervisor) acquire(ctx context.Context, k Key, gen uint64) (*instance, error) {
	p := s.byNS[k.Namespace]
	if p == nil {
		return nil, ErrUnknownNS
	}
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return nil, ErrStopping
		}
		in := s.instances[k]
		if in != nil && !in.evicting && gen > in.gen {
			// Re-placed under a newer generation: the old activation must
			// not keep writing. Evict it and activate afresh.
			s.mu.Unlock()
			s.evict(ctx, in, proto.Reason_REASON_OPERATOR, 0)
			continue
		}
		if in != nil && in.evicting {
			stopped := in.stopped
			s.mu.Unlock()
			select {
			case <-stopped:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if in != nil {
			in.conns++ // the idle timer may fire meanwhile: evictWith leaves a busy instance be
			s.mu.Unlock()
			select {
			case <-in.ready:
			case <-ctx.Done():
				s.release(in)
				return nil, ctx.Err()
			}
			if in.err != nil {
				s.release(in)
				return nil, in.err
			}
			return in, nil
		}
		if gen == 0 {
			s.mu.Unlock()
			return nil, errNotLive
		}
		if s.drainingLocked() {
			s.mu.Unlock()
			return nil, ErrDraining
		}
		if err := s.StoreHealth(); err != nil {
			// Its load would fail or wait out the store's deadline: say
			// so at once. The probe (or a live instance's write) tells when
			// the store is back.
			s.mu.Unlock()
			return nil, err
		}
		inc, err := p.current()
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		ictx, icancel := context.WithCancel(context.Background())
		in = &instance{
			key: k, gen: gen, inc: inc, activatedAt: time.Now(), ready: make(chan struct{}),
			conns: 1, stopped: make(chan struct{}), ctx: ictx, cancel: icancel,
		}
		s.abortRelayedOnCancel(in)
		s.instances[k] = in
		s.mu.Unlock()

		actx, cancel := context.WithTimeout(context.Background(), activationTimeout)
		_, err = inc.conn.Control.Activate(actx, &proto.ActivateRequest{Namespace: k.Namespace, Id: k.ID, Generation: gen})
		cancel()
		if err != nil {
			if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition {
				err = fmt.Errorf("%w: %s", ErrActivation, st.Message())
			} else if ok && st.Code() == codes.Unavailable && s.cfg.Store != nil && inc.alive() {
				// The SDK's answer when the instance's state did not load
				// (the Store service failed it: ErrUnavailable).
				err = s.storeUnavailable(st.Message())
			} else if !inc.alive() {
				err = fmt.Errorf("%w: %v", ErrPluginDown, err)
			} else {
				err = fmt.Errorf("%w: %v", ErrActivation, err)
			}
			in.err = err
			s.remove(in)
			close(in.ready)
			s.release(in)
			return nil, err
		}
		s.metrics.activations.WithLabelValues(k.Namespace).Inc()
		s.metrics.instances.WithLabelValues(k.Namespace).Inc()
		s.count(k.Namespace, true)
		close(in.ready)
		return in, nil
	}
}

// storeUnavailable is ErrStoreUnavailable with the store's own latest
// failure as the reason (the plugin's message, which wraps it, otherwise).
func (s *Supervisor) storeUnavailable(pluginMsg string) error {
	if err := s.storeHealth.Failing(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", ErrStoreUnavailable, pluginMsg)
}

// release drops one open connection; the last one arms the idle timer.
func (s *Supervisor) release(in *instance) { s.releaseConn(in, nil) }

// releaseConn is release for a served request, which may have been a
// stream.
func (s *Supervisor) releaseConn(in *instance, rs *reqState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in.conns--
	if rs != nil && rs.stream {
		in.streams--
	}
	if rs != nil && in.relayed != nil {
		delete(in.relayed, rs)
	}
	in.lastActive = time.Now()
	if in.evicting || s.instances[in.key] != in || in.err != nil {
		return
	}
	if s.windingLocked(in) {
		// Its last plain request finished while winding down: go now
		// unless tracked work is still running. Streams do not hold it;
		// they end with the eviction and their clients reconnect.
		if in.conns == in.streams {
			go s.evictWith(context.Background(), in, s.windReason(in), s.cfg.StopGrace, true)
		}
		return
	}
	if in.conns == 0 {
		s.armIdleLocked(in, s.idleTimeout(in))
	}
}

// reqState is what the proxy learns about one served request.
type reqState struct {
	in     *instance
	stream bool
}

// markStream records that rs's response is a stream.
func (s *Supervisor) markStream(rs *reqState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rs.stream {
		return
	}
	rs.stream = true
	rs.in.streams++
	if s.windingLocked(rs.in) && rs.in.conns == rs.in.streams && !rs.in.evicting {
		go s.evictWith(context.Background(), rs.in, s.windReason(rs.in), s.cfg.StopGrace, true)
	}
}

func (s *Supervisor) idleTimeout(in *instance) time.Duration {
	if h := in.inc.hosts[in.key.Namespace]; h != nil && h.DetachedTimeoutMs > 0 {
		return time.Duration(h.DetachedTimeoutMs) * time.Millisecond
	}
	return s.cfg.DetachedTimeout
}

// armIdleLocked makes in's idle timer fire in d, unless it is armed
// already. Requests neither stop nor reset it (a timer operation each way,
// per request, was measurable on the owner's forwarding path): when it
// fires, evictWith leaves a busy instance be (its last release arms it
// again) and re-arms for the rest of the timeout if a request ended since.
// One timer per instance, reused.
func (s *Supervisor) armIdleLocked(in *instance, d time.Duration) {
	if in.idleArmed {
		return
	}
	in.idleArmed = true
	if in.idle != nil {
		in.idle.Reset(d)
		return
	}
	in.idle = time.AfterFunc(d, func() {
		s.mu.Lock()
		in.idleArmed = false
		s.mu.Unlock()
		s.evict(context.Background(), in, proto.Reason_REASON_IDLE, s.cfg.StopGrace)
	})
}

// stopIdleLocked disarms in's idle timer.
func (s *Supervisor) stopIdleLocked(in *instance) {
	if in.idle != nil {
		in.idle.Stop()
	}
	in.idleArmed = false
}

// streamGrace is how long requests still open on an evicted instance get
// to finish before they are cut: the plugin has cancelled the instance's
// context, so well-behaved handlers are writing their last frame (a fin)
// right now; the cut is the backstop for those that ignore it.
const streamGrace = 2 * time.Second

// remove takes in out of the table if it is still there, cutting its open
// requests at once (the process is gone).
func (s *Supervisor) remove(in *instance) bool { return s.removeAfter(in, 0) }

// removeAfter is remove with the open requests cut after grace.
func (s *Supervisor) removeAfter(in *instance, grace time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.instances[in.key] != in {
		return false
	}
	delete(s.instances, in.key)
	s.stopIdleLocked(in)
	if in.timer != nil {
		in.timer.Stop()
	}
	close(in.stopped)
	if grace > 0 {
		time.AfterFunc(grace, in.cancel)
	} else {
		in.cancel()
	}
	return true
}

// evict deactivates in (idle eviction only while it has no open
// connection, and the host's idle hook may keep it), then reports it gone.
func (s *Supervisor) evict(ctx context.Context, in *instance, reason proto.Reason, grace time.Duration) {
	s.evictWith(ctx, in, reason, grace, false)
}

// evictWith is evict; onlyIfIdle leaves an instance with open connections
// or running tasks alone (a winding-down instance evicted early, when its
// work is done).
func (s *Supervisor) evictWith(ctx context.Context, in *instance, reason proto.Reason, grace time.Duration, onlyIfIdle bool) {
	s.mu.Lock()
	if s.instances[in.key] != in || in.evicting || (reason == proto.Reason_REASON_IDLE && in.conns > 0) || (onlyIfIdle && in.conns > in.streams) {
		s.mu.Unlock()
		return
	}
	if left := s.idleTimeout(in) - time.Since(in.lastActive); reason == proto.Reason_REASON_IDLE && left > 0 {
		// A request ended since the timer was armed: the instance has
		// not been idle for the timeout yet.
		s.armIdleLocked(in, left)
		s.mu.Unlock()
		return
	}
	in.evicting = true
	done := make(chan struct{})
	in.evictDone = done
	s.stopIdleLocked(in)
	s.mu.Unlock()
	defer close(done)
	<-in.ready

	resp, err := in.inc.conn.Control.Deactivate(ctx, &proto.DeactivateRequest{
		Namespace: in.key.Namespace, Id: in.key.ID, Reason: reason, GraceMs: grace.Milliseconds(), OnlyIfIdle: onlyIfIdle,
	})
	if err == nil && resp.Kept {
		s.mu.Lock()
		in.evicting = false
		// A winding-down instance waits for its work (EVICT_ME) or its
		// deadline; any other one goes back to idling.
		if in.conns == 0 && s.instances[in.key] == in && !s.windingLocked(in) {
			s.armIdleLocked(in, s.idleTimeout(in))
		}
		s.mu.Unlock()
		return
	}
	if err != nil && in.inc.alive() {
		s.cfg.Logger.Warn("deactivate failed; dropping instance", "instance", in.key.String(), "err", err)
	}
	if !s.removeAfter(in, streamGrace) {
		return
	}
	s.metrics.evictions.WithLabelValues(in.key.Namespace, reasonLabel(reason)).Inc()
	s.metrics.instances.WithLabelValues(in.key.Namespace).Dec()
	s.count(in.key.Namespace, false)
	if reason == proto.Reason_REASON_SWAP {
		// Hot swap: the id stays placed here and comes back at once in
		// the new process (streams reconnect, durable work resumes).
		s.adoptOrphan(in)
		return
	}
	release := true
	if h := in.inc.hosts[in.key.Namespace]; reason == proto.Reason_REASON_IDLE && (s.cfg.KeepPlacementsOnIdle || h != nil && !h.ReleasePlacementOnIdle) {
		release = false
	}
	if s.cfg.OnEvicted != nil {
		s.cfg.OnEvicted(in.key, in.gen, release)
	}
	s.noteDrained()
}

// evictKey handles an instance's own request to go (EVICT_ME): idle
// eviction normally; while winding down, eviction as soon as it is idle.
func (s *Supervisor) evictKey(k Key, inc *incarnation, reason proto.Reason) {
	s.mu.Lock()
	in := s.instances[k]
	winding := in != nil && s.windingLocked(in)
	s.mu.Unlock()
	if in == nil || in.inc != inc {
		return
	}
	if winding {
		s.evictWith(context.Background(), in, s.windReason(in), s.cfg.StopGrace, true)
		return
	}
	s.evict(context.Background(), in, reason, s.cfg.StopGrace)
}

// Evict winds one instance down now (operator wind-down, drain); tracked
// tasks get grace. It reports whether the instance was live.
func (s *Supervisor) Evict(ctx context.Context, k Key, grace time.Duration) bool {
	s.mu.Lock()
	in := s.instances[k]
	s.mu.Unlock()
	if in == nil {
		return false
	}
	s.evict(ctx, in, proto.Reason_REASON_OPERATOR, grace)
	return true
}

// Quit evicts k at once and returns when it is out of the instance table,
// an eviction already under way included, or when ctx ends. A worker quits
// the ids a re-registration says it lost before its new lease lets it
// serve: until they are gone it must not look like their owner.
func (s *Supervisor) Quit(ctx context.Context, k Key) {
	s.mu.Lock()
	in := s.instances[k]
	s.mu.Unlock()
	if in == nil {
		return
	}
	// An eviction already under way (an idle one) may end with the
	// instance kept: then this one goes again.
	for {
		s.evict(ctx, in, proto.Reason_REASON_OPERATOR, 0)
		s.mu.Lock()
		done := in.evictDone
		s.mu.Unlock()
		select {
		case <-in.stopped:
			return
		case <-ctx.Done():
			return
		case <-done:
		}
	}
}

// dropFenced forgets an instance the plugin stopped because a newer
// activation fenced its writes. The placement is not ours to release.
func (s *Supervisor) dropFenced(k Key, inc *incarnation) {
	s.mu.Lock()
	in := s.instances[k]
	s.mu.Unlock()
	if in == nil || in.inc != inc || !s.remove(in) {
		return
	}
	s.cfg.Logger.Warn("instance fenced by a newer activation; dropped", "instance", k.String(), "generation", in.gen)
	s.metrics.evictions.WithLabelValues(k.Namespace, "fenced").Inc()
	s.metrics.instances.WithLabelValues(k.Namespace).Dec()
	s.count(k.Namespace, false)
}

// dropIncarnation forgets the instances a dead plugin process took with it
// and remembers them for the next incarnation: their placements stay here,
// and reactivate brings them back so streams can reconnect and durable work
// resumes without waiting for a request.
func (s *Supervisor) dropIncarnation(inc *incarnation) {
	s.mu.Lock()
	var gone []*instance
	for _, in := range s.instances {
		if in.inc == inc {
			gone = append(gone, in)
		}
	}
	s.mu.Unlock()
	for _, in := range gone {
		if s.remove(in) {
			s.metrics.evictions.WithLabelValues(in.key.Namespace, "crash").Inc()
			s.metrics.instances.WithLabelValues(in.key.Namespace).Dec()
			s.count(in.key.Namespace, false)
			inc.proc.mu.Lock()
			inc.proc.orphans = append(inc.proc.orphans, orphan{in.key, in.gen})
			inc.proc.mu.Unlock()
		}
	}
}

// adoptOrphan queues an instance a hot swap evicted from the old process
// for activation in the new one, and starts that at once.
func (s *Supervisor) adoptOrphan(in *instance) {
	p := in.inc.proc
	p.mu.Lock()
	p.orphans = append(p.orphans, orphan{in.key, in.gen})
	p.mu.Unlock()
	go s.reactivate(p)
}

// orphan is an instance a crashed incarnation took down.
type orphan struct {
	key Key
	gen uint64
}

// reactivate brings back the instances the previous incarnation of p lost.
// One that fails (its placement moved, the host refuses) stays down until
// a request comes.
func (s *Supervisor) reactivate(p *pluginProc) {
	p.mu.Lock()
	orphans := p.orphans
	p.orphans = nil
	p.mu.Unlock()
	for _, o := range orphans {
		ctx, cancel := context.WithTimeout(s.runCtx, activationTimeout)
		if err := s.Wake(ctx, o.key.Namespace, o.key.ID, o.gen); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("reactivation after plugin restart failed", "instance", o.key.String(), "err", err)
		}
		cancel()
	}
}

func reasonLabel(r proto.Reason) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "REASON_"))
}

type ctxKey int

const instanceCtxKey ctxKey = 0

var (
	errInactive = errors.New("plugin no longer has the instance")
	errNotLive  = errors.New("instance not live")
)

// newProxy builds the reverse proxy to one incarnation's data socket. Every
// write is flushed through at once so streams (SSE, chunked) are live;
// Upgrade requests (WebSocket) pass through as raw connections.
func (s *Supervisor) newProxy(inc *incarnation) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport:  inc.fast,
		BufferPool: &s.bufs,
		// Copy errors are mostly clients going away mid-stream: debug, in
		// the structured log, not on stderr.
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug),
		// FlushInterval 0: ReverseProxy flushes streamed responses (SSE,
		// unknown length) on every write by itself, and leaves
		// fixed-length ones whole, one write to the client.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "plugin"
			// A peer node forwarded it (TrustedForwarding): its
			// X-Forwarded-* describe the client, and the peer's own address
			// goes on the chain; anyone else's are replaced.
			trusted := httpx.TrustedForwarding(pr.In.Context())
			if v := pr.In.Header["X-Forwarded-For"]; trusted && len(v) > 0 {
				pr.Out.Header["X-Forwarded-For"] = v // SetXForwarded appends to it
			}
			pr.SetXForwarded()
			for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v := pr.In.Header.Get(k); trusted && v != "" {
					pr.Out.Header.Set(k, v)
				}
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get(plugins.HeaderRefusal) != "" {
				return errInactive
			}
			if resp.ContentLength < 0 || resp.StatusCode == http.StatusSwitchingProtocols {
				if rs, ok := resp.Request.Context().Value(instanceCtxKey).(*reqState); ok {
					s.markStream(rs)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var in *instance
			if rs, ok := r.Context().Value(instanceCtxKey).(*reqState); ok {
				in = rs.in
			}
			switch {
			case errors.Is(err, errInactive):
				if in != nil && s.remove(in) {
					s.metrics.instances.WithLabelValues(in.key.Namespace).Dec()
				}
				httpx.WriteError(w, http.StatusServiceUnavailable, "instance restarting, retry", time.Second)
			case r.Context().Err() != nil:
				// The client went away, or the instance was evicted under
				// an open stream: nothing useful to write.
			default:
				// The front door's rule for an unanswered request: 503 +
				// Retry-After only if nothing reached the plugin (it
				// certainly did not run), else 504, it may have run.
				u := httpx.ClassifyUnanswered(err, "plugin restarting, retry")
				s.cfg.Logger.Warn("plugin did not answer", "plugin", inc.proc.spec.Name, "outcome", u.Outcome, "alive", inc.alive(), "err", err)
				u.Write(w)
			}
		},
	}
}

// Live reports whether (ns, id) is active on this node.
func (s *Supervisor) Live(ns, id string) bool {
	_, live := s.LiveGeneration(ns, id)
	return live
}

// Wake activates (ns, id) under generation without serving a request (its
// durable work resumes); the idle timer then runs as after any request.
func (s *Supervisor) Wake(ctx context.Context, ns, id string, gen uint64) error {
	in, err := s.acquire(ctx, Key{ns, id}, gen)
	if err != nil {
		return err
	}
	s.release(in)
	return nil
}

// LiveGeneration reports the generation (ns, id) runs under, if live here.
func (s *Supervisor) LiveGeneration(ns, id string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[Key{ns, id}]
	if in == nil || in.evicting {
		return 0, false
	}
	return in.gen, true
}

// ServeInstance hands r to instance (ns, id), activating it under
// generation gen if it is not live, with the request path replaced by rest
// (escaped form, e.g. "/increment").
func (s *Supervisor) ServeInstance(w http.ResponseWriter, r *http.Request, ns, id string, gen uint64, rest string) {
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	defer s.observe(ns, time.Now(), sw)
	in, err := s.acquire(r.Context(), Key{ns, id}, gen)
	if err != nil {
		s.writeAcquireError(sw, r, err)
		return
	}
	s.serve(sw, r, in, rest)
}

// ServeExisting serves r if (ns, id) is live here and reports whether it
// did; it never activates. A live instance is this node's own record of a
// placement it was granted, which its directory replica may not show yet.
func (s *Supervisor) ServeExisting(w http.ResponseWriter, r *http.Request, ns, id string, rest string) bool {
	start := time.Now()
	in, err := s.acquire(r.Context(), Key{ns, id}, 0)
	if err != nil {
		return false
	}
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	defer s.observe(ns, start, sw)
	s.serve(sw, r, in, rest)
	return true
}

func (s *Supervisor) observe(ns string, start time.Time, sw *statusWriter) {
	s.metrics.observe(ns, sw.code, time.Since(start))
}

// serve proxies r to the acquired instance and releases it.
func (s *Supervisor) serve(sw *statusWriter, r *http.Request, in *instance, rest string) {
	k := in.key
	rs := &reqState{in: in}
	defer s.releaseConn(in, rs)

	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), instanceCtxKey, rs))
	defer cancel()
	stop := context.AfterFunc(in.ctx, cancel)
	defer stop()

	out := r.Clone(ctx)
	for h := range out.Header {
		if strings.HasPrefix(h, "X-Pinned-") {
			out.Header.Del(h)
		}
	}
	for _, f := range pluginFields(in.inc, k) {
		out.Header.Set(f.name, f.value)
	}
	if p, err := url.PathUnescape(rest); err == nil && p != rest {
		out.URL.Path, out.URL.RawPath = p, rest
	} else {
		out.URL.Path, out.URL.RawPath = rest, ""
	}
	in.inc.proxy.ServeHTTP(sw, out)
}

func (s *Supervisor) writeAcquireError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrUnknownNS):
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	case errors.Is(err, ErrDegraded):
		httpx.WriteError(w, http.StatusServiceUnavailable, "namespace degraded on this node", 5*time.Second)
	case errors.Is(err, ErrPluginDown):
		httpx.WriteError(w, http.StatusServiceUnavailable, "plugin restarting, retry", time.Second)
	case errors.Is(err, ErrDraining):
		// In-band refusal: a forwarding front door releases the placement
		// and retries on another worker.
		w.Header().Set(plugins.HeaderRefusal, plugins.RefusalDraining)
		httpx.WriteError(w, http.StatusServiceUnavailable, "node is draining", time.Second)
	case errors.Is(err, ErrStopping):
		httpx.WriteError(w, http.StatusServiceUnavailable, "node is shutting down", time.Second)
	case errors.Is(err, ErrStoreUnavailable):
		// Nothing ran: the instance never activated.
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), 2*time.Second)
	case errors.Is(err, ErrActivation):
		s.cfg.Logger.Warn("activation failed", "path", r.URL.Path, "err", err)
		httpx.WriteError(w, http.StatusInternalServerError, "activation failed", 0)
	case r.Context().Err() != nil:
	default:
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
	}
}

// statusWriter records the status for metrics and passes Flush and Hijack
// through (via Unwrap) so streaming and upgrades keep working.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
