package supervisor

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/plugins"
)

// OpenMode says which instance Open may use.
type OpenMode uint8

// Open modes.
const (
	// Activate uses the instance live under the generation, activating
	// it if it is not live (and waiting for an activation under way).
	Activate OpenMode = iota
	// IfLive uses the instance if it is live here, under any generation
	// (waiting for an activation under way); it never activates. A live
	// instance is this node's own record of a placement it was granted,
	// which its directory replica may not show yet.
	IfLive
	// IfReady uses the instance only if it is live and activated under
	// exactly the generation, on a running plugin; it never waits, so a
	// caller that must not block may call it.
	IfReady
)

// RestartingMsg is the error of a 503 for a request its plugin did not
// take: the process is gone or restarting, or lost the instance.
const RestartingMsg = "instance restarting, retry"

// errNotReady: IfReady found no instance it could use at once.
var errNotReady = errors.New("instance not ready here under that generation")

// Call is one request to an instance, from Open to End, whichever
// transport carries it: the supervisor holds the instance for it (idle
// eviction waits, drains and wind-downs count it) and learns how it ended.
type Call struct {
	s     *Supervisor
	rs    reqState
	start time.Time
}

// Open is the one way a request reaches an instance: it finds k, run by
// the plugin serving (host, k.Namespace) (host "" in single mode), as mode
// allows and holds it for the request until End. The errors are the ones
// WriteOpenError answers.
func (s *Supervisor) Open(ctx context.Context, host string, k Key, gen uint64, mode OpenMode) (*Call, error) {
	c := &Call{s: s, start: time.Now()}
	switch mode {
	case IfReady:
		if !s.ready(host, k, gen, c) {
			return nil, errNotReady
		}
		return c, nil
	case IfLive:
		gen = 0
	}
	in, err := s.acquire(ctx, host, k, gen)
	if err != nil {
		return nil, err
	}
	c.rs.in = in
	return c, nil
}

// OnEvict has abort called once should the instance be evicted while the
// call is open, for a transport outside net/http, which ends its exchange
// there (net/http's is ended by the request's context). It reports false,
// registering nothing, if the instance is evicted already: the caller
// ends the call without using it.
func (c *Call) OnEvict(abort func()) bool {
	s, in := c.s, c.rs.in
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.ctx.Err() != nil {
		return false
	}
	if in.aborts == nil {
		in.aborts = map[*reqState]func(){}
	}
	in.aborts[&c.rs] = abort
	return true
}

// ready opens c on the instance live under exactly gen, activated, on a
// running plugin: one more open request counted on it. It reports false
// if there is no such instance (it never waits).
func (s *Supervisor) ready(host string, k Key, gen uint64, c *Call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[k]
	if s.stopping || in == nil || in.evicting || in.gen != gen || !closed(in.ready) || in.err != nil || !in.inc.alive() || in.ctx.Err() != nil ||
		in.inc.proc.spec.Bind.Hostname != host {
		return false
	}
	in.conns++ // see armIdleLocked
	c.rs.in = in
	return true
}

// Unanswered books the request as one its plugin did not answer (it could
// not be reached, or did not answer in full), for a caller that carried it
// itself and answered the client (the front door's kept-alive loop), as
// net/http's path books it: counted by outcome, logged. End still follows.
func (c *Call) Unanswered(err error) { c.s.unanswered(c.rs.in.inc, err) }

// Socket is the plugin's data socket (a unix socket path) the request
// goes to.
func (c *Call) Socket() string { return c.rs.in.inc.socket }

// Fields are the fields the request carries to the plugin, besides its
// own: the instance it is for and the socket's secret. Any X-Pinned-*
// field the request carried must not reach the plugin (httpx.Hop drops
// them).
func (c *Call) Fields() []httpx.Field {
	return c.rs.in.fields
}

// Stream records that the response is a stream (server-sent events, a
// body of unknown length, an upgrade): it keeps the instance resident,
// but not one winding down.
func (c *Call) Stream() { c.s.markStream(&c.rs) }

// End ends the call: status is the one the client got (0: none), and
// inactive says the plugin answered that it does not hold the instance
// (plugins.RefusalInactive), which is then dropped here.
func (c *Call) End(status int, inactive bool) {
	in := c.rs.in
	if inactive {
		c.s.drop(in, 0, "inactive")
	}
	if status != 0 {
		c.s.metrics.observe(in.key.Namespace, status, time.Since(c.start))
	}
	c.s.releaseConn(in, &c.rs)
}

