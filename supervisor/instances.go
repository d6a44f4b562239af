package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/plugins"
	"github.com/pinnedd/pinnedd/plugins/proto"
)

// instance is one live (namespace, id) on this node.
type instance struct {
	key         Key
	gen         uint64
	inc         *incarnation
	fields      []httpx.Field // pluginFields, for every request to it
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
	// aborts end the open calls a transport outside net/http carries
	// (Open's abort), guarded by Supervisor.mu: the eviction that cancels
	// ctx calls them, as it cancels the requests ServeHTTP carries.
	aborts map[*reqState]func()

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
func (s *Supervisor) acquire(ctx context.Context, host string, k Key, gen uint64) (*instance, error) {
	p := s.plugins().byRoute[Route{host, k.Namespace}]
	if p == nil || p.spec.Bind.Env != k.Env {
		return nil, ErrUnknownNS
	}
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return nil, ErrStopping
		}
		in := s.instances[k]
		if in != nil && !in.evicting && in.inc.proc != p && gen <= in.gen {
			// Live here under another hostname of its env: a takeover
			// moves it (under a newer generation) or nothing does.
			s.mu.Unlock()
			if gen == 0 {
				return nil, errNotLive
			}
			return nil, ErrOtherRoute
		}
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
			key: k, gen: gen, inc: inc, fields: pluginFields(inc, k), activatedAt: time.Now(), ready: make(chan struct{}),
			conns: 1, stopped: make(chan struct{}), ctx: ictx, cancel: icancel,
		}
		s.abortOnEviction(in)
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
	if rs != nil && in.aborts != nil {
		delete(in.aborts, rs)
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

// drop is removeAfter for an activated instance, counted as evicted for
// reason (pinned_evictions_total's label): the one place an instance's
// end is booked.
func (s *Supervisor) drop(in *instance, grace time.Duration, reason string) bool {
	if !s.removeAfter(in, grace) {
		return false
	}
	s.metrics.evictions.WithLabelValues(in.key.Namespace, reason).Inc()
	s.metrics.instances.WithLabelValues(in.key.Namespace).Dec()
	s.count(in.key.Namespace, false)
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
	if !s.drop(in, streamGrace, reasonLabel(reason)) {
		return
	}
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
	if in == nil || in.inc != inc || !s.drop(in, 0, "fenced") {
		return
	}
	s.cfg.Logger.Warn("instance fenced by a newer activation; dropped", "instance", k.String(), "generation", in.gen)
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
		if s.drop(in, 0, "crash") {
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
		if err := s.Wake(ctx, p.spec.Bind.Hostname, o.key, o.gen); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("reactivation after plugin restart failed", "instance", o.key.String(), "err", err)
		}
		cancel()
	}
}

func reasonLabel(r proto.Reason) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "REASON_"))
}

// newProxy builds the reverse proxy to one incarnation's data socket
// (Call.ServeHTTP's transport). Every write is flushed through at once so
// streams (SSE, chunked) are live; Upgrade requests (WebSocket) pass
// through as raw connections. What reaches the plugin is httpx.Hop's rule,
// as on every other transport.
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
			c, _ := pr.In.Context().Value(callCtxKey{}).(*Call)
			hop := httpx.Hop{
				RemoteAddr: pr.In.RemoteAddr, Host: pr.In.Host, TLS: pr.In.TLS != nil,
				Trusted: httpx.TrustedForwarding(pr.In.Context()),
			}
			if c != nil {
				hop.Set = c.Fields()
			}
			hop.Rewrite(pr.Out.Header, pr.In.Header)
		},
		ModifyResponse: func(resp *http.Response) error {
			c, _ := resp.Request.Context().Value(callCtxKey{}).(*Call)
			if plugins.ClassifyAnswer(resp.StatusCode, resp.Header.Get(plugins.HeaderRefusal)) == plugins.AnswerInactive {
				return errInactive
			}
			if c != nil && (resp.ContentLength < 0 || resp.StatusCode == http.StatusSwitchingProtocols) {
				c.Stream()
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case errors.Is(err, errInactive):
				if sw, ok := w.(*statusWriter); ok {
					sw.inactive = true
				}
				httpx.WriteError(w, http.StatusServiceUnavailable, RestartingMsg, time.Second)
			case r.Context().Err() != nil && !evictedUnder(r):
				// The client went away: nobody to answer.
				httpx.Abandon()
			default:
				// The front door's rule for an unanswered request,
				// an instance evicted under it included: 503 +
				// Retry-After only if nothing reached the plugin (it
				// certainly did not run), else 504, it may have run.
				s.unanswered(inc, err).Write(w)
			}
		},
	}
}

// unanswered books a request inc's plugin did not answer, whichever
// path carried it (net/http's proxy, or the front door's loop, which
// answered the client itself: Call.Unanswered): counted by outcome, and
// logged, one line per plugin and outcome per window with the count held
// back (a body over the front door's cap is counted, not logged). It
// returns the answer the client gets.
func (s *Supervisor) unanswered(inc *incarnation, err error) httpx.Unanswered {
	u := httpx.ClassifyUnanswered(err, RestartingMsg)
	name := inc.proc.spec.Name
	s.metrics.unanswered.WithLabelValues(name, u.Outcome).Inc()
	if u.Outcome == httpx.OutcomeTooLarge {
		return u // the client's body, not the plugin: nothing to warn of
	}
	s.warnings.Log(context.Background(), s.cfg.Logger, slog.LevelWarn, name+"\x00"+u.Outcome,
		"plugin did not answer", "plugin", name, "outcome", u.Outcome, "alive", inc.alive(), "err", err)
	return u
}

var (
	errInactive = errors.New("plugin no longer has the instance")
	errNotLive  = errors.New("instance not live")
)

// Live reports whether (ns, id) is active on this node (single mode).
func (s *Supervisor) Live(ns, id string) bool {
	_, _, live := s.LiveGeneration(Key{Namespace: ns, ID: id})
	return live
}

// Wake activates k under generation, run by the plugin serving (host,
// k.Namespace), without serving a request (its durable work resumes); the
// idle timer then runs as after any request.
func (s *Supervisor) Wake(ctx context.Context, host string, k Key, gen uint64) error {
	in, err := s.acquire(ctx, host, k, gen)
	if err != nil {
		return err
	}
	s.release(in)
	return nil
}

// LiveGeneration reports the generation k runs under, if live here, and
// the hostname of the plugin running it ("" in single mode).
func (s *Supervisor) LiveGeneration(k Key) (gen uint64, host string, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[k]
	if in == nil || in.evicting {
		return 0, "", false
	}
	return in.gen, in.inc.proc.spec.Bind.Hostname, true
}

// statusWriter records the status for metrics and passes Flush and Hijack
// through (via Unwrap) so streaming and upgrades keep working.
type statusWriter struct {
	http.ResponseWriter
	code     int
	wrote    bool
	inactive bool // the plugin answered it does not hold the instance
	// upgradeIdle bounds an upgraded connection (Hijack); 0: no bound.
	upgradeIdle time.Duration
}

// status is the status the client got (0: none was written).
func (w *statusWriter) status() int {
	if !w.wrote {
		return 0
	}
	return w.code
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

// Hijack hands ReverseProxy the client's connection for an upgrade (101),
// bounded as a kept-alive connection is: closed once it moved nothing
// either way for upgradeIdle.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	return httpx.IdleConn(conn, w.upgradeIdle), brw, nil
}
