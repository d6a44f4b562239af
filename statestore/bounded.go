package statestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// CallTimeout bounds every call a node makes to its state store (Bounded). It is shorter than a
// client's patience (and than the forwarding hop's wait for a response head), so a store that
// hangs turns into an error a request can answer with, instead of a request that hangs.
const CallTimeout = 5 * time.Second

// ErrUnavailable: the store could not be reached, failed, or did not answer within
// CallTimeout. Nothing is known to have changed: a Commit that failed this way may or may not
// have been applied (a timeout can fall after the server committed), so its caller must not
// acknowledge it, and may retry it only where repeating it is harmless.
var ErrUnavailable = errors.New("state store unavailable")

// Pinger is the optional cheap health check of a Store (pgstore: a round trip to the server).
// A store without one is judged by its calls alone.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Bounded wraps s so that every call has a deadline of at most timeout (CallTimeout if 0) and
// every failure of the store itself is ErrUnavailable, saying why; ErrFenced, ErrInvalid and
// ErrClosed pass as they are, and so does the caller's own cancellation. Each call's outcome is
// reported to health, if not nil, so a Monitor sees failures between its probes.
func Bounded(s Store, timeout time.Duration, health *Monitor) Store {
	if timeout <= 0 {
		timeout = CallTimeout
	}
	return &bounded{s: s, timeout: timeout, health: health}
}

type bounded struct {
	s       Store
	timeout time.Duration
	health  *Monitor
}

// call runs fn with the deadline and classifies its error.
func (b *bounded) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	err := classify(ctx, op, b.timeout, fn(cctx))
	if b.health != nil && (err == nil || errors.Is(err, ErrUnavailable)) {
		b.health.observe(err)
	}
	return err
}

// classify turns a store call's error into what callers match: the caller's own cancellation
// and the store's verdicts pass unchanged, anything else is ErrUnavailable.
func classify(ctx context.Context, op string, timeout time.Duration, err error) error {
	switch {
	case err == nil, ctx.Err() != nil,
		errors.Is(err, ErrFenced), errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed), errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s did not answer within %s: %w", ErrUnavailable, op, timeout, err)
	default:
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

func (b *bounded) Setup(ctx context.Context) error {
	return b.call(ctx, "setup", func(ctx context.Context) error { return b.s.Setup(ctx) })
}

func (b *bounded) Fence(ctx context.Context, inst InstanceKey, gen uint64) error {
	return b.call(ctx, "fence", func(ctx context.Context) error { return b.s.Fence(ctx, inst, gen) })
}

func (b *bounded) Load(ctx context.Context, inst InstanceKey, gen uint64) (trays []Tray, err error) {
	err = b.call(ctx, "load", func(ctx context.Context) error {
		trays, err = b.s.Load(ctx, inst, gen)
		return err
	})
	return trays, err
}

func (b *bounded) Commit(ctx context.Context, inst InstanceKey, gen uint64, muts []Mutation) (res CommitResult, err error) {
	err = b.call(ctx, "commit", func(ctx context.Context) error {
		res, err = b.s.Commit(ctx, inst, gen, muts)
		return err
	})
	return res, err
}

func (b *bounded) ListMarked(ctx context.Context, after InstanceKey, limit int) (keys []InstanceKey, err error) {
	err = b.call(ctx, "list marked", func(ctx context.Context) error {
		keys, err = b.s.ListMarked(ctx, after, limit)
		return err
	})
	return keys, err
}

func (b *bounded) Generation(ctx context.Context, inst InstanceKey) (gen uint64, err error) {
	err = b.call(ctx, "generation", func(ctx context.Context) error {
		gen, err = b.s.Generation(ctx, inst)
		return err
	})
	return gen, err
}

func (b *bounded) CollectFences(ctx context.Context, below uint64, live []Live) (n int, err error) {
	err = b.call(ctx, "collect fences", func(ctx context.Context) error {
		n, err = b.s.CollectFences(ctx, below, live)
		return err
	})
	return n, err
}

func (b *bounded) Close() error { return b.s.Close() }

// Ping implements Pinger with the inner store's ping (nil if it has none).
func (b *bounded) Ping(ctx context.Context) error {
	p, ok := b.s.(Pinger)
	if !ok {
		return nil
	}
	return b.call(ctx, "ping", p.Ping)
}

// MonitorConfig tunes a Monitor; zero values take the defaults.
type MonitorConfig struct {
	// Interval between probes (default 1s); each probe has this long to answer.
	Interval time.Duration
	// Grace: the store is unhealthy once its failures, with no success between them, span
	// this long (default 5s), so one slow call or a restart of the server does not flap the
	// node's readiness.
	Grace  time.Duration
	Logger *slog.Logger
	// OnChange, if set, is told each change of health (nil: healthy again).
	OnChange func(err error)
	// now is the clock (tests).
	now func() time.Time
}

// Monitor judges whether a node's state store can be reached: a cheap probe (Pinger) every
// Interval, and the outcome of every call made through Bounded. It logs one ERROR when the
// store turns unhealthy and one INFO when it recovers.
type Monitor struct {
	cfg MonitorConfig

	mu           sync.Mutex
	failingSince time.Time // zero: the last outcome was a success
	lastErr      error
	unhealthy    error // the state last reported (nil: healthy)
}

// NewMonitor builds a Monitor; Run probes.
func NewMonitor(cfg MonitorConfig) *Monitor {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	return &Monitor{cfg: cfg}
}

// Run probes p every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context, p Pinger) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
		err := p.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		m.observe(err)
	}
}

// observe records one call's or probe's outcome (nil or ErrUnavailable).
func (m *Monitor) observe(err error) {
	now := m.cfg.now()
	m.mu.Lock()
	if err == nil {
		m.failingSince, m.lastErr = time.Time{}, nil
	} else {
		if m.failingSince.IsZero() {
			m.failingSince = now
		}
		m.lastErr = err
	}
	change, state := m.updateLocked(now)
	m.mu.Unlock()
	if change {
		m.report(state)
	}
}

// updateLocked recomputes the reported state at now; change: it differs from before.
func (m *Monitor) updateLocked(now time.Time) (change bool, state error) {
	var cur error
	if !m.failingSince.IsZero() && now.Sub(m.failingSince) >= m.cfg.Grace {
		cur = m.lastErr
	}
	change = (cur == nil) != (m.unhealthy == nil)
	m.unhealthy = cur
	return change, cur
}

func (m *Monitor) report(err error) {
	if err != nil {
		m.cfg.Logger.Error("state store unavailable: this node is not ready and takes no new instances until it answers",
			"err", err, "failing_for", m.cfg.Grace)
	} else {
		m.cfg.Logger.Info("state store reachable again: this node is ready")
	}
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(err)
	}
}

// Err is nil while the store is healthy, else why it is not (wrapping ErrUnavailable).
func (m *Monitor) Err() error {
	m.mu.Lock()
	change, state := m.updateLocked(m.cfg.now())
	m.mu.Unlock()
	if change {
		m.report(state)
	}
	return state
}

// Failing is the latest failure of a call or probe, nil if the latest outcome was a success
// (whatever the grace says): the reason to give for a call that just failed.
func (m *Monitor) Failing() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}