// ServeHTTP carries r to the instance over net/http, with its path
// replaced by rest (escaped, with no query: r's query goes as it is), and
// ends the call. An eviction under the request ends it.
func (c *Call) ServeHTTP(w http.ResponseWriter, r *http.Request, rest string) {
	in := c.rs.in
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK, upgradeIdle: c.s.cfg.UpgradeIdle}
	// Deferred: ReverseProxy aborts a response cut short by panicking
	// (http.ErrAbortHandler), and the call must end all the same.
	defer func() { c.End(sw.status(), sw.inactive) }()
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), callCtxKey{}, c))
	defer cancel()
	stop := context.AfterFunc(in.ctx, cancel)
	defer stop()

	out := r.Clone(ctx)
	if p, err := url.PathUnescape(rest); err == nil && p != rest {
		out.URL.Path, out.URL.RawPath = p, rest
	} else {
		out.URL.Path, out.URL.RawPath = rest, ""
	}
	in.inc.proxy.ServeHTTP(sw, out)
}

type callCtxKey struct{}

// evictedUnder reports whether r is a Call's, to an instance evicted
// since (ServeHTTP ends the request's context then).
func evictedUnder(r *http.Request) bool {
	c, _ := r.Context().Value(callCtxKey{}).(*Call)
	return c != nil && c.rs.in.ctx.Err() != nil
}

// WriteOpenError answers a request for namespace ns that Open refused.
func (s *Supervisor) WriteOpenError(w http.ResponseWriter, r *http.Request, ns string, err error) {
	sw := &statusWriter{ResponseWriter: w}
	defer func(start time.Time) {
		if code := sw.status(); code != 0 {
			s.metrics.observe(ns, code, time.Since(start))
		}
	}(time.Now())
	w = sw
	switch {
	case errors.Is(err, ErrUnknownNS):
		httpx.WriteError(w, http.StatusNotFound, "unknown namespace", 0)
	case errors.Is(err, ErrDegraded):
		// In-band refusal: a forwarding front door releases the placement
		// and retries on another worker, as for a drain.
		w.Header().Set(plugins.HeaderRefusal, plugins.RefusalDegraded)
		httpx.WriteError(w, http.StatusServiceUnavailable, ErrDegraded.Error(), 5*time.Second)
	case errors.Is(err, ErrPluginDown):
		httpx.WriteError(w, http.StatusServiceUnavailable, "plugin restarting, retry", time.Second)
	case errors.Is(err, ErrDraining):
		// In-band refusal: a forwarding front door releases the placement
		// and retries on another worker.
		w.Header().Set(plugins.HeaderRefusal, plugins.RefusalDraining)
		httpx.WriteError(w, http.StatusServiceUnavailable, "node is draining", time.Second)
	case errors.Is(err, ErrStopping):
		httpx.WriteError(w, http.StatusServiceUnavailable, "node is shutting down", time.Second)
	case errors.Is(err, ErrOtherRoute):
		// The front door fences a takeover before it opens; one that
		// raced the owner's wind-down is told to retry the same way.
		httpx.WriteError(w, http.StatusServiceUnavailable, "takeover in progress, retry", time.Second)
	case errors.Is(err, ErrStoreUnavailable):
		// Nothing ran: the instance never activated.
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), 2*time.Second)
	case errors.Is(err, ErrActivation):
		s.cfg.Logger.Warn("activation failed", "path", r.URL.Path, "err", err)
		httpx.WriteError(w, http.StatusInternalServerError, "activation failed", 0)
	case r.Context().Err() != nil:
		httpx.Abandon()
	default:
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), time.Second)
	}
}

// abortOnEviction makes the end of in's context (its eviction) abort the
// calls that registered an abort: one hook per instance, not one per
// request.
func (s *Supervisor) abortOnEviction(in *instance) {
	context.AfterFunc(in.ctx, func() {
		s.mu.Lock()
		aborts := in.aborts
		in.aborts = nil
		s.mu.Unlock()
		for _, abort := range aborts {
			abort()
		}
	})
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
